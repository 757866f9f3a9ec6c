"""A cohort's timed steps: its candidates in cycles (the lifecycle's timing stage for a cohort).

After its warm-up each candidate is timed alone for ``ALONE_STEPS`` steps (the interference the
cycles add is measured against them). Then every cycle times one step of every candidate still
racing, in a fresh seeded random order: a candidate whose comparison with the best is decided
at one of the looks (cycles 8, 16, 32, ...: ``bench.stats.paired``) leaves, and after half the
budget only the best and the default go on (``racing.py``), until none is left or the cohort's
shared steps or seconds are spent. A candidate's cycle i and another's were timed moments
apart, so drift and a neighbour's load fall on both and cancel in their ratio.

Every rank leaves a cycle with the same candidates alive (their failures gathered:
``outcome.agree_on_failures``), and decides to stop from the same all-reduced step times, so
they all stop after the same cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.runner.faults.hangs import point_error
from bench.runner.measure.timing import MAX_SECONDS, MAX_STEPS, TimedStep, common_clock
from bench.runner.session.distenv import DistEnv
from bench.runner.train import racing
from bench.runner.train.candidate import Candidate
from bench.runner.train.outcome import agree_on_failures
from bench.runner.train.row import VisitResult
from bench.stats.paired import interim_look

ALONE_STEPS = 3  # each candidate's step timed alone after its warm-up (the interference)


@dataclass(frozen=True, kw_only=True)
class CycleBudget:
    """The cycles' bounds: at least ``min_cycles`` (``--steps``), at most ``max_cycles``,
    ``max_s`` seconds of timed steps (every candidate's), comparisons decided within
    +-``band_pct`` % counting as ties."""

    min_cycles: int
    max_cycles: int
    max_s: float
    band_pct: float
    seed: int


def time_alone(c: Candidate, env: DistEnv) -> None:
    """The candidate's clock set on its group, and its steps timed alone (``c.alone``)."""
    c.clock = common_clock(c.group, env.device)
    timed = TimedStep(step=c.step, device=env.device, group=c.group, clock=c.clock, between=c.fetch)
    alone, _ = timed.run(ALONE_STEPS)
    c.alone = alone.tolist()


def _one_cycle(env: DistEnv, order: list[Candidate]) -> dict[str, tuple]:
    """One timed step of each candidate in ``order``: candidate id -> (step ms, skew ms).
    A candidate that fails ends the cycle on this rank: a peer still in its collective wakes
    when its group goes (or at its timeout) and leaves the cycle too, so that no rank waits
    in the next candidate's barrier for one that is not coming (and fails it)."""
    timed: dict[str, tuple] = {}
    for c in order:
        try:
            c.fetch()
            s, k = TimedStep(step=c.step, device=env.device, group=c.group, clock=c.clock).run(1)
        except Exception as e:  # noqa: BLE001  (the candidate's error row; the others go on)
            c.error = point_error(e)
        if c.error:
            # out of the handler: its traceback's frames hold the model, and with it the
            # group whose connections must close now, so that peers waiting in it wake
            c.drop()
            break
        timed[c.point.id] = (float(s[0]), float(k[0]))
    return timed


@dataclass
class _Spent:
    """What the cycles have spent: cycles kept, steps and seconds timed, and whether the
    headline's turn (half the budget) has come."""

    cycles: int = 0
    steps: int = 0
    seconds: float = 0.0
    headline: bool = False


def run_cycles(
    ctx, cands: list[Candidate], budget: CycleBudget, progress: Callable[[str], None]
) -> tuple[int, list[VisitResult]]:
    """Cycles over the live candidates still racing (``racing.py``) until every comparison is
    decided or the budget ends: (how many ran, the rows of the candidates that failed in
    them); each candidate's ``stop`` set. A cycle in which a candidate failed is not kept
    (some candidates missed it), so that every candidate's sample i is from cycle i."""
    rng = np.random.default_rng(budget.seed)
    spent, failed = _Spent(), []
    max_steps = budget.max_cycles * len(cands)  # the cohort's, shared as its seconds are
    while True:
        active = [c for c in cands if c.active and not c.error]
        timed = _one_cycle(ctx.env, [active[i] for i in rng.permutation(len(active))])
        lost = agree_on_failures(ctx, active, f"in cycle {spent.cycles + 1}")
        failed += lost
        alive = [c for c in cands if not c.error]
        active = [c for c in active if not c.error]
        if not active:
            racing.finish(alive, MAX_STEPS)
            return spent.cycles, failed
        if lost:
            continue
        for c in active:
            c.times.append(timed[c.point.id][0])
            c.skew.append(timed[c.point.id][1])
        spent.seconds += sum(t for t, _ in timed.values()) / 1e3
        spent.steps, spent.cycles = spent.steps + len(active), spent.cycles + 1
        if _ended(alive, spent, budget, max_steps, progress):
            return spent.cycles, failed


def _ended(
    alive: list[Candidate],
    spent: _Spent,
    budget: CycleBudget,
    max_steps: int,
    progress: Callable[[str], None],
) -> bool:
    """After a kept cycle: the looks, the budget's end and the headline's turn; whether the
    cycles are over (every candidate's ``stop`` then set)."""
    n = spent.cycles
    if interim_look(n) is not None and n >= budget.min_cycles:  # the looks, no others
        left = racing.at_look(alive, n, budget.band_pct)
        still = sum(c.active for c in alive)
        progress(f"{n} cycles, {left} comparison(s) undecided, {still} candidates cycling")
        if not still:
            return True
    over_steps, over_s = spent.steps >= max_steps, spent.seconds >= budget.max_s
    if over_steps or over_s:
        racing.finish(alive, MAX_STEPS if over_steps else MAX_SECONDS)
        return True
    half = racing.HEADLINE_SHARE
    steps_half = spent.steps >= half * max_steps
    if not spent.headline and (steps_half or spent.seconds >= half * budget.max_s):
        spent.headline = True
        racing.headline(alive, n, budget.band_pct, MAX_STEPS if steps_half else MAX_SECONDS)
    return False
