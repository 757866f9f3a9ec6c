"""Kineto traces -> DataFrames: where the time of a training step went.

The definitions are those of docs/analysis.md and docs/outputs.md ("How the columns are
measured"); on GPU traces they are HolisticTraceAnalysis's (traceinsight 0.6.1,
``hta/analyzers/breakdown_analysis.py``: ``get_temporal_breakdown`` and
``_get_idle_time_for_kernels``; ``get_comm_comp_overlap``), so that the figures can be checked
against it (``hta_summary``, tests/test_analysis_hta.py):

GPU traces
    Device events are the events with a stream (kernels, memcpy, memset). They are
    communication (``^nccl``, ``^hccl``, ``^hip``, ``ncclKernel``), memory (``Memcpy``,
    ``Memset``, ``dma``) or computation (the rest, except synchronisation and launch
    records, which are "other"), with HTA's patterns. HTA measures a rank over one window,
    from its first kernel's start to its last kernel's end: idle = window - |union of all
    device events|, compute = |union of compute kernels|, non-compute = window - compute -
    idle. HTA has no per-step windows; ours cut the device's time line into consecutive
    windows, one per ``ProfilerStep#N`` (``trace.device_windows``): step N's begins where its
    device work can begin (the host has begun the step and the device has finished what was
    launched before it) and ends where step N+1's begins. The device's idle time between
    steps (waiting for data, a host sync, the optimiser's launches) so falls in a step, and
    the steps' totals equal HTA's figures over the same span. A collective call and its bytes
    belong to the step that launched it (same ``correlation`` id).
CPU traces (gloo)
    gloo runs each collective on a worker thread (``gloo:all_reduce`` ...); communication is the
    union of those spans. The main thread (the one carrying ``ProfilerStep#N``) computes;
    computation is the union of its ops less its calls into the collective library
    (``c10d``'s ops) and less the time it is blocked on a collective (``blocking_waits``),
    which is read from what the threads do, not from names. The step windows are the
    ``ProfilerStep#N`` spans.

Per rank and step window: compute = |C|, comm = |M|, overlap = |C & M|, exposed communication =
|M - C|, idle = window - |all device work| (CPU: |C | M|), non-compute = window - compute - idle,
overlap % = overlap / comm, utilisation = |all work| / window. On GPU traces this is the GPU
utilisation; on CPU traces the same ratio is reported as ``cpu_busy_pct`` (main thread computing
or a collective in flight), never as GPU utilisation. A rank's row (``rank_summary``) is the
same figures totalled over every traced step, on CPU and GPU alike.

Every analysis is a function from DataFrames to DataFrames with stable columns; the command line
(``python -m bench.analysis TRACE_DIR``) and the reports are separate layers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analysis import interval_sets as iv
from bench.analysis.trace import (
    STEP,
    Trace,
    TraceError,
    classify,
    device_windows,
    host_steps,
    intervals_of,
    load_trace,
    prepared,
    step_windows,
)

__all__ = ["STEP", "Trace", "TraceError", "load_trace", "prepared"]

BREAKDOWN_COLUMNS = [
    "rank",
    "step",
    "window_us",
    "compute_us",
    "comm_us",
    "memory_us",
    "overlap_us",
    "exposed_comm_us",
    "idle_us",
    "non_compute_us",
    "overlap_pct",
    "compute_comm_ratio",
    "gpu_util_pct",
    "cpu_busy_pct",
    "comm_calls",
    "comm_bytes",
]
RANK_COLUMNS = [
    "rank",
    "device",
    "kernel_time_us",
    "idle_pct",
    "compute_pct",
    "non_compute_pct",
    "comm_comp_overlap_pct",
    "gpu_util_pct",
    "cpu_busy_pct",
    "steps",
    "file",
]


def _length_before(u: np.ndarray, t: np.ndarray) -> np.ndarray:
    """|u & (-inf, t)| for each t, for a canonical union ``u`` (sorted, disjoint)."""
    if len(u) == 0:
        return np.zeros(len(t))
    lengths = u[:, 1] - u[:, 0]
    done = np.concatenate([[0.0], np.cumsum(lengths)])  # done[k]: the first k intervals
    k = np.searchsorted(u[:, 0], t, side="right") - 1  # the last interval starting by t
    kk = np.clip(k, 0, None)
    part = np.clip(t - u[kk, 0], 0, lengths[kk])
    return np.where(k >= 0, done[kk] + part, 0.0)


def _length_in(u: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|u & [lo, hi)| for every window at once, by binary search: the cost of many steps is
    that of one pass over the trace."""
    return _length_before(u, hi) - _length_before(u, lo)


