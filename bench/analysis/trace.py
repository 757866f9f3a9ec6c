"""A Kineto trace loaded and classified: the events of each rank, which kind each is
(computation, communication, memory), which profiler step launched it, and each step's window.

The definitions are those of ``breakdown.py``'s docstring (and docs/analysis.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench.analysis import interval_sets as iv
from bench.analysis.reader import ISSUE_NAME, TraceError, read_trace

__all__ = ["TraceError"]

# traceinsight 0.6.1's kernel groups (hta/common/types.py), applied with re.match.
COMM_KERNEL = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
MEMORY_KERNEL = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
NOT_COMPUTE_KERNEL = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)"
    r"|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)"
    r"|(^collective_subgraph_execution)"
)
# The collective library's own ops on the main thread (c10d's dispatcher namespaces, functional
# collectives included, and the comms record): calls into communication, never computation.
# Time the thread spends blocked elsewhere is found from what the threads do
# (``breakdown.blocking_waits``), not from names.
COMM_CPU_OP = re.compile(rf"{ISSUE_NAME.pattern}|^(?:record_param_comms$|nccl:|gloo:)")
GLOO_SPAN = re.compile(r"^gloo:")
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
        hit = np.array(
            [bool((pattern.search if search else pattern.match)(c)) for c in cats] + [False]
        )
        return hit[names.cat.codes.to_numpy()]  # code -1 (missing) picks the final False
    fn = names.astype(str).str.contains if search else names.astype(str).str.match
    return fn(pattern).to_numpy()


def host_steps(events: pd.DataFrame) -> np.ndarray:
    """Which events are the host's ``ProfilerStep#N`` spans: not the device-side copies that
    recent Kineto writes (``gpu_user_annotation``, first to last kernel of the step, no
    stream)."""
    host = ((events["stream"] < 0) & (events["cat"] != "gpu_user_annotation")).to_numpy()
    return name_matches(events["name"], STEP) & host


def step_windows(events: pd.DataFrame) -> pd.DataFrame:
    """One row per CPU-side ``ProfilerStep#N``: step, start, end (microseconds)."""
    steps = events[host_steps(events)]
    out = pd.DataFrame(
        {
            "step": steps["name"].astype(str).str.extract(STEP, expand=False).astype(int),
            "start": steps["ts"],
            "end": steps["ts"] + steps["dur"],
        }
    )
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
    """Add ``kind``: compute, comm, memory, other (device events), comm_cpu (a call into the
    collective library on the main thread) or none (not counted)."""
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
        comm_cpu = name_matches(ev["name"], COMM_CPU_OP)
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


def launch_times(ev: pd.DataFrame) -> pd.Series:
    """When each event was launched: CPU events at their start, device events at the start of
    the CPU event with the same correlation id (NaN where there is none)."""
    launch_ts = ev["ts"].astype(float)
    device = ev["stream"] >= 0
    if device.any():
        cpu = ev[~device & (ev["correlation"] >= 0)].drop_duplicates("correlation")
        by_corr = cpu.set_index("correlation")["ts"]
        launch_ts[device] = ev.loc[device, "correlation"].map(by_corr).to_numpy()
    return launch_ts


def launch_step(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.Series:
    """Step of each event: CPU events by their start, device events by their launch (the CPU
    event with the same correlation id); -1 outside every step."""
    ts = launch_times(ev).to_numpy(dtype=float)
    starts, ends = windows["start"].to_numpy(), windows["end"].to_numpy()
    idx = np.searchsorted(starts, ts, side="right") - 1  # the last window starting at or before
    inside = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)]) if len(starts) else idx >= 0
    step = np.where(
        inside, windows["step"].to_numpy()[np.clip(idx, 0, None)] if len(starts) else -1, -1
    )
    return pd.Series(step, index=ev.index)


def device_windows(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """GPU traces: each step's window on the device's time line (step, start, end), the
    windows following each other without gap or overlap.

    Step N's device window begins where its device work can begin: once the host has begun
    ``ProfilerStep#N`` and the device has finished the work launched before it, or at N's
    first device event if that runs earlier (another stream); it ends where step N+1's
    begins, the last one at the later of its ``ProfilerStep``'s end and its last device
    event. Every moment between the first step's start and the last step's end so belongs to
    exactly one step, the device's idle time between steps included (waiting for data, for a
    host-side sync, for the optimiser's launches), and the steps' figures add up to the
    figures of the whole span."""
    ev = ev if "step" in ev else ev.assign(step=launch_step(ev, windows))
    dev = ev[ev["stream"] >= 0]
    steps = windows["step"].to_numpy()
    cpu_start = windows["start"].to_numpy(dtype=float)
    cpu_end = windows["end"].to_numpy(dtype=float)
    begin = dev["ts"].to_numpy(dtype=float)
    finish = begin + dev["dur"].to_numpy(dtype=float)
    first = dev.groupby("step")["ts"].min().reindex(steps).to_numpy(dtype=float)
    last = pd.Series(finish, index=dev.index).groupby(dev["step"]).max()
    last = last.reindex(steps).to_numpy(dtype=float)
    first, last = np.nan_to_num(first, nan=np.inf), np.nan_to_num(last, nan=-np.inf)
    launched = launch_times(ev)[dev.index].to_numpy(dtype=float)
    known = ~np.isnan(launched)
    order = np.argsort(launched[known], kind="stable")
    by_launch, ends = launched[known][order], finish[known][order]
    # the latest end of the device work launched before each step began (-inf: none was)
    ends_before = np.maximum.accumulate(np.concatenate([[-np.inf], ends]))
    before = ends_before[np.searchsorted(by_launch, cpu_start, side="left")]
    start = np.maximum.accumulate(np.minimum(first, np.maximum(cpu_start, before)))
    end = np.append(start[1:], max(cpu_end[-1], last[-1], start[-1])) if len(start) else start
    return pd.DataFrame({"step": steps, "start": start, "end": end})


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


def common_steps(traces: list[Trace]) -> list[int]:
    """The profiler steps every rank's trace holds, in order."""
    per_rank = [set(step_windows(prepared(t))["step"]) for t in traces]
    return sorted(set.intersection(*per_rank)) if per_rank else []


def nesting_depth(ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Depth of each span of one thread (or stream) among the spans before it that still hold
    it open, the spans sorted by start, the longer first: 0 for the outermost. A thread's
    record_function ranges open and close as a stack."""
    depth = np.zeros(len(ts), dtype=int)
    stack: list[float] = []  # ends of the open spans
    for i, (s, e) in enumerate(zip(ts, end, strict=True)):
        while stack and stack[-1] <= s:
            stack.pop()
        depth[i] = len(stack)
        stack.append(e)
    return depth
