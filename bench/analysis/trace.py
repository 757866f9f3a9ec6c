"""A Kineto trace loaded and classified: the events of each rank, which kind each is
(computation, communication, memory), and which profiler step it belongs to.

The definitions are those of ``breakdown.py``'s docstring (DESIGN.md section 4).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench.analysis import intervals as iv
from bench.analysis.reader import TraceError, read_trace

__all__ = ["TraceError"]

# traceinsight 0.6.1's kernel groups (hta/common/types.py), applied with re.match.
COMM_KERNEL = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
MEMORY_KERNEL = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
NOT_COMPUTE_KERNEL = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)"
    r"|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)"
    r"|(^collective_subgraph_execution)"
)
# Main-thread CPU ops that issue or wait for communication rather than compute.
COMM_CPU_OP = re.compile(r"^(?:c10d::|record_param_comms|nccl:|gloo:)|wait", re.IGNORECASE)
GLOO_SPAN = re.compile(r"^gloo:")
# FSDP's spans that block on a collective on CPU (FSDP2's all-gather and reduce, FSDP1's
# pre-forward, pre-backward and post-backward hooks: with gloo they return when the collective
# is done, and no op inside says "wait"): their time outside the ops they contain is waiting.
BLOCKING_SPAN = re.compile(
    r"^FSDP::(?:all_gather|post_backward_reduce) "
    r"|^FullyShardedDataParallel\._(?:pre_forward|pre_backward_hook|pre_backward_prefetch"
    r"|post_backward_hook)$"
)
WORK_OP = re.compile(r"^(?:aten|fsdp)::")
STEP = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class Trace:
    path: Path
    meta: dict
    events: pd.DataFrame  # complete events, trace_reader's columns
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)  # ts, total_allocated, bytes
    _prepared: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def dist_info(self) -> dict:
        return self.meta.get("distributedInfo") or {}

    @property
    def rank(self) -> int:
        return int(self.dist_info.get("rank", 0))

    @property
    def world_size(self) -> int:
        return int(self.dist_info.get("world_size", 1))

    @property
    def backend(self) -> str | None:
        return self.dist_info.get("backend")

    @property
    def is_gpu(self) -> bool:
        return bool((self.events["stream"] >= 0).any())


def load_trace(path: str | Path) -> Trace:
    meta, events, memory = read_trace(path)
    return Trace(path=Path(path), meta=meta, events=events, memory=memory)


# -- step windows and classification ---------------------------------------------------------
def name_matches(names: pd.Series, pattern: re.Pattern, *, search: bool = False) -> np.ndarray:
    """Boolean per row: does the event name match? Tested once per distinct name (the reader
    stores names as categories), not once per event."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        cats = names.cat.categories
        hit = np.array([bool((pattern.search if search else pattern.match)(c)) for c in cats]
                       + [False])  # fmt: skip
        return hit[names.cat.codes.to_numpy()]  # code -1 (missing) picks the final False
    fn = names.astype(str).str.contains if search else names.astype(str).str.match
    return fn(pattern).to_numpy()


def step_windows(events: pd.DataFrame) -> pd.DataFrame:
    """One row per CPU-side ``ProfilerStep#N``: step, start, end (microseconds)."""
    steps = events[name_matches(events["name"], STEP) & (events["stream"] < 0).to_numpy()]
    out = pd.DataFrame({
        "step": steps["name"].astype(str).str.extract(STEP, expand=False).astype(int),
        "start": steps["ts"],
        "end": steps["ts"] + steps["dur"],
    })  # fmt: skip
    return out.drop_duplicates("step").sort_values("step").reset_index(drop=True)


def _kernel_kind(name: str) -> str:
    if COMM_KERNEL.match(name):
        return "comm"
    if MEMORY_KERNEL.match(name):
        return "memory"
    if not NOT_COMPUTE_KERNEL.match(name):
        return "compute"
    return "other"


