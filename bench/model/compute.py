"""A training step's computation, read from its traces with our analyser.

Per rank and profiled step, on the analyser's computation (CPU: the main thread's ops less the
time it issues or waits for collectives; GPU: the union of compute kernels, each placed by the
time the CPU launched it):

- ``forward_ms``: computation from the step's start to backward's first autograd node (data
  loading, zero_grad and the loss included);
- ``backward_ms``: computation from there to the end of the last autograd node;
- ``after_ms``: computation after backward (gradients copied back, clipping, optimiser step);
- ``grads``: each gradient as backward produces it (``AccumulateGrad``): its bytes and the
  backward computation done when it was ready, in that order (what DDP buckets by).

Ranks are combined by the maximum of each quantity per step: a collective starts when its
slowest rank joins, and the step time is the slowest rank's. Steps are combined by the median.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from bench.analysis import breakdown as analysis
from bench.analysis import interval_sets as iv
from bench.model.comm import FitError

AUTOGRAD_NODE = "autograd::engine::evaluate_function"
ACCUMULATE = "torch::autograd::AccumulateGrad"


@dataclass(frozen=True)
class ComputeProfile:
    forward_ms: float
    backward_ms: float
    after_ms: float
    grad_ready_ms: tuple[float, ...] = ()  # backward computation done when each grad was ready
    grad_bytes: tuple[int, ...] = ()
    source: str = ""
    points: int = 1  # how many points' traces were pooled
    # FSDP's own computation per step beyond the model's (its copies and hooks; the planner's
    # CPU calibration, bench/plan/rates.py), spread over the units: a traced FSDP step
    # holds it already (0)
    fsdp_extra_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.forward_ms + self.backward_ms + self.after_ms

    def scaled(self, speedup: float) -> ComputeProfile:
        """The same step on a device ``speedup`` times faster."""
        return replace(
            self,
            forward_ms=self.forward_ms / speedup,
            backward_ms=self.backward_ms / speedup,
            after_ms=self.after_ms / speedup,
            grad_ready_ms=tuple(t / speedup for t in self.grad_ready_ms),
        )


def _compute_items(ev: pd.DataFrame, gpu: bool) -> pd.DataFrame:
    """Compute intervals with the time that orders them into phases (``key``): on CPU traces
    the analyser's computation (``analysis.cpu_compute``), keyed by start; on GPU traces the
    compute kernels, keyed by the CPU launch."""
    if gpu:
        comp = ev[ev["kind"] == "compute"]
        launches = ev[(ev["stream"] < 0) & (ev["correlation"] >= 0)].drop_duplicates("correlation")
        key = comp["correlation"].map(launches.set_index("correlation")["ts"]).fillna(comp["ts"])
        return pd.DataFrame({"key": key, "start": comp["ts"], "end": comp["ts"] + comp["dur"]})
    compute = analysis.cpu_compute(ev)
    return pd.DataFrame({"key": compute[:, 0], "start": compute[:, 0], "end": compute[:, 1]})


def _busy_us(items: pd.DataFrame, lo: float, hi: float, gpu: bool) -> float:
    """Computation between ``lo`` and ``hi``: on CPU the computation clipped to the interval,
    on GPU the union of the kernels launched in it."""
    if gpu:
        sel = items[(items["key"] >= lo) & (items["key"] < hi)]
        return iv.length(iv.union(iv.as_intervals(sel["start"], sel["end"])))
    sel = items[(items["end"] > lo) & (items["start"] < hi)]
    return iv.length(iv.clip(iv.as_intervals(sel["start"], sel["end"]), lo, hi))


def step_profiles(trace: analysis.Trace) -> list[dict]:
    """One dict per profiled step of one rank's trace (see the module docstring)."""
    ev = analysis.prepared(trace)
    gpu = trace.is_gpu
    items = _compute_items(ev, gpu)
    names = ev["name"].astype(str)
    cpu = ev[(ev["stream"] < 0).to_numpy()]
    cpu_names = names[cpu.index]
    nodes = cpu[cpu_names.str.startswith(AUTOGRAD_NODE).to_numpy()]
    accum = cpu[(cpu_names == ACCUMULATE).to_numpy()]
    out = []
    for _, w in analysis.step_windows(ev).iterrows():
        s, e = w["start"], w["end"]
        bw = nodes[(nodes["ts"] >= s) & (nodes["ts"] < e)]
        if bw.empty:
            continue
        b0, b1 = bw["ts"].min(), (bw["ts"] + bw["dur"]).max()
        grads = accum[(accum["ts"] >= b0) & (accum["ts"] < b1)].sort_values("ts")
        ready = [_busy_us(items, b0, t, gpu) / 1e3 for t in grads["ts"] + grads["dur"]]
        out.append(
            {
                "step": int(w["step"]),
                "forward_ms": _busy_us(items, s, b0, gpu) / 1e3,
                "backward_ms": _busy_us(items, b0, b1, gpu) / 1e3,
                "after_ms": _busy_us(items, b1, e, gpu) / 1e3,
                "grad_ready_ms": ready,
                "grad_bytes": [int(b) if b == b else 0 for b in grads["nbytes"]],
            }
        )
    return out


