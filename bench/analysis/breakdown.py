"""Kineto traces -> DataFrames: where the time of a training step went.

Definitions follow ``DESIGN.md`` section 4 and HolisticTraceAnalysis (traceinsight 0.6.1), so
that the GPU figures can be checked against it:

GPU traces
    Device events are the events with a stream (kernels, memcpy, memset). They are
    communication (``^nccl``, ``^hccl``, ``^hip``, ``ncclKernel``), memory (``Memcpy``,
    ``Memset``, ``dma``) or computation (the rest, except synchronisation and launch
    records, which are "other"). A kernel belongs to the ``ProfilerStep#N`` whose CPU side
    launched it (same ``correlation`` id), however late it ran.
CPU traces (gloo)
    gloo runs each collective on a worker thread (``gloo:all_reduce`` ...); communication is the
    union of those spans. The main thread (the one carrying ``ProfilerStep#N``) computes;
    computation is the union of its ops minus the time it spends issuing or waiting for
    collectives (``c10d::*``, ``record_param_comms``, anything named ``*wait*``).

Per rank and step window: compute = |C|, comm = |M|, overlap = |C & M|, exposed communication =
|M - C|, idle = window - |all device work| (CPU: |C | M|), non-compute = window - compute - idle,
overlap % = overlap / comm, utilisation = |all work| / window. On GPU traces this is the GPU
utilisation; on CPU traces the same ratio is reported as ``cpu_busy_pct`` (main thread computing
or a collective in flight), never as GPU utilisation.

Every analysis is a function from DataFrames to DataFrames with stable columns; the command line
(``python -m bench.analysis TRACE_DIR``) and the reports are separate layers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analysis import intervals as iv
from bench.analysis.trace import (
    BLOCKING_SPAN,
    STEP,
    WORK_OP,
    Trace,
    TraceError,
    classify,
    intervals_of,
    load_trace,
    name_matches,
    prepared,
    step_windows,
)

__all__ = ["STEP", "Trace", "TraceError", "load_trace", "prepared"]

BREAKDOWN_COLUMNS = [
    "rank", "step", "window_us", "compute_us", "comm_us", "memory_us", "overlap_us",
    "exposed_comm_us", "idle_us", "non_compute_us", "overlap_pct", "compute_comm_ratio",
    "gpu_util_pct", "cpu_busy_pct", "comm_calls", "comm_bytes",
]  # fmt: skip
RANK_COLUMNS = [
    "rank", "device", "kernel_time_us", "idle_pct", "compute_pct", "non_compute_pct",
    "comm_comp_overlap_pct", "gpu_util_pct", "cpu_busy_pct", "steps", "file",
]  # fmt: skip



def _per_group_length(starts, ends, groups, n_groups: int, span: float) -> np.ndarray:
    """|union| of the intervals of each group, for all groups at once: each group is moved to
    its own stretch of a virtual time line (group g starts at g * span), so one union over
    everything never merges intervals of different groups."""
    if len(starts) == 0:
        return np.zeros(n_groups)
    offset = groups * span
    u = iv.union(np.column_stack([starts + offset, ends + offset]))
    return np.bincount(
        (u[:, 0] // span).astype(int), weights=u[:, 1] - u[:, 0], minlength=n_groups
    )[:n_groups]


def _per_group_overlap(a, b, n_groups: int, span: float) -> np.ndarray:
    """|union(a) & union(b)| per group; a and b are (starts, ends, groups)."""
    if len(a[0]) == 0 or len(b[0]) == 0:
        return np.zeros(n_groups)
    ua = np.column_stack([a[0] + a[2] * span, a[1] + a[2] * span])
    ub = np.column_stack([b[0] + b[2] * span, b[1] + b[2] * span])
    x = iv.intersect(ua, ub)
    if len(x) == 0:
        return np.zeros(n_groups)
    return np.bincount(
        (x[:, 0] // span).astype(int), weights=x[:, 1] - x[:, 0], minlength=n_groups
    )[:n_groups]


def breakdown(trace: Trace) -> pd.DataFrame:
    """Per-step temporal breakdown and overlap of one rank's trace (BREAKDOWN_COLUMNS).

    Linear in the trace, whatever the number of steps: on CPU traces the unions of each kind are
    built once and cut into step windows by binary search; on GPU traces every step's device
    events are measured at once on a virtual time line that keeps steps apart.
    """
    gpu = trace.is_gpu
    ev = prepared(trace)
    windows = step_windows(ev)
    comm_ev = ev[ev["kind"] == "comm"]
    calls = comm_ev.groupby("step").size()
    payload = comm_ev.groupby("step")["nbytes"].sum(min_count=1)
    table = _gpu_step_table(ev, windows) if gpu else _cpu_step_table(ev, windows)
    if table.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    window, busy = table["window_us"], table["busy_us"]
    compute, comm, overlap = table["compute_us"], table["comm_us"], table["overlap_us"]
    util = (100.0 * busy / window).where(window > 0)
    out = pd.DataFrame({
        "rank": trace.rank, "step": table["step"], "window_us": window, "compute_us": compute,
        "comm_us": comm, "memory_us": table["memory_us"], "overlap_us": overlap,
        "exposed_comm_us": comm - overlap, "idle_us": window - busy,
        "non_compute_us": busy - compute,
        "overlap_pct": (100.0 * overlap / comm).where(comm > 0),
        "compute_comm_ratio": (compute / comm).where(comm > 0),
        "gpu_util_pct": util if gpu else np.nan,
        "cpu_busy_pct": np.nan if gpu else util,
        "comm_calls": table["step"].map(calls).fillna(0).astype(int),
        "comm_bytes": table["step"].map(payload),
    })  # fmt: skip
    return out[BREAKDOWN_COLUMNS].reset_index(drop=True)


def _gpu_step_table(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """Per step: the device's own window (first to last event the step launched) and the
    union lengths of each kind within it."""
    dev = ev[(ev["stream"] >= 0) & ev["step"].isin(windows["step"])]
    if dev.empty:
        return pd.DataFrame()
    steps = np.sort(dev["step"].unique())
    group = np.searchsorted(steps, dev["step"].to_numpy())
    start = dev["ts"].to_numpy(dtype=float)
    end = start + dev["dur"].to_numpy(dtype=float)
    base = start.min()
    start, end = start - base, end - base
    span = float(end.max()) + 1.0
    n = len(steps)
    kind = dev["kind"].to_numpy()
    sel = {k: kind == k for k in ("compute", "comm", "memory", "other")}
    parts = {k: (start[m], end[m], group[m]) for k, m in sel.items()}
    lo = np.full(n, np.inf)
    hi = np.full(n, -np.inf)
    np.minimum.at(lo, group, start)
    np.maximum.at(hi, group, end)
    return pd.DataFrame({
        "step": steps,
        "window_us": hi - lo,
        "busy_us": _per_group_length(start, end, group, n, span),
        "compute_us": _per_group_length(*parts["compute"], n, span),
        "comm_us": _per_group_length(*parts["comm"], n, span),
        "memory_us": _per_group_length(*parts["memory"], n, span),
        "overlap_us": _per_group_overlap(parts["compute"], parts["comm"], n, span),
    })  # fmt: skip


def blocking_waits(ev: pd.DataFrame) -> np.ndarray:
    """CPU traces: the main thread's time inside ``BLOCKING_SPAN`` spans not covered by the
    ops they contain (``aten::``, ``fsdp::``): waiting for a collective."""
    main = (ev["kind"] == "compute").to_numpy()
    spans = main & name_matches(ev["name"], BLOCKING_SPAN)
    if not spans.any():
        return iv.EMPTY.copy()
    work = main & (ev["cat"] == "cpu_op").to_numpy() & name_matches(ev["name"], WORK_OP)
    return iv.subtract(iv.union(intervals_of(ev, spans)), iv.union(intervals_of(ev, work)))


def cpu_compute(ev: pd.DataFrame) -> np.ndarray:
    """CPU traces: the main thread's computation, the union of its ops less the time it spends
    issuing or waiting for collectives (named ``c10d::``, ``*wait*`` ..., or inside FSDP's
    blocking spans)."""
    busy = iv.union(intervals_of(ev, ev["kind"] == "compute"))
    waiting = np.vstack([iv.union(intervals_of(ev, ev["kind"] == "comm_cpu")), blocking_waits(ev)])
    return iv.subtract(busy, waiting)


def _cpu_step_table(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    comm_all = iv.union(intervals_of(ev, ev["kind"] == "comm"))
    compute_all = cpu_compute(ev)
    rows = []
    for w in windows.itertuples():
        c = iv.window(compute_all, w.start, w.end)
        m = iv.window(comm_all, w.start, w.end)
        rows.append({
            "step": w.step, "window_us": w.end - w.start,
            "busy_us": iv.length(np.vstack([c, m])), "compute_us": iv.length(c),
            "comm_us": iv.length(m), "memory_us": 0.0,
            "overlap_us": iv.length(iv.intersect(c, m)),
        })  # fmt: skip
    return pd.DataFrame(rows)


# -- whole-trace figures, as HolisticTraceAnalysis computes them -----------------------------
def hta_filter(events: pd.DataFrame) -> pd.DataFrame:
    """HTA's default trace filter: drop what the last (incomplete) ProfilerStep and anything
    after it launched. CPU events are kept when they start before the last ProfilerStep;
    device events when their launch (same correlation id) is kept. Applied only when the trace
    holds two or more distinct steps."""
    is_step = pd.Series(name_matches(events["name"], STEP), index=events.index)
    if events.loc[is_step, "name"].nunique() < 2:
        return events
    cpu = events["stream"] < 0
    cutoff = events.loc[is_step & cpu, "ts"].max()
    keep_cpu = cpu & (events["ts"] < cutoff)
    kept_corr = set(events.loc[keep_cpu & (events["correlation"] >= 0), "correlation"])
    keep_dev = ~cpu & events["correlation"].isin(kept_corr)
    return events[keep_cpu | keep_dev]


def _hta_round(events: pd.DataFrame) -> pd.DataFrame:
    """HTA rounds fractional microsecond timestamps inwards: end = floor(ts + dur),
    ts = ceil(ts)."""
    ev = events.copy()
    end = np.floor(ev["ts"].to_numpy() + ev["dur"].to_numpy())
    ev["ts"] = np.ceil(ev["ts"].to_numpy())
    ev["dur"] = end - ev["ts"].to_numpy()
    return ev


def rank_summary(trace: Trace, steps: pd.DataFrame | None = None) -> dict:
    """Whole-trace temporal breakdown and overlap of one rank (RANK_COLUMNS), computed as
    HolisticTraceAnalysis's ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` do on GPU
    traces; on CPU traces the same definitions summed over the traced steps (``steps``, the
    trace's ``breakdown``, when the caller has it already)."""
    gpu = trace.is_gpu
    base = {"rank": trace.rank, "device": "gpu" if gpu else "cpu", "file": trace.path.name}
    if not gpu:
        steps = breakdown(trace) if steps is None else steps
        window = steps["window_us"].sum()
        if steps.empty or window <= 0:
            return {**base, "steps": 0}
        s = steps.sum(numeric_only=True)
        return {
            **base, "kernel_time_us": window, "steps": len(steps),
            "idle_pct": 100 * s["idle_us"] / window, "compute_pct": 100 * s["compute_us"] / window,
            "non_compute_pct": 100 * s["non_compute_us"] / window,
            "comm_comp_overlap_pct": 100 * s["overlap_us"] / s["comm_us"] if s["comm_us"] > 0
            else np.nan,
            "gpu_util_pct": np.nan, "cpu_busy_pct": 100 * (window - s["idle_us"]) / window,
        }  # fmt: skip
    ev = classify(_hta_round(hta_filter(trace.events)), gpu=True)
    dev = ev[ev["stream"] >= 0]
    if dev.empty:
        return {**base, "steps": 0}
    everything = iv.union(intervals_of(dev, slice(None)))
    window = everything[-1, 1] - everything[0, 0]
    busy = iv.length(everything)
    compute = iv.union(intervals_of(dev, dev["kind"] == "compute"))
    comm = iv.union(intervals_of(dev, dev["kind"] == "comm"))
    comm_len = iv.length(comm)
    idle = window - busy
    return {
        **base, "kernel_time_us": window, "steps": len(step_windows(trace.events)),
        "idle_pct": 100 * idle / window, "compute_pct": 100 * iv.length(compute) / window,
        "non_compute_pct": 100 * (window - iv.length(compute) - idle) / window,
        "comm_comp_overlap_pct": 100 * iv.length(iv.intersect(comm, compute)) / comm_len
        if comm_len > 0 else np.nan,
        "gpu_util_pct": 100 * busy / window, "cpu_busy_pct": np.nan,
    }  # fmt: skip


def memory_peak_delta(trace: Trace) -> float:
    """Peak rise, in bytes, of the profiler's allocated-memory counter over the traced steps.

    The counter is a running total kept per process (earlier profiling sessions leave their
    balance in it), so the rise is taken over its value just before the window's first event:
    what the steps themselves allocate on top of what was already live (activations, gradients,
    temporaries, communication buffers).
    """
    mem = trace.memory
    if mem.empty:
        return np.nan
    first = mem.iloc[0]
    before = first["total_allocated"] - first["bytes"]
    return float(mem["total_allocated"].max() - before)


def summarize(steps: pd.DataFrame) -> dict:
    """Mean over steps (and ranks) of a breakdown, in the results' units (ms, %)."""
    if steps.empty:
        return {}
    m = steps.mean(numeric_only=True)
    comm = m["comm_us"]
    return {
        "window_ms": m["window_us"] / 1e3,
        "compute_ms": m["compute_us"] / 1e3,
        "comm_ms": comm / 1e3,
        "overlap_ms": m["overlap_us"] / 1e3,
        "exposed_comm_ms": m["exposed_comm_us"] / 1e3,
        "idle_ms": m["idle_us"] / 1e3,
        "compute_comm_ratio": m["compute_us"] / comm if comm > 0 else np.nan,
        "overlap_pct": 100.0 * m["overlap_us"] / comm if comm > 0 else np.nan,
        "gpu_util_pct": m["gpu_util_pct"],
        "cpu_busy_pct": m["cpu_busy_pct"],
        "comm_calls_per_step": m["comm_calls"],
        "comm_bytes_per_step": m["comm_bytes"],
    }
