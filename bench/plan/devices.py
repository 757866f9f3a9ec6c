"""The devices a plan can target: memory per device, memory bandwidth, and the name the
datasheet peaks (``bench.runfolder.peaks``) are matched by.

Capacities and bandwidths are the vendors' datasheet figures (SXM parts); the memory a job can
use is less (the CUDA context, NCCL's buffers, fragmentation): the planner's ``--allowance``.
``cpu`` is this machine: its memory is what the host has, its peak is measured here (this
host's roofline profile, ``bench.runner.measure.flops.device_peak``) and its bandwidth an assumption
(the optimiser step on a CPU is rarely the step's length).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    memory_gib: float  # per device
    bandwidth_GBps: float  # memory bandwidth, GB = 1e9 bytes
    gpu_name: str  # what torch.cuda.get_device_name() would say ("" for this host's CPU)
    source: str


def _host_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("h100", 80.0, 3350.0, "NVIDIA H100 80GB HBM3", "H100 SXM5 datasheet"),
        Device("h200", 141.0, 4800.0, "NVIDIA H200", "H200 SXM datasheet"),
        Device("a100", 80.0, 2039.0, "NVIDIA A100-SXM4-80GB", "A100 80GB SXM datasheet"),
        Device("a100_40g", 40.0, 1555.0, "NVIDIA A100-SXM4-40GB", "A100 40GB SXM datasheet"),
        Device("b200", 180.0, 8000.0, "NVIDIA B200", "HGX B200 specifications, per GPU"),
        Device("cpu", _host_gib(), 20.0, "", "this host: its memory; 20 GB/s assumed"),
    )
}


def device(name: str) -> Device:
    key = name.strip().lower()
    if key not in DEVICES:
        raise ValueError(f"unknown device {name!r} (known: {', '.join(DEVICES)})")
    return DEVICES[key]
