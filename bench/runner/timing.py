"""Timing discipline (after nccl-tests and nanoGPT's bench.py): warm up, barrier, time each step
with the device synchronised, and take the slowest rank's time as the step time; then repeat in
chunks until the median's interval is as tight as asked or the budget is spent (after
torch.utils.benchmark's ``adaptive_autorange``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from bench.runner.distenv import synchronize
from bench.stats.intervals import half_width_pct, median_interval

# Why a visit's timing stopped (results.csv's ``stop``).
TARGET, MAX_STEPS, MAX_SECONDS = "target", "max_steps", "max_point_s"


def timed_steps(
    step: Callable[[], object],
    n: int,
    *,
    device: torch.device,
    group: dist.ProcessGroup | None,
    on_step: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n`` steps; return per-step times in ms of the slowest and of the fastest rank."""
    dist.barrier(group=group)
    synchronize(device)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        step()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
        if on_step:
            on_step(i)
    # One all-reduce for both extremes: max(t) and max(-t) = -min(t).
    t = torch.tensor(times + [-x for x in times], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    t = t.cpu().numpy()
    return t[:n], -t[n:]


@dataclass(frozen=True, kw_only=True)
class Budget:
    """One visit's: at least ``min_steps``; then more until the interval of the median of the
    point's samples (earlier rounds' and these) is within +-``target_pct`` %, or ``max_steps``
    steps or ``max_s`` seconds of timed steps are spent."""

    min_steps: int
    max_steps: int
    max_s: float
    target_pct: float


def adaptive_steps(
    step: Callable[[], object],
    budget: Budget,
    *,
    prior: list[float],
    device: torch.device,
    group: dist.ProcessGroup | None,
    on_chunk: Callable[[int, float], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, str]:
    """(slowest-rank ms, fastest-rank ms, why it stopped). Every rank decides from the same
    all-reduced times, so they all stop after the same step without another message."""
    slow: list[float] = []
    fast: list[float] = []
    n = budget.min_steps
    while True:
        s, f = timed_steps(step, n, device=device, group=group)
        slow += s.tolist()
        fast += f.tolist()
        width = half_width_pct(prior + slow)
        spent = sum(slow) / 1e3
        if on_chunk:
            on_chunk(len(slow), width)
        if width <= budget.target_pct:
            stop = TARGET
        elif len(slow) >= budget.max_steps:
            stop = MAX_STEPS
        elif spent >= budget.max_s:
            stop = MAX_SECONDS
        else:
            # Half again as many steps (so the checks cost little), within what is left.
            per_step = max(float(np.median(slow)) / 1e3, 1e-9)
            left = (budget.max_s - spent) / per_step
            left_s = math.ceil(left) if math.isfinite(left) else budget.max_steps
            n = max(1, min(max(5, len(slow) // 2), budget.max_steps - len(slow), left_s))
            continue
        return np.array(slow), np.array(fast), stop


def summarize_times(slowest: np.ndarray, skew: np.ndarray) -> dict:
    """The figures of the slowest rank's step times; ``skew``: slowest - fastest per step."""
    lo, hi = median_interval(slowest)
    return {
        "step_ms_median": float(np.median(slowest)),
        "step_ms_ci_low": lo,
        "step_ms_ci_high": hi,
        "step_ms_min": float(slowest.min()),
        "step_ms_max": float(slowest.max()),
        "step_ms_p10": float(np.percentile(slowest, 10)),
        "step_ms_p90": float(np.percentile(slowest, 90)),
        # How far apart ranks finish the same step: straggling, not noise, when it is large.
        "rank_skew_ms": float(np.median(skew)) if len(skew) else float("nan"),
    }