def _median_lists(lists: list[list[float]]) -> list[float]:
    """Element-wise median of lists; lists of another length than the most common are set
    aside (a step that produced its gradients differently)."""
    if not lists:
        return []
    lengths = pd.Series([len(x) for x in lists])
    n = int(lengths.mode().iloc[0])
    same = np.array([x for x in lists if len(x) == n], dtype=float)
    return list(np.median(same, axis=0)) if n else []


def combine(per_rank_steps: list[list[dict]], source: str) -> ComputeProfile:
    """Each profiled step's slowest rank (per quantity, and per gradient: a collective starts
    when its last rank joins), then the median over steps. Steps are matched across ranks by
    their ``ProfilerStep`` number; taking the maximum per step, not the maximum of per-rank
    medians, keeps the cost of ranks that are slow at different steps (a time-shared core)."""
    by_step: dict[int, list[dict]] = {}
    for steps in per_rank_steps:
        for st in steps:
            by_step.setdefault(st["step"], []).append(st)
    if not by_step:
        raise FitError(f"{source}: no profiled step with a backward pass in its traces")
    rows = []
    for ranks in by_step.values():
        n = int(pd.Series([len(r["grad_ready_ms"]) for r in ranks]).mode().iloc[0])
        same = [r for r in ranks if len(r["grad_ready_ms"]) == n]
        rows.append(
            {
                **{k: max(r[k] for r in ranks) for k in ("forward_ms", "backward_ms", "after_ms")},
                "grad_ready_ms": list(np.max([r["grad_ready_ms"] for r in same], axis=0))
                if n
                else [],
                "grad_bytes": list(same[0]["grad_bytes"]),
            }
        )
    ready = _median_lists([r["grad_ready_ms"] for r in rows])
    sizes = next((r["grad_bytes"] for r in rows if len(r["grad_bytes"]) == len(ready)), [])
    return ComputeProfile(
        **{
            k: float(np.median([r[k] for r in rows]))
            for k in ("forward_ms", "backward_ms", "after_ms")
        },
        grad_ready_ms=tuple(ready),
        grad_bytes=tuple(int(b) for b in sizes),
        source=source,
    )


def point_traces(folder: Path, pattern: str = "*.pt.trace.json*") -> list[analysis.Trace]:
    """Every rank's trace of one point."""
    files = sorted(Path(folder).glob(pattern))
    if not files:
        raise FitError(f"{folder} has no traces")
    return [analysis.load_trace(f) for f in files]


def from_traces(traces: list[analysis.Trace], source: str) -> ComputeProfile:
    return combine([step_profiles(t) for t in traces], source)


def from_trace_dir(folder: Path, pattern: str = "*.pt.trace.json*") -> ComputeProfile:
    """The profile of one point: every rank's trace in ``folder``."""
    return from_traces(point_traces(folder, pattern), str(folder))


def pooled(profiles: list[ComputeProfile], source: str) -> ComputeProfile:
    """Points that compute the same thing (they differ only in how they communicate): the
    median of each quantity over them."""
    if len(profiles) == 1:
        return profiles[0]
    ready = _median_lists([list(p.grad_ready_ms) for p in profiles])
    sizes = next((p.grad_bytes for p in profiles if len(p.grad_bytes) == len(ready)), ())
    return ComputeProfile(
        forward_ms=float(np.median([p.forward_ms for p in profiles])),
        backward_ms=float(np.median([p.backward_ms for p in profiles])),
        after_ms=float(np.median([p.after_ms for p in profiles])),
        grad_ready_ms=tuple(ready),
        grad_bytes=tuple(sizes),
        source=source,
        points=len(profiles),
    )
