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

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bench import intervals as iv
from bench.trace_reader import TraceError, read_trace

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

BREAKDOWN_COLUMNS = [
    "rank", "step", "window_us", "compute_us", "comm_us", "memory_us", "overlap_us",
    "exposed_comm_us", "idle_us", "non_compute_us", "overlap_pct", "compute_comm_ratio",
    "gpu_util_pct", "cpu_busy_pct", "comm_calls", "comm_bytes",
]  # fmt: skip
RANK_COLUMNS = [
    "rank", "device", "kernel_time_us", "idle_pct", "compute_pct", "non_compute_pct",
    "comm_comp_overlap_pct", "gpu_util_pct", "cpu_busy_pct", "steps", "file",
]  # fmt: skip


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


def _spans(ev: pd.DataFrame, mask) -> np.ndarray:
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
    return iv.subtract(iv.union(_spans(ev, spans)), iv.union(_spans(ev, work)))


def cpu_compute(ev: pd.DataFrame) -> np.ndarray:
    """CPU traces: the main thread's computation, the union of its ops less the time it spends
    issuing or waiting for collectives (named ``c10d::``, ``*wait*`` ..., or inside FSDP's
    blocking spans)."""
    busy = iv.union(_spans(ev, ev["kind"] == "compute"))
    waiting = np.vstack([iv.union(_spans(ev, ev["kind"] == "comm_cpu")), blocking_waits(ev)])
    return iv.subtract(busy, waiting)


def _cpu_step_table(ev: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    comm_all = iv.union(_spans(ev, ev["kind"] == "comm"))
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
    everything = iv.union(_spans(dev, slice(None)))
    window = everything[-1, 1] - everything[0, 0]
    busy = iv.length(everything)
    compute = iv.union(_spans(dev, dev["kind"] == "compute"))
    comm = iv.union(_spans(dev, dev["kind"] == "comm"))
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


# -- command line ----------------------------------------------------------------------------
def records(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts: NaN as None, numpy scalars as Python ones."""
    out = []
    for rec in df.to_dict(orient="records"):
        out.append(
            {
                k: (
                    None
                    if isinstance(v, float) and math.isnan(v)
                    else v.item()
                    if isinstance(v, np.generic)
                    else v
                )
                for k, v in rec.items()
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.analysis", description="Analyse a folder of per-rank Kineto traces."
    )
    p.add_argument("trace_dir", type=Path)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--csv", type=Path, metavar="DIR", help="also write each table as DIR/<t>.csv")
    args = p.parse_args(argv)
    from bench.trace_folder import analyse, load_trace_dir  # the folder layer builds on this one

    try:
        ts = load_trace_dir(args.trace_dir, digest_each=True)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for problem in ts.problems:
        print(f"warning: {problem}", file=sys.stderr)
    tables = analyse(ts)
    if args.csv:
        args.csv.mkdir(parents=True, exist_ok=True)
        for name, df in tables.items():
            df.to_csv(args.csv / f"{name}.csv", index=False)
    if args.json:
        print(
            json.dumps(
                {name: records(df) for name, df in tables.items()} | {"problems": ts.problems}
            )
        )
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        for name, df in tables.items():
            print(f"\n== {name} ==")
            print(
                df.to_string(index=False, float_format=lambda v: f"{v:.2f}")
                if len(df)
                else "(none)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
