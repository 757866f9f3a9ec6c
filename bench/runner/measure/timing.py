"""Timing discipline (after nccl-tests and nanoGPT's bench.py): warm up; then every timed step
starts together (a barrier, outside the timed span) with the device synchronised, and a step
lasts from the first rank's start to the last rank's end on a common clock; then repeat in
chunks until the median's interval is as tight as asked or the budget is spent (after
torch.utils.benchmark's ``adaptive_autorange``).

Why a common clock: per-rank durations taken element-wise (the slowest rank's duration per
step) are not aligned in time, and when collectives couple the ranks every rank's duration is
the same even with a real straggler. Each rank's ``perf_counter`` is mapped onto the first
rank's clock once per point by Cristian's algorithm (the ping-pong with the shortest round trip;
its error is at most half that round trip, tens of microseconds here), so step = last end -
first start and skew = last end - first end are differences of times on one clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from bench.runner.session.distenv import synchronize
from bench.stats.intervals import half_width_pct, median_interval

# Why a visit's timing stopped (results.csv's ``stop``).
TARGET, MAX_STEPS, MAX_SECONDS = "target", "max_steps", "max_point_s"

PING_PONGS = 8  # per rank, to find a short round trip to the first rank


@dataclass(frozen=True)
class Clock:
    """This rank's clock read on the group's common time: ``read() + offset_s``."""

    read: Callable[[], float] = time.perf_counter
    offset_s: float = 0.0
    round_trip_s: float = 0.0  # of the ping-pong that set the offset: twice its error bound

    def now(self) -> float:
        return self.read() + self.offset_s


def common_clock(
    group: dist.ProcessGroup | None,
    device: torch.device,
    read: Callable[[], float] = time.perf_counter,
    pings: int = PING_PONGS,
) -> Clock:
    """This rank's offset to the group's first rank (a collective call on every member).

    The first rank answers each other rank's pings in turn with its own time; the peer takes
    the ping whose round trip was shortest and assumes the answer was read half-way through it.
    """
    rank, k = dist.get_rank(group), dist.get_world_size(group)
    if k == 1:
        return Clock(read)
    first = dist.get_global_rank(group, 0) if group is not None else 0
    buf = torch.zeros(1, dtype=torch.float64, device=device)
    best = (math.inf, 0.0)
    for peer in range(1, k):
        peer_global = dist.get_global_rank(group, peer) if group is not None else peer
        for _ in range(pings):
            if rank == 0:
                dist.recv(buf, src=peer_global, group=group)
                synchronize(device)
                buf.fill_(read())
                dist.send(buf, dst=peer_global, group=group)
            elif rank == peer:
                sent = read()
                dist.send(buf, dst=first, group=group)
                dist.recv(buf, src=first, group=group)
                synchronize(device)
                back = read()
                theirs = float(buf.item())
                if back - sent < best[0]:
                    best = (back - sent, theirs - (sent + back) / 2)
    synchronize(device)
    if rank == 0:
        return Clock(read)
    return Clock(read, offset_s=best[1], round_trip_s=best[0])


def timed_steps(
    step: Callable[[], object],
    n: int,
    *,
    device: torch.device,
    group: dist.ProcessGroup | None,
    clock: Clock | None = None,
    between: Callable[[], object] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run ``n`` steps; return each step's time in ms (first start to last end over the
    group's ranks) and its skew in ms (last end - first end: how long the first rank to finish
    waited for the last). ``between`` runs before each step's barrier, untimed (fetching the
    step's data, reading a counter); ``clock`` maps this rank's time onto the group's
    (``common_clock``; the ranks of one host share one clock without it)."""
    clock = clock or Clock()
    starts, ends = [], []
    for _ in range(n):
        if between is not None:
            between()
        synchronize(device)
        dist.barrier(group=group)
        starts.append(clock.now())
        step()
        synchronize(device)
        ends.append(clock.now())
    # One all-reduce for three extremes: max(-start) = -first start, max(end) = last end,
    # max(-end) = -first end.
    start, end = np.array(starts), np.array(ends)
    t = torch.tensor(np.concatenate([-start, end, -end]), dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    t = t.cpu().numpy()
    first_start, last_end, first_end = -t[:n], t[n : 2 * n], -t[2 * n :]
    return (last_end - first_start) * 1e3, (last_end - first_end) * 1e3


@dataclass(frozen=True, kw_only=True)
class TimedStep:
    """One step as the timing runs it: ``step()`` on ``device``, by the ranks of ``group``,
    read on ``clock`` (``common_clock``), ``between()`` run untimed before each step's barrier
    (fetching the step's data, reading a counter)."""

    step: Callable[[], object]
    device: torch.device
    group: dist.ProcessGroup | None
    clock: Clock | None = None
    between: Callable[[], object] | None = None

    def run(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` steps: their times and skews in ms (``timed_steps``)."""
        return timed_steps(
            self.step,
            n,
            device=self.device,
            group=self.group,
            clock=self.clock,
            between=self.between,
        )


@dataclass(frozen=True, kw_only=True)
class Budget:
    """One visit's: at least ``min_steps``; then more until the interval of the median of the
    point's samples (``prior``, its earlier rounds', and these) is within +-``target_pct`` %,
    or ``max_steps`` steps or ``max_s`` seconds of timed steps are spent."""

    min_steps: int
    max_steps: int
    max_s: float
    target_pct: float
    prior: tuple[float, ...] = ()


def adaptive_steps(
    timed: TimedStep,
    budget: Budget,
    on_chunk: Callable[[int, float], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, str]:
    """(step ms, skew ms, why it stopped), as ``timed_steps`` gives them; ``on_chunk(steps so
    far, the interval's half-width in %)`` after each chunk. Every rank decides from the same
    all-reduced times, so they all stop after the same step without another message."""
    times: list[float] = []
    skews: list[float] = []
    prior = list(budget.prior)
    n = budget.min_steps
    while True:
        s, k = timed.run(n)
        times += s.tolist()
        skews += k.tolist()
        width = half_width_pct(prior + times)
        spent = sum(times) / 1e3
        if on_chunk:
            on_chunk(len(times), width)
        if width <= budget.target_pct:
            stop = TARGET
        elif len(times) >= budget.max_steps:
            stop = MAX_STEPS
        elif spent >= budget.max_s:
            stop = MAX_SECONDS
        else:
            # Half again as many steps (so the checks cost little), within what is left.
            per_step = max(float(np.median(times)) / 1e3, 1e-9)
            left = (budget.max_s - spent) / per_step
            left_s = math.ceil(left) if math.isfinite(left) else budget.max_steps
            n = max(1, min(max(5, len(times) // 2), budget.max_steps - len(times), left_s))
            continue
        return np.array(times), np.array(skews), stop


def summarize_times(times: np.ndarray, skew: np.ndarray) -> dict:
    """The figures of the step times (first start to last end); ``skew``: last end - first
    end per step."""
    lo, hi = median_interval(times)
    return {
        "step_ms_median": float(np.median(times)),
        "step_ms_ci_low": lo,
        "step_ms_ci_high": hi,
        "step_ms_min": float(times.min()),
        "step_ms_max": float(times.max()),
        "step_ms_p10": float(np.percentile(times, 10)),
        "step_ms_p90": float(np.percentile(times, 90)),
        # How long the first rank to finish a step waits for the last: straggling, not noise,
        # when it is large.
        "rank_skew_ms": float(np.median(skew)) if len(skew) else float("nan"),
    }
