"""Run a training sweep on every rank: loop over the points, write each row as it finishes."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch.distributed as dist

from bench.console import human_duration
from bench.runfolder import columns
from bench.runfolder.folder import write_meta
from bench.runfolder.points import PointRecord
from bench.runfolder.schema import Run
from bench.runner.configure.config import RunConfig
from bench.runner.faults import watchdog
from bench.runner.faults.hangs import diagnosis
from bench.runner.measure.noise import NoiseFloor
from bench.runner.measure.timing import Budget
from bench.runner.session.context import History, finish_run, start_run
from bench.runner.session.distenv import rank0_print
from bench.runner.train.cohort import free_bytes, split_cohorts
from bench.runner.train.eta import SweepClock
from bench.runner.train.figures import point_columns
from bench.runner.train.harness import HarnessConfig, LostRanksError, Visit, run_point
from bench.runner.train.interleave import CycleBudget, run_cohort


def _summary(run: Run) -> str:
    # The reading side's answers, imported once the sweep is done (as the report is).
    from bench.report.answers import close_training_run

    return close_training_run(run)  # verdicts.csv written, and the console's closing text


def lost_ranks(ctx, point: PointRecord, e: LostRanksError) -> None:
    """A rank or node is gone: record the point as failed, say so, and end this rank now
    (its process group cannot be torn down cleanly without the lost peers)."""
    why = watchdog.terminated()  # a peer that left with its launcher: say that, not the symptom
    error = f"{why}; {e}" if why else str(e)
    row = {**point_columns(point), "status": "error", "error": error, **diagnosis(e.hangs)}
    if ctx.env.is_main:
        watchdog.write_row(lambda: ctx.write(row))
    watchdog.IN_POINT.clear()
    print(f"error: {e}", file=sys.stderr, flush=True)
    if row.get("diagnosis"):
        print(f"diagnosis: {row['diagnosis']}", file=sys.stderr, flush=True)
    os._exit(1)


def round_orders(points: list[PointRecord], rounds: int, seed: int) -> list[list[PointRecord]]:
    """The points of each round. One round keeps the declared order (implementations
    interleaved value by value); with more, each round is a new seeded random order, so that
    drift during a round falls on different points each time (pyperf's and torch.utils.
    benchmark's practice of interleaving what is compared)."""
    if rounds == 1:
        return [list(points)]
    rng = np.random.default_rng(seed)
    return [[points[i] for i in rng.permutation(len(points))] for _ in range(rounds)]


def visit_budget(
    config: RunConfig, history: History, rounds_left: int, cap_s: float | None = None
) -> Budget:
    """This visit's share of the point's budget: what is left, split over the rounds left,
    and never less than ``--steps``; ``cap_s``: the sweep's budget's share (``eta``)."""
    c = config
    steps_left = c.max_steps - len(history.times)
    seconds_left = max(0.0, (c.max_point_s - sum(history.times) / 1e3) / rounds_left)
    return Budget(
        min_steps=c.steps,
        max_steps=max(c.steps, steps_left // rounds_left),
        max_s=seconds_left if cap_s is None else min(seconds_left, cap_s),
        target_pct=c.target_ci_pct,
    )


def _visit(
    ctx, cfg: HarnessConfig, point: PointRecord, visit: Visit, history: History, label: str
) -> tuple[dict, float]:
    """One visit of ``point``: run, merge with the point's earlier rounds (``history``), write
    the row (its figures pooled over every round so far) and this visit's samples; the row
    and the seconds its timed steps took."""
    env, r = ctx.env, visit.round

    def lost(why: str) -> None:  # the rank must leave before the point ends (its launcher lost)
        ctx.write({**point_columns(point), "round": r, "status": "error", "error": why})

    watchdog.point_started(lost if env.is_main else None)
    try:
        row = run_point(
            point,
            env,
            cfg,
            ctx.run_dir / "traces" / point.id,
            visit=visit,
            progress=lambda msg: rank0_print(f"{label}: {msg}"),
        )
    except LostRanksError as e:
        lost_ranks(ctx, point, e)
    row["round"] = r
    row["method"] = "rounds"
    skew = row.pop("skew_ms", None)
    if row["status"] == "ok":
        history.add(row["samples_ms"], skew)
        if history.row is not None:  # not profiled again: the first visit's trace figures
            row = {**history.row, **row}
        history.row = {k: v for k, v in row.items() if k != "samples_ms"}
    timed_s = sum(row.get("samples_ms") or ()) / 1e3  # before the write takes the samples
    watchdog.write_row(lambda: ctx.write(row))
    watchdog.point_done()
    return row, timed_s


def _say(label: str, row: dict, seconds: float, left: float | None) -> None:
    """The visit's line: its step time and interval, and how long the sweep has left."""
    if row["status"] != "ok":
        rank0_print(f"{label}: error: {row['error']}")
        if row.get("diagnosis"):
            rank0_print(f"{label}: diagnosis: {row['diagnosis']}")
        return
    eta = f", about {human_duration(left)} left" if left else ""
    rank0_print(
        f"{label}: ok, step {row['step_ms_median']:.1f} ms median "
        f"[{row['step_ms_ci_low']:.1f}, {row['step_ms_ci_high']:.1f}] over "
        f"{row['steps']} steps (stop: {row['stop']}), overlap {row['overlap_pct']:.0f} % "
        f"({seconds:.1f} s{eta})"
    )


def _agreed(ctx, clock: SweepClock, point: PointRecord, r: int) -> tuple[bool, float | None]:
    """Rank 0's decision for this visit under the budget (whether it runs, its timed seconds'
    cap), the same on every rank: the ranks' clocks differ, their steps' budgets must not."""
    decision = [(clock.fits(point.id, r), clock.timed_cap(point.id, r))]
    if clock.budget_s is not None:
        dist.broadcast_object_list(decision, group_src=0)
    return decision[0]


def _noise_gap(ctx, floor: NoiseFloor, point: PointRecord, gap: int, r: int, after: str) -> None:
    """The noise floor timed in the gap before a visit (a peer gone here is a lost rank)."""
    try:
        ctx.write_noise({"gap": gap, "round": r, "after": after, **floor.measure()})
    except Exception as e:  # noqa: BLE001  (a peer gone between points: say so)
        lost_ranks(
            ctx,
            point,
            LostRanksError(
                f"point {point.id}: lost contact with the other ranks before the point, "
                f"timing the noise floor ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:300]})"
            ),
        )


def _not_run(ctx, clock: SweepClock, point: PointRecord, r: int, label: str) -> None:
    clock.visits.remove((point.id, r))
    rank0_print(f"{label}: not run: the budget ({human_duration(clock.budget_s)}) is spent")
    if ctx.env.is_main:
        ctx.meta.setdefault("visits_not_run", []).append([point.id, r])


def _plan(ctx, config: RunConfig, points: list[PointRecord]):
    """Rank 0's split into interleaved cohorts and points for rounds, the same on every rank
    (the ranks' free memory differs; their plan must not)."""
    env = ctx.env
    plan = [None]
    if env.is_main:
        cohorts, rest, note = split_cohorts(points, config, env, free_bytes(env.device))
        plan = [([[p.id for p in c] for c in cohorts], note)]
    dist.broadcast_object_list(plan, group_src=0)
    ids, note = plan[0]
    by_id = {p.id: p for p in points}
    # a cohort resumed with one candidate left is timed in rounds (nothing to pair it with);
    # its finished candidates are done
    live = [[by_id[i] for i in c if (i, 1) not in ctx.skip] for c in ids]
    lone = [c[0] for c in live if len(c) == 1]
    together = {i for c in ids for i in c}
    rest = [p for p in points if p.id not in together] + lone
    return [c for c in live if len(c) > 1], rest, note


def cohort_seconds(n: int, max_point_s: float, unspent: float, caps: list) -> float:
    """A cohort's seconds of timed steps: ``max_point_s`` per candidate and what the cohorts
    before it left unspent (quick steps end on their step count first: slower ones get their
    seconds, and the sweep's timed seconds stay within its candidates' sum), within the
    ``--budget``'s caps where it has them."""
    max_s = n * max_point_s + unspent
    if caps and all(cap is not None for cap in caps):
        max_s = min(max_s, sum(caps))
    return max_s


def unspent_seconds(max_s: float, rows: list[dict]) -> float:
    """What a cohort given ``max_s`` seconds left of them: its rows' timed samples (the same
    on every rank: the steps' times are agreed) subtracted."""
    return max(0.0, max_s - sum(sum(r.get("samples_ms") or ()) for r in rows) / 1e3)


def _run_cohorts(ctx, cfg: HarnessConfig, cohorts, clock: SweepClock) -> None:
    """Each cohort's candidates interleaved in cycles, their rows written as they finish."""
    config = ctx.config
    unspent = 0.0  # seconds an earlier cohort left when its steps ran out first
    for i, cohort in enumerate(cohorts, 1):
        label = f"[interleaved {i}/{len(cohorts)}] {cohort[0].model}"
        caps = [_agreed(ctx, clock, p, 1)[1] for p in cohort]
        max_s = cohort_seconds(len(cohort), config.max_point_s, unspent, caps)
        if unspent:
            rank0_print(
                f"{label}: {max_s:.0f} s of timed steps, {unspent:.0f} s of them unspent "
                "by the cohorts before"
            )
        budget = CycleBudget(
            min_cycles=config.steps,
            max_cycles=config.max_steps,
            max_s=max_s,
            band_pct=config.tie_band_pct,
            seed=config.seed + i,
        )
        t0 = time.perf_counter()
        name = f"{ctx.meta.get('start_time', '')}/{i}"  # this launch's cohort i (a resume's differ)
        try:
            rows = run_cohort(
                ctx, cfg, cohort, budget, lambda m, a=label: rank0_print(f"{a}: {m}"), cohort=name
            )
        except LostRanksError as e:
            lost_ranks(ctx, cohort[0], e)
        seconds = (time.perf_counter() - t0) / len(cohort)
        unspent = unspent_seconds(max_s, rows)
        for p in cohorts[i] if i < len(cohorts) else ():  # the forecast knows who gets them
            clock.timed_bound[p.id] += unspent / len(cohorts[i])
        for row in rows:
            timed_s = sum(row.get("samples_ms") or ()) / 1e3
            clock.done(row["point"], 1, seconds, timed_s)
            _say(f"{label} {row['point']}", row, seconds, clock.left())
        if i == 1 and len(clock.visits) > len(clock.spent):
            rank0_print(_forecast(clock, config.budget_s))


def run_sweep(config: RunConfig, points: list[PointRecord]) -> int:
    ctx = start_run(config, columns.written(columns.TRAINING), points=points)
    env, rounds = ctx.env, config.rounds
    watchdog.install()  # a rank stuck in its own code is interrupted when its point failed
    cfg = HarnessConfig(point_timeout_s=config.point_timeout, clip_grad_norm=config.clip_grad_norm)
    cohorts, points, note = _plan(ctx, config, points)
    orders = round_orders(points, rounds, config.seed)
    if env.is_main:
        ctx.meta["round_orders"] = [[p.id for p in order] for order in orders]
        ctx.meta["interleaved"] = [[p.id for p in c] for c in cohorts]
        ctx.meta["budget_s"] = config.budget_s
        write_meta(ctx.run_dir / "meta.json", ctx.meta)
    todo = [(p.id, 1) for c in cohorts for p in c]
    todo += [(p.id, r) for r, o in enumerate(orders, 1) for p in o if (p.id, r) not in ctx.skip]
    clock = SweepClock(visits=todo, budget_s=config.budget_s)
    clock.timed_bound = {p.id: config.max_point_s for c in cohorts for p in c}
    together = f"{sum(map(len, cohorts))} points interleaved in {len(cohorts)} cohort(s), "
    rank0_print(
        f"sweep {config.sweep}: {together if cohorts else ''}{len(points)} points x {rounds} "
        f"round(s), world size {env.world_size}, {env.backend} on {env.device.type}, results "
        f"in {ctx.run_dir}"
    )
    if note:
        rank0_print(note)
    _run_cohorts(ctx, cfg, cohorts, clock)
    floor = NoiseFloor(env)
    gap = ctx.gaps_done
    for r, order in enumerate(orders, 1):
        after = ""
        for i, point in enumerate(order, 1):
            label = f"[round {r}/{rounds} {i}/{len(order)}] {point.id}"
            if (point.id, r) in ctx.skip:
                rank0_print(f"{label}: already done, skipped (--resume)")
                continue
            go, cap = _agreed(ctx, clock, point, r)
            if not go:
                _not_run(ctx, clock, point, r, label)
                continue
            t0, gap = time.perf_counter(), gap + 1
            _noise_gap(ctx, floor, point, gap, r, after)
            history = ctx.history.setdefault(point.id, History())
            visit = Visit(
                budget=visit_budget(config, history, rounds - r + 1, cap),
                round=r,
                prior_times=tuple(history.times),
                prior_skew=tuple(history.skew),
                prior_medians=tuple(history.medians),
                profile=history.row is None,
            )
            row, timed_s = _visit(ctx, cfg, point, visit, history, label)
            seconds = time.perf_counter() - t0
            clock.done(point.id, r, seconds, timed_s)
            _say(label, row, seconds, clock.left())
            if len(clock.spent) == 1 and len(clock.visits) > 1:
                rank0_print(_forecast(clock, config.budget_s))
            after = point.id
    return finish_run(ctx, _summary)


def _forecast(clock: SweepClock, budget_s: float | None) -> str:
    """Said once, after the first visit: how long the whole sweep should take."""
    total = clock.elapsed() + (clock.left() or 0.0)
    text = f"sweep: about {human_duration(total)} in all ({len(clock.visits)} visits"
    text += f", the first {human_duration(clock.elapsed())}, tracing included)"
    if budget_s is not None and total > budget_s:
        text += (
            f"; the budget, {human_duration(budget_s)}, drops the later rounds' visits that "
            "no longer fit"
        )
    return text
