"""A pipeline stage's bubble, read from its trace: the part of the schedule's run (the span a
pipelined step records, ``facts.PIPELINE_SCHEDULE_SPAN``) in which the stage does not compute,
and the point-to-point bytes it sends there.

Computation is the breakdown's own (``breakdown.py``). On CPU traces it is the main thread's
ops less its calls into the collective library and its blocking waits (``cpu_compute``): a
stage blocked in a receive, or on its sends at the schedule's end, is idle. On GPU traces it
is the device's compute kernels, in the span's window on the device: from where the device
could begin the span's work (the host has entered the span and the device has finished what
was launched before it, or the span's first kernel, if earlier) to the end of the last device
work the span launched.

So measured, the bubble holds all that the stage does not compute in the schedule: the fill
and drain the schedule's theory counts ((p - 1) / (v m + p - 1) of equal stages,
``pipeline_theory.bubble_fraction``) and what the theory leaves out: stages of unequal work
(the first holds the embedding, the last the head and the loss), the time a receive or a send
takes beyond the other stage's work, the calls into the library. The optimiser's step and the
reduction of tied weights' gradients run outside the span, so they are in neither.

The sends are the host's spans of the backend's send (``gloo:send``, ``nccl:send``) that start
in the span, with the bytes of their tensor.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from bench.analysis import interval_sets as iv
from bench.analysis.breakdown import cpu_compute
from bench.analysis.trace import Trace, intervals_of, launch_times, name_matches, prepared
from parallel_kernels.facts import PIPELINE_SCHEDULE_SPAN, op_name

BUBBLE_COLUMNS = [
    "rank",
    "step",
    "span_us",
    "compute_us",
    "bubble_us",
    "bubble_pct",
    "p2p_sends",
    "p2p_bytes",
]
_BACKEND_SPAN = re.compile(r"^(?:gloo|nccl):")  # a collective's or a send's host span


def schedule_spans(ev: pd.DataFrame) -> pd.DataFrame:
    """The host's schedule spans of a prepared trace, one per traced step: step, start, end
    (microseconds); the spans outside every profiler step are left out."""
    host = (ev["stream"] < 0) & (ev["cat"] == "user_annotation")
    spans = ev[host & (ev["name"] == PIPELINE_SCHEDULE_SPAN) & (ev["step"] >= 0)]
    out = pd.DataFrame(
        {"step": spans["step"], "start": spans["ts"], "end": spans["ts"] + spans["dur"]}
    )
    return out.sort_values("start").reset_index(drop=True)


def device_spans(ev: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """GPU traces: each schedule span's window on the device (step, start, end): from where
    the device could begin the span's work to the end of the last device event the span
    launched (an empty window where it launched none)."""
    dev = ev[ev["stream"] >= 0]
    launched = launch_times(ev)[dev.index].to_numpy(dtype=float)
    begin = dev["ts"].to_numpy(dtype=float)
    finish = begin + dev["dur"].to_numpy(dtype=float)
    rows = []
    for step, lo, hi in spans[["step", "start", "end"]].itertuples(index=False):
        inside = (launched >= lo) & (launched < hi)
        if not inside.any():
            rows.append((step, lo, lo))
            continue
        earlier = finish[launched < lo]
        ready = max(lo, earlier.max()) if len(earlier) else lo
        rows.append((step, min(begin[inside].min(), ready), finish[inside].max()))
    return pd.DataFrame(rows, columns=["step", "start", "end"])


def _sends(ev: pd.DataFrame) -> pd.DataFrame:
    """The host's spans of the backend's point-to-point sends: start, bytes."""
    host = ev[(ev["stream"] < 0).to_numpy() & name_matches(ev["name"], _BACKEND_SPAN)]
    names = host["name"].astype(str)
    is_send = names.map({n: op_name(n) == "send" for n in names.unique()}).astype(bool)
    return host.loc[is_send, ["ts", "nbytes"]]


def pipeline_bubble(trace: Trace) -> pd.DataFrame:
    """Per traced step of one stage's trace (BUBBLE_COLUMNS): the schedule span's length (on
    a GPU, its window on the device), the stage's computation in it, the rest (the bubble) and
    its share of the span, and the sends the span made with their bytes. Empty for a trace
    without a schedule span (a strategy that does not pipeline)."""
    ev = prepared(trace)
    spans = schedule_spans(ev)
    if spans.empty:
        return pd.DataFrame(columns=BUBBLE_COLUMNS)
    if trace.is_gpu:
        windows = device_spans(ev, spans)
        dev = (ev["stream"] >= 0).to_numpy()
        compute = iv.union(intervals_of(ev, dev & (ev["kind"] == "compute").to_numpy()))
    else:
        windows, compute = spans, cpu_compute(ev)
    lo, hi = windows["start"].to_numpy(dtype=float), windows["end"].to_numpy(dtype=float)
    busy = np.array([iv.length(iv.window(compute, a, b)) for a, b in zip(lo, hi, strict=True)])
    sends = _sends(ev)
    at = sends["ts"].to_numpy(dtype=float)
    nbytes = sends["nbytes"].fillna(0).to_numpy(dtype=float)
    host_lo, host_hi = spans["start"].to_numpy(dtype=float), spans["end"].to_numpy(dtype=float)
    made = [(at >= a) & (at < b) for a, b in zip(host_lo, host_hi, strict=True)]
    span = pd.Series(hi - lo)
    out = pd.DataFrame(
        {
            "rank": trace.rank,
            "step": windows["step"].to_numpy(),
            "span_us": span,
            "compute_us": busy,
            "bubble_us": span - busy,
            "bubble_pct": (100 * (span - busy) / span).where(span > 0),
            "p2p_sends": [int(m.sum()) for m in made],
            "p2p_bytes": [float(nbytes[m].sum()) for m in made],
        }
    )
    return out[BUBBLE_COLUMNS]


def stage_summary(steps: pd.DataFrame) -> dict:
    """One stage's figures over its traced steps (``pipeline_bubble``'s table): its bubble, the
    steps' idle time over their spans' (%), and its point-to-point bytes per step; empty for a
    table without a step."""
    span = steps["span_us"].sum() if len(steps) else 0.0
    if not span > 0:
        return {}
    return {
        "bubble_pct": 100 * float(steps["bubble_us"].sum()) / float(span),
        "p2p_bytes_per_step": float(steps["p2p_bytes"].mean()),
    }
