"""Timing discipline (after nccl-tests and nanoGPT's bench.py): warm up, barrier, time each step
with the device synchronised, and take the slowest rank's time as the step time."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from bench.runner.distenv import synchronize


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


def summarize_times(slowest: np.ndarray, fastest: np.ndarray) -> dict:
    return {
        "step_ms_median": float(np.median(slowest)),
        "step_ms_min": float(slowest.min()),
        "step_ms_max": float(slowest.max()),
        "step_ms_p10": float(np.percentile(slowest, 10)),
        "step_ms_p90": float(np.percentile(slowest, 90)),
        # How far apart ranks finish the same step: straggling, not noise, when it is large.
        "rank_skew_ms": float(np.median(slowest - fastest)),
    }
