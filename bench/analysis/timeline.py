"""One profiled step of every rank, as a table of bars on a common time axis: what the step
looked like, not only how long its parts took (``breakdown`` gives the totals).

Each rank gets these lanes, from the analyser's own definitions (``breakdown.py``):

- ``phase``: forward, backward, optimizer, the host's spans. Backward runs from the first
  autograd function evaluated to the last, and the optimizer is ``Optimizer.step``. Forward runs
  from the step's start to backward's start. A pipeline's stage has its micro-batches' spans
  instead of forward and backward (``F3``, ``B3``: ``facts.PIPELINE_MICRO_SPAN``), so that its
  ranks' lanes draw the schedule, stage by stage.
- ``compute``: the computation (GPU: compute kernels; CPU: the main thread's ops, less its
  calls into the collective library and its blocking waits, as ``cpu_compute``).
- ``comm``: one bar per collective call (GPU: its kernel; CPU: gloo's span on its worker
  thread), labelled with the op and the bytes of its input.
- ``wait``: time the rank waits on communication: communication in flight that no computation
  overlaps (the analyser's exposed communication, ``exposed_comm_ms``), on CPU and GPU alike.
- ``idle``: the step's window with no work at all (GPU: no kernel; CPU: neither computation nor
  a collective in flight).

Time is in milliseconds from the earliest start of the step over the ranks. Ranks on one host
share its clock; across hosts the traces' clocks may be offset by the hosts' skew, which the
trace does not record.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from bench.analysis import interval_sets as iv
from bench.analysis.breakdown import cpu_compute
from bench.analysis.trace import (
    Trace,
    common_steps,
    device_windows,
    intervals_of,
    name_matches,
    prepared,
    step_windows,
)
from bench.console import human_bytes
from parallel_kernels.facts import PIPELINE_MICRO_SPAN, op_name, pipeline_micro_label

TIMELINE_COLUMNS = ["rank", "step", "lane", "start_ms", "end_ms", "label", "op", "bytes"]
LANES = ("phase", "compute", "comm", "wait", "idle")
_BACKWARD = re.compile(r"^autograd::engine::evaluate_function")
_OPTIMIZER = re.compile(r"^Optimizer\.step")


class TimelineError(ValueError):
    """A set of traces with no step to draw; one line."""


def pick_step(traces: list[Trace], step: int | None = None) -> int:
    """``step`` if every rank holds it, else the last step every rank holds (the profiler's
    earlier active steps can still carry its start-up)."""
    steps = common_steps(traces)
    if not steps:
        names = ", ".join(t.path.name for t in traces) or "no trace"
        raise TimelineError(f"no profiler step is in every rank's trace ({names})")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise TimelineError(f"step {step} is not in every rank's trace (they hold {steps})")
    return step


def _micro_batches(host: pd.DataFrame) -> list[tuple[str, float, float]]:
    """A pipeline stage's micro-batch spans (``facts.PIPELINE_MICRO_SPAN``), labelled ``F3``,
    ``B3`` (torch's multi-stage actions with their stage: ``1F3``)."""
    spans = host[
        name_matches(host["name"], PIPELINE_MICRO_SPAN) & (host["cat"] != "gpu_user_annotation")
    ]
    names = spans["name"].astype(str)
    labels = names.map({n: pipeline_micro_label(n) for n in names.unique()})
    ends = spans["ts"] + spans["dur"]
    return [
        (str(label), float(s), float(e))
        for label, s, e in zip(labels, spans["ts"], ends, strict=True)
    ]


def _phases(ev: pd.DataFrame, lo: float, hi: float) -> list[tuple[str, float, float]]:
    host = ev[(ev["stream"] < 0) & (ev["ts"] >= lo) & (ev["ts"] < hi)]
    out = _micro_batches(host)  # a pipeline's stage: its micro-batches, not one forward
    back = host[name_matches(host["name"], _BACKWARD)]
    b0 = float(back["ts"].min()) if len(back) else np.nan
    if len(back) and not out:
        out.append(("forward", lo, b0))
        out.append(("backward", b0, float((back["ts"] + back["dur"]).max())))
    opt = host[name_matches(host["name"], _OPTIMIZER)]
    for s, d in zip(opt["ts"], opt["dur"], strict=True):
        out.append(("optimizer", float(s), float(s + d)))
    return out


def _rank_bars(trace: Trace, step: int) -> tuple[list[dict], float, float]:
    """This rank's bars of ``step`` (absolute microseconds) and the step's window."""
    ev = prepared(trace)
    host_windows = step_windows(ev)
    windows = device_windows(ev, host_windows) if trace.is_gpu else host_windows
    w = windows[windows["step"] == step].iloc[0]
    lo, hi = float(w["start"]), float(w["end"])
    host = host_windows.set_index("step").loc[step]
    bars: list[dict] = []

    def add(lane: str, spans: np.ndarray, label: str = "") -> None:
        for s, e in iv.clip(spans, lo, hi):
            bars.append(
                {"lane": lane, "start": s, "end": e, "label": label, "op": "", "bytes": np.nan}
            )

    for name, s, e in _phases(ev, float(host["start"]), float(host["end"])):
        add("phase", np.array([[s, e]]), name)
    if trace.is_gpu:
        dev = (ev["stream"] >= 0).to_numpy()
        kind = ev["kind"].to_numpy()
        compute = iv.union(intervals_of(ev, dev & (kind == "compute")))
        comm = iv.union(intervals_of(ev, dev & (kind == "comm")))
        busy = iv.union(intervals_of(ev, dev))
    else:
        compute = cpu_compute(ev)
        comm = iv.union(intervals_of(ev, ev["kind"] == "comm"))
        busy = iv.union(np.vstack([compute, comm]))
    add("compute", compute)
    add("wait", iv.subtract(comm, compute))
    add("idle", iv.subtract(np.array([[lo, hi]]), busy))
    calls = ev[(ev["kind"] == "comm") & (ev["ts"] < hi) & (ev["ts"] + ev["dur"] > lo)]
    for name, s, d, nbytes in zip(
        calls["name"], calls["ts"], calls["dur"], calls["nbytes"], strict=True
    ):
        op = op_name(str(name))
        size = float(nbytes) if pd.notna(nbytes) else np.nan
        label = f"{op} {human_bytes(size)}" if np.isfinite(size) else op
        bars.append(
            {
                "lane": "comm",
                "start": max(float(s), lo),
                "end": min(float(s + d), hi),
                "label": label,
                "op": op,
                "bytes": size,
            }
        )
    return bars, lo, hi


def step_timeline(traces: list[Trace], step: int | None = None) -> pd.DataFrame:
    """Every rank's bars of one profiled step (TIMELINE_COLUMNS), on one time axis: ms from
    the earliest start of the step over the ranks. Raises TimelineError (one line) when no
    profiler step is in every rank's trace."""
    step = pick_step(traces, step)
    rows, origin = [], np.inf
    for t in sorted(traces, key=lambda t: t.rank):
        bars, lo, _ = _rank_bars(t, step)
        origin = min(origin, lo)
        rows += [{"rank": t.rank, "step": step, **b} for b in bars]
    df = pd.DataFrame(
        rows, columns=["rank", "step", "lane", "start", "end", "label", "op", "bytes"]
    )
    df["start_ms"] = (df["start"] - origin) / 1e3
    df["end_ms"] = (df["end"] - origin) / 1e3
    out = df[TIMELINE_COLUMNS].sort_values(["rank", "lane", "start_ms"]).reset_index(drop=True)
    out.attrs["origin_us"] = origin  # where 0 ms is, for bars drawn on it (the critical path)
    return out


def inside(timeline: pd.DataFrame, lane: str, phase: str) -> pd.Series:
    """Per rank: the share (0..1) of ``lane``'s time that lies within ``phase`` (for
    example how much of the communication ran during backward)."""
    out = {}
    for rank, g in timeline.groupby("rank"):
        bars = g[g["lane"] == lane]
        span = g[(g["lane"] == "phase") & (g["label"] == phase)]
        a = iv.union(np.column_stack([bars["start_ms"], bars["end_ms"]]))
        b = iv.union(np.column_stack([span["start_ms"], span["end_ms"]]))
        total = iv.length(a)
        out[rank] = iv.length(iv.intersect(a, b)) / total if total > 0 else np.nan
    return pd.Series(out, name=f"{lane}_in_{phase}")
