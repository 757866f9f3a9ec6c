"""Stated profiles of the datasheet GPUs, until a measured one replaces them.

A datasheet gives a GPU's ceilings, not what ops reach under them. So a stated profile is the
datasheet's dense peaks (``bench.runfolder.peaks.DATASHEETS``) and memory bandwidth (``MEMORY``
below), with efficiency curves and a launch cost that are *assumptions*: typical of eager
PyTorch on a recent data-centre GPU (a kernel's few microseconds at the least, large matmuls
at about three quarters of the Tensor Core peak, large elementwise ops near the bandwidth), the
same for every GPU. ``python -m bench.roofline`` on the GPU (``make gpu-check``) measures the
real ones; its file replaces the stated profile wherever a command takes ``--device-profile``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bench.roofline.profile import Curve, Roofline
from bench.runfolder.peaks import DATASHEETS, GpuPeaks


@dataclass(frozen=True)
class GpuMemory:
    gpu: str  # as the datasheet names it
    pattern: str  # a regular expression matched against torch.cuda.get_device_name()
    GBps: float  # memory bandwidth, GB = 1e9 bytes
    source: str  # the datasheet

    def matches(self, device_name: str) -> bool:
        return re.search(self.pattern, device_name, re.IGNORECASE) is not None


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
_V100 = "NVIDIA V100 Tensor Core GPU datasheet"
_HGX = "NVIDIA HGX platform specifications (8-GPU total / 8)"

# First match wins, as in peaks.DATASHEETS; the memory tells apart what the peaks do not (the
# A100's 40 and 80 GB, SXM and PCIe). torch names them "NVIDIA A100-SXM4-80GB", "NVIDIA A100
# 80GB PCIe", "NVIDIA A100-PCIE-40GB".
MEMORY: tuple[GpuMemory, ...] = (
    GpuMemory("GB200", r"GB200", 8000.0, "NVIDIA GB200 NVL72 specifications, per GPU"),
    GpuMemory("B200", r"(?<!G)B200", 8000.0, _HGX),
    GpuMemory("B300", r"(?<!G)B300", 8000.0, _HGX),
    GpuMemory("H100 PCIe", r"H100.*PCIe", 2000.0, _H100),
    GpuMemory("H100 NVL", r"H100.*NVL", 3900.0, _H100),
    GpuMemory("H100 SXM5", r"H100(?!.*(PCIe|NVL))", 3350.0, _H100),
    # The 96 GB HBM3 part; the 144 GB HBM3e part's 4.9 TB/s is not told apart by its name.
    GpuMemory("GH200", r"GH200", 4000.0, "NVIDIA GH200 Grace Hopper Superchip datasheet"),
    GpuMemory("H200 NVL", r"(?<!G)H200.*NVL", 4800.0, _H200),
    GpuMemory("H200 SXM", r"(?<!G)H200(?!.*NVL)", 4800.0, _H200),
    GpuMemory("A100 80GB PCIe", r"A100(?!\d).*(80GB.*PCIe|PCIe.*80GB)", 1935.0, _A100),
    GpuMemory("A100 80GB SXM", r"A100(?!\d).*80GB", 2039.0, _A100),
    GpuMemory("A100 40GB", r"A100(?!\d)", 1555.0, _A100),
    GpuMemory("V100S PCIe", r"V100S", 1134.0, _V100),
    GpuMemory("V100 PCIe", r"V100-PCIE", 900.0, _V100),
    GpuMemory("V100 SXM2", r"V100-SXM2", 900.0, _V100),
    GpuMemory("L40S", r"L40S", 864.0, "NVIDIA L40S GPU datasheet"),
    GpuMemory("L40", r"\bL40\b", 864.0, "NVIDIA L40 GPU datasheet"),
    GpuMemory("L4", r"\bL4\b", 300.0, "NVIDIA L4 Tensor Core GPU datasheet"),
    GpuMemory("A10", r"\bA10\b", 600.0, "NVIDIA A10 Tensor Core GPU datasheet"),
    GpuMemory("A10G", r"\bA10G\b", 600.0, "AWS EC2 G5 instance specifications"),
    GpuMemory("T4", r"\bT4\b", 320.0, "NVIDIA T4 Tensor Core GPU datasheet"),
)

# The assumptions (module docstring): efficiency against a matmul's FLOPs, of the datasheet's
# dense peak; against an elementwise op's bytes moved, of the datasheet's bandwidth; a launch
# as eager PyTorch pays it (host dispatch and the kernel's launch).
STATED_MATMUL = Curve(
    sizes=(1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12),
    efficiency=(0.0004, 0.004, 0.04, 0.15, 0.4, 0.7, 0.75),
)
STATED_MEMORY = Curve(
    sizes=(1e4, 1e5, 1e6, 1e7, 1e8, 1e9),
    efficiency=(0.0015, 0.015, 0.12, 0.5, 0.8, 0.9),
)
STATED_LAUNCH_US = 5.0


def _first(table, device_name: str):
    return next((row for row in table if row.matches(device_name)), None)


def datasheet_profile(device_name: str) -> Roofline | None:
    """The stated profile of the GPU ``device_name`` names (as torch.cuda.get_device_name()
    says it), or None where the tables have no such GPU."""
    peaks: GpuPeaks | None = _first(DATASHEETS, device_name)
    memory: GpuMemory | None = _first(MEMORY, device_name)
    if peaks is None or memory is None:
        return None
    return Roofline(
        device=device_name,
        source=(
            f"stated: {peaks.gpu} dense peaks ({peaks.source}), {memory.gpu} bandwidth "
            f"({memory.source}); efficiencies and launch assumed (docs/roofline.md)"
        ),
        peak_tflops=dict(peaks.tflops),
        memory_GBps=memory.GBps,
        matmul=dict.fromkeys(peaks.tflops, STATED_MATMUL),
        memory=STATED_MEMORY,
        launch_us=STATED_LAUNCH_US,
    )