def classify(events: pd.DataFrame, *, gpu: bool) -> pd.DataFrame:
    """Add ``kind``: compute, comm, memory, other (device events), comm_cpu (CPU issuing or
    waiting) or none (not counted)."""
    ev = events.copy()
    kind = np.full(len(ev), "none", dtype=object)
    if gpu:
        device = (ev["stream"] >= 0).to_numpy()
        # Classify each distinct name once: traces repeat a few hundred names many times.
        names = ev["name"][device].astype(str)
        lookup = {n: _kernel_kind(n) for n in pd.unique(names)}
        kind[device] = names.map(lookup).to_numpy()
    else:
        on_main = (ev["tid"] == _main_thread(ev)).to_numpy()
        ops = ev["cat"].isin(["cpu_op", "user_annotation"]).to_numpy()
        step = name_matches(ev["name"], STEP)
        comm_cpu = name_matches(ev["name"], COMM_CPU_OP, search=True)
        kind[on_main & ops & ~step] = "compute"
        kind[on_main & ops & comm_cpu] = "comm_cpu"
        kind[name_matches(ev["name"], GLOO_SPAN)] = "comm"
    ev["kind"] = kind
    return ev


def _main_thread(events: pd.DataFrame):
    steps = events[name_matches(events["name"], STEP)]
    if len(steps):
        return steps["tid"].iloc[0]
    ops = events[events["cat"] == "cpu_op"]
    return ops["tid"].mode().iloc[0] if len(ops) else None


def intervals_of(ev: pd.DataFrame, mask) -> np.ndarray:
    """The [start, end] intervals of the events that ``mask`` selects."""
    sub = ev[mask]
    return iv.as_intervals(sub["ts"], sub["ts"] + sub["dur"])


def launch_step(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.Series:
    """Step of each event: CPU events by their start, device events by their launch (the CPU
    event with the same correlation id); -1 outside every step."""
    launch_ts = ev["ts"].copy()
    device = ev["stream"] >= 0
    if device.any():
        cpu = ev[~device & (ev["correlation"] >= 0)].drop_duplicates("correlation")
        by_corr = cpu.set_index("correlation")["ts"]
        launch_ts[device] = ev.loc[device, "correlation"].map(by_corr).to_numpy()
    ts = launch_ts.to_numpy(dtype=float)
    starts, ends = windows["start"].to_numpy(), windows["end"].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1  # the last window starting at or before
    inside = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)]) if len(starts) else idx >= 0
    step = np.where(
        inside, windows["step"].to_numpy()[np.clip(idx, 0, None)] if len(starts) else -1, -1
    )
    return pd.Series(step, index=ev.index)


def comm_bytes_from_launch(ev: pd.DataFrame) -> pd.Series:
    """``nbytes`` with each communication kernel given the bytes of the ``record_param_comms``
    span enclosing the CPU call that launched it (same correlation id): NCCL kernels carry no
    size of their own."""
    out = ev["nbytes"].copy()
    kernels = ev["kind"] == "comm"
    rpc = ev[(ev["name"] == "record_param_comms") & ev["nbytes"].notna()].sort_values("ts")
    if rpc.empty or not kernels.any():
        return out
    launches = ev[(ev["stream"] < 0) & (ev["correlation"] >= 0)].drop_duplicates("correlation")
    launch_ts = ev.loc[kernels, "correlation"].map(launches.set_index("correlation")["ts"])
    launch_ts = launch_ts.to_numpy(dtype=float)
    starts, ends = rpc["ts"].to_numpy(), (rpc["ts"] + rpc["dur"]).to_numpy()
    idx = np.searchsorted(starts, launch_ts, side="right") - 1
    ok = (idx >= 0) & ~np.isnan(launch_ts)
    ok[ok] &= launch_ts[ok] <= ends[idx[ok]]
    found = np.full(len(launch_ts), np.nan)
    found[ok] = rpc["nbytes"].to_numpy()[idx[ok]]
    out[kernels] = found
    return out


# -- per-step temporal breakdown -------------------------------------------------------------
def prepared(trace: Trace) -> pd.DataFrame:
    """The trace's events classified (``kind``), assigned to steps (``step``) and, on GPU
    traces, with communication kernels given their bytes; computed once per trace."""
    if trace._prepared is None:
        gpu = trace.is_gpu
        ev = classify(trace.events, gpu=gpu)
        ev["step"] = launch_step(ev, step_windows(ev))
        if gpu:
            ev["nbytes"] = comm_bytes_from_launch(ev)
        trace._prepared = ev
    return trace._prepared