def _step_table(windows: pd.DataFrame, parts: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per window: its length and the length of each union of ``parts`` within it."""
    lo, hi = windows["start"].to_numpy(dtype=float), windows["end"].to_numpy(dtype=float)
    out = {"step": windows["step"].to_numpy(), "window_us": hi - lo}
    return pd.DataFrame(out | {f"{k}_us": _length_in(u, lo, hi) for k, u in parts.items()})


def breakdown(trace: Trace) -> pd.DataFrame:
    """Per-step temporal breakdown and overlap of one rank's trace (BREAKDOWN_COLUMNS).

    The unions of each kind are built once for the whole trace and measured in every step
    window at once by binary search.
    """
    gpu = trace.is_gpu
    ev = prepared(trace)
    windows = step_windows(ev)
    if windows.empty:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    if gpu:
        windows = device_windows(ev, windows)
        dev = (ev["stream"] >= 0).to_numpy()
        kind = ev["kind"].to_numpy()
        compute, comm, memory = (
            iv.union(intervals_of(ev, dev & (kind == k))) for k in ("compute", "comm", "memory")
        )
        busy = iv.union(intervals_of(ev, dev))
    else:
        compute, comm = cpu_compute(ev), iv.union(intervals_of(ev, ev["kind"] == "comm"))
        memory, busy = iv.EMPTY, iv.union(np.vstack([compute, comm]))
    table = _step_table(
        windows,
        {
            "busy": busy,
            "compute": compute,
            "comm": comm,
            "memory": memory,
            "overlap": iv.intersect(compute, comm),
        },
    )
    comm_ev = ev[ev["kind"] == "comm"]
    calls = comm_ev.groupby("step").size()
    payload = comm_ev.groupby("step")["nbytes"].sum(min_count=1)
    window, busy = table["window_us"], table["busy_us"]
    compute, comm, overlap = table["compute_us"], table["comm_us"], table["overlap_us"]
    util = (100.0 * busy / window).where(window > 0)
    out = pd.DataFrame(
        {
            "rank": trace.rank,
            "step": table["step"],
            "window_us": window,
            "compute_us": compute,
            "comm_us": comm,
            "memory_us": table["memory_us"],
            "overlap_us": overlap,
            "exposed_comm_us": comm - overlap,
            "idle_us": window - busy,
            "non_compute_us": busy - compute,
            "overlap_pct": (100.0 * overlap / comm).where(comm > 0),
            "compute_comm_ratio": (compute / comm).where(comm > 0),
            "gpu_util_pct": util if gpu else np.nan,
            "cpu_busy_pct": np.nan if gpu else util,
            "comm_calls": table["step"].map(calls).fillna(0).astype(int),
            "comm_bytes": table["step"].map(payload),
        }
    )
    return out[BREAKDOWN_COLUMNS].reset_index(drop=True)


def _innermost(start: np.ndarray, end: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Index of the innermost of the nested spans [start, end) open at each point (-1 where
    none is), for all points at once: the open spans at a point form a chain, and the
    innermost is the last span to start at that point's depth (a later start at the same
    depth would have to close the innermost first)."""
    out = np.full(len(points), -1)
    spans = np.flatnonzero(end > start)
    if len(spans) == 0 or len(points) == 0:
        return out
    s, e = start[spans], end[spans]
    times = np.concatenate([s, e])
    delta = np.concatenate([np.ones(len(s)), -np.ones(len(e))])
    # at equal times ends first, then the longer of two spans starting together (the outer)
    order = np.lexsort((-np.concatenate([e, e]), delta, times))
    depth_after = np.empty(len(times))
    depth_after[order] = np.cumsum(delta[order])
    level = depth_after[: len(s)].astype(int)  # each span's depth once it has started
    opened, closed = (np.searchsorted(np.sort(t), points, "right") for t in (s, e))
    depth = opened - closed
    for d in np.unique(depth[depth > 0]):
        at = spans[level == d][np.argsort(s[level == d], kind="stable")]
        q = depth == d
        pos = np.searchsorted(start[at], points[q], side="right") - 1
        out[q] = np.where(pos >= 0, at[np.clip(pos, 0, None)], -1)
    found = out >= 0
    found[found] = (start[out[found]] <= points[found]) & (end[out[found]] > points[found])
    return np.where(found, out, -1)  # spans that do not nest (clock jitter) find none


def blocking_waits(ev: pd.DataFrame) -> np.ndarray:
    """CPU traces: the main thread's time blocked on a collective, read from what the threads
    do, whatever the spans are called.

    A thread blocked in ``work.wait()`` records nothing until gloo's worker thread completes
    the collective, then resumes. So a stretch of the main thread in which none of its events
    begins or ends, and during which a collective completes, is a wait when the span the
    thread is in runs no kernel of its own: an annotation (a ``record_function`` region's own
    time is Python; its work is in the ops it contains), or an op that has called into the
    collective library earlier (``dist.all_reduce`` inside an autograd Function or a custom
    op blocks in that op's own time). Any other op's own time is its kernel (``aten::mul``
    between its sub-ops): a collective that completes then was overlapped, not waited for.
    """
    kind = ev["kind"].to_numpy()
    main = ev[(kind == "compute") | (kind == "comm_cpu")]
    comm = ev[kind == "comm"]
    if main.empty or comm.empty:
        return iv.EMPTY.copy()
    start = main["ts"].to_numpy(dtype=float)
    end = start + main["dur"].to_numpy(dtype=float)
    bounds = np.unique(np.concatenate([start, end]))
    done = (comm["ts"] + comm["dur"]).to_numpy(dtype=float)
    j = np.searchsorted(bounds, done, side="left")  # bounds[j - 1] < done <= bounds[j]
    j = np.unique(j[(j > 0) & (j < len(bounds))])
    lo, hi = bounds[j - 1], bounds[j]
    k = _innermost(start, end, (lo + hi) / 2)
    inside = k >= 0
    kk = np.clip(k, 0, None)
    annotation = (main["cat"] == "user_annotation").to_numpy()[kk]
    # called: the last call into the collective library that ended by the stretch's start lies
    # inside the span (a call does not straddle the span it is in)
    calls = np.sort(end[(main["kind"] == "comm_cpu").to_numpy()])
    last = np.searchsorted(calls, lo, side="right") - 1
    called = (last >= 0) & (calls[np.clip(last, 0, None)] > start[kk]) if len(calls) else False
    wait = inside & (annotation | called)
    return iv.union(np.column_stack([lo[wait], hi[wait]]))


def cpu_compute(ev: pd.DataFrame) -> np.ndarray:
    """CPU traces: the main thread's computation, the union of its ops less its calls into the
    collective library and less the time it is blocked on a collective (``blocking_waits``)."""
    busy = iv.union(intervals_of(ev, ev["kind"] == "compute"))
    waiting = np.vstack([iv.union(intervals_of(ev, ev["kind"] == "comm_cpu")), blocking_waits(ev)])
    return iv.subtract(busy, waiting)


# -- a rank's row, and HolisticTraceAnalysis's own figures -----------------------------------
def rank_summary(trace: Trace, steps: pd.DataFrame | None = None) -> dict:
    """One rank's row of the ranks table (RANK_COLUMNS): the per-step table's figures totalled
    over every traced step (``steps``, the trace's ``breakdown``, when the caller has it
    already), one rule for CPU and GPU traces. ``kernel_time_us`` is the steps' total window."""
    gpu = trace.is_gpu
    base = {"rank": trace.rank, "device": "gpu" if gpu else "cpu", "file": trace.path.name}
    steps = breakdown(trace) if steps is None else steps
    window = steps["window_us"].sum()
    if steps.empty or window <= 0:
        return {**base, "steps": 0}
    s = steps.sum(numeric_only=True)
    util = 100 * (window - s["idle_us"]) / window
    return {
        **base,
        "kernel_time_us": window,
        "steps": len(steps),
        "idle_pct": 100 * s["idle_us"] / window,
        "compute_pct": 100 * s["compute_us"] / window,
        "non_compute_pct": 100 * s["non_compute_us"] / window,
        "comm_comp_overlap_pct": 100 * s["overlap_us"] / s["comm_us"]
        if s["comm_us"] > 0
        else np.nan,
        "gpu_util_pct": util if gpu else np.nan,
        "cpu_busy_pct": np.nan if gpu else util,
    }


def hta_filter(events: pd.DataFrame) -> pd.DataFrame:
    """HTA's default trace filter: drop what the last ProfilerStep and anything after it
    launched (HTA takes the last step to be cut short). CPU events are kept when they start
    before the last ProfilerStep; device events when their launch (same correlation id) is
    kept. Applied only when the trace holds two or more distinct steps."""
    is_step = pd.Series(host_steps(events), index=events.index)
    if events.loc[is_step, "name"].nunique() < 2:
        return events
    cpu = events["stream"] < 0
    cutoff = events.loc[is_step, "ts"].max()
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


def hta_summary(trace: Trace) -> dict:
    """A GPU trace's whole-trace figures (RANK_COLUMNS) exactly as HolisticTraceAnalysis's
    ``get_temporal_breakdown`` and ``get_comm_comp_overlap`` compute them: its filter (the
    last step left out), its rounding, one window from the first kernel to the last. The
    check that our definitions are HTA's; the ranks table is ``rank_summary``. A CPU trace
    has none of these figures (``steps`` 0)."""
    base = {"rank": trace.rank, "device": "gpu" if trace.is_gpu else "cpu", "file": trace.path.name}
    kept = hta_filter(trace.events)
    ev = classify(_hta_round(kept), gpu=True)
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
        **base,
        "kernel_time_us": window,
        "steps": len(step_windows(kept)),
        "idle_pct": 100 * idle / window,
        "compute_pct": 100 * iv.length(compute) / window,
        "non_compute_pct": 100 * (window - iv.length(compute) - idle) / window,
        "comm_comp_overlap_pct": 100 * iv.length(iv.intersect(comm, compute)) / comm_len
        if comm_len > 0
        else np.nan,
        "gpu_util_pct": 100 * busy / window,
        "cpu_busy_pct": np.nan,
    }


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
