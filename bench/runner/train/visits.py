"""A training sweep's visits, decided before the first one runs: the cohorts whose candidates
are timed together (interleaved, ``cohort.py``), each round's points in its own order, and the
visits a resumed run has done already.

One round keeps the declared order (implementations interleaved value by value); with more,
each round is a new seeded random order, so that drift during a round falls on different points
each time (pyperf's and torch.utils.benchmark's practice of interleaving what is compared).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch.distributed as dist

from bench.runfolder.points import PointRecord
from bench.runner.configure.config import RunConfig
from bench.runner.train.cohort import free_bytes, split_cohorts


@dataclass(frozen=True)
class CohortVisit:
    """A cohort's one visit: its candidates, its number (from 1: its cycles' seed is the
    sweep's plus it), and the console's label."""

    number: int
    points: tuple[PointRecord, ...]
    label: str


@dataclass(frozen=True)
class RoundVisit:
    """A point's visit in one round: its round, the rounds from this one to the last (the
    point's budget is shared over them), the console's label, and whether a run before this
    one (``--resume``) made it already."""

    point: PointRecord
    round: int
    rounds_left: int
    label: str
    done: bool


@dataclass(frozen=True)
class Schedule:
    """Every visit of a sweep: the cohorts first, then the rounds, each in its order."""

    cohorts: tuple[CohortVisit, ...]
    rounds: tuple[tuple[RoundVisit, ...], ...]
    note: str | None  # why ``--interleave auto`` ran some cohorts in rounds, printed once

    def cohort_ids(self) -> list[list[str]]:
        return [[p.id for p in c.points] for c in self.cohorts]

    def round_orders(self) -> list[list[str]]:
        return [[v.point.id for v in visits] for visits in self.rounds]

    def to_do(self) -> list[tuple[str, int]]:
        """(point id, round) of the visits to make: every cohort's candidates (round 1), then
        each round's visits not made already."""
        todo = [(p, 1) for c in self.cohort_ids() for p in c]
        return todo + [(v.point.id, v.round) for r in self.rounds for v in r if not v.done]

    def opening(self) -> str:
        """What the sweep's first line says of its visits."""
        n = len(self.rounds[0]) if self.rounds else 0
        interleaved = ""
        if self.cohorts:
            total = sum(len(c.points) for c in self.cohorts)
            interleaved = f"{total} points interleaved in {len(self.cohorts)} cohort(s), "
        return f"{interleaved}{n} points x {len(self.rounds)} round(s)"


def round_orders(points: list[PointRecord], rounds: int, seed: int) -> list[list[PointRecord]]:
    """The points of each round: the declared order for one round, else a seeded random order
    per round."""
    if rounds == 1:
        return [list(points)]
    rng = np.random.default_rng(seed)
    return [[points[i] for i in rng.permutation(len(points))] for _ in range(rounds)]


def _cohorts_and_rest(ctx, config: RunConfig, points: list[PointRecord]):
    """Rank 0's split into interleaved cohorts and points for rounds, the same on every rank
    (the ranks' free memory differs; their plan must not): (cohorts, points for rounds, note).
    A cohort resumed with one candidate left is timed in rounds (nothing to pair it with); its
    finished candidates are done."""
    env = ctx.env
    plan = [None]
    if env.is_main:
        cohorts, _, note = split_cohorts(points, config, env, free_bytes(env.device))
        plan = [([[p.id for p in c] for c in cohorts], note)]
    dist.broadcast_object_list(plan, group_src=0)
    ids, note = plan[0]
    by_id = {p.id: p for p in points}
    live = [[by_id[i] for i in c if (i, 1) not in ctx.skip] for c in ids]
    single = [c[0] for c in live if len(c) == 1]
    interleaved = {i for c in ids for i in c}
    rest = [p for p in points if p.id not in interleaved] + single
    return [c for c in live if len(c) > 1], rest, note


def plan_visits(ctx, config: RunConfig, points: list[PointRecord]) -> Schedule:
    """The sweep's visits on every rank (``ctx``: the run, its ranks and its resumed visits)."""
    cohorts, rest, note = _cohorts_and_rest(ctx, config, points)
    orders = round_orders(rest, config.rounds, config.seed)
    rounds = config.rounds
    return Schedule(
        cohorts=tuple(
            CohortVisit(i, tuple(c), f"[interleaved {i}/{len(cohorts)}] {c[0].model}")
            for i, c in enumerate(cohorts, 1)
        ),
        rounds=tuple(
            tuple(
                RoundVisit(
                    point=p,
                    round=r,
                    rounds_left=rounds - r + 1,
                    label=f"[round {r}/{rounds} {i}/{len(order)}] {p.id}",
                    done=(p.id, r) in ctx.skip,
                )
                for i, p in enumerate(order, 1)
            )
            for r, order in enumerate(orders, 1)
        ),
        note=note,
    )
