"""Run a training sweep on every rank: loop over the points, write each row as it finishes."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from bench.runfolder import columns
from bench.runfolder.folder import Run, write_meta
from bench.runfolder.points import PointRecord
from bench.runner.faults import watchdog
from bench.runner.faults.hangs import diagnosis
from bench.runner.measure.noise import NoiseFloor
from bench.runner.measure.timing import Budget
from bench.runner.plan.config import RunConfig
from bench.runner.session.context import History, finish_run, start_run
from bench.runner.session.distenv import rank0_print
from bench.runner.train.figures import point_columns
from bench.runner.train.harness import HarnessConfig, LostRanksError, Visit, run_point


def _summary(run: Run) -> str:
    # The reading side's answers, imported once the sweep is done (as the report is).
    from bench.report.answers import console_summary

    return console_summary(run)


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


def visit_budget(config: RunConfig, history: History, rounds_left: int) -> Budget:
    """This visit's share of the point's budget: what is left, split over the rounds left,
    and never less than ``--steps``."""
    c = config
    steps_left = c.max_steps - len(history.times)
    seconds_left = c.max_point_s - sum(history.times) / 1e3
    return Budget(
        min_steps=c.steps,
        max_steps=max(c.steps, steps_left // rounds_left),
        max_s=max(0.0, seconds_left / rounds_left),
        target_pct=c.target_ci_pct,
    )


def _visit(
    ctx, cfg: HarnessConfig, point: PointRecord, r: int, rounds: int, history: History, label: str
) -> None:
    """One visit of ``point`` in round ``r``: run, merge with the point's earlier rounds, write
    the row (its figures pooled over every round so far) and this visit's samples."""
    env = ctx.env
    visit = Visit(
        budget=visit_budget(ctx.config, history, rounds - r + 1),
        round=r,
        prior_times=tuple(history.times),
        prior_skew=tuple(history.skew),
        prior_medians=tuple(history.medians),
        profile=history.row is None,
    )
    t0 = time.perf_counter()

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
    skew = row.pop("skew_ms", None)
    if row["status"] == "ok":
        history.add(row["samples_ms"], skew)
        if history.row is not None:  # not profiled again: the first visit's trace figures
            row = {**history.row, **row}
        history.row = {k: v for k, v in row.items() if k != "samples_ms"}
    watchdog.write_row(lambda: ctx.write(row))
    watchdog.point_done()
    if row["status"] == "ok":
        rank0_print(
            f"{label}: ok, step {row['step_ms_median']:.1f} ms median "
            f"[{row['step_ms_ci_low']:.1f}, {row['step_ms_ci_high']:.1f}] over "
            f"{row['steps']} steps (stop: {row['stop']}), overlap {row['overlap_pct']:.0f} % "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    else:
        rank0_print(f"{label}: error: {row['error']}")
        if row.get("diagnosis"):
            rank0_print(f"{label}: diagnosis: {row['diagnosis']}")


def run_sweep(config: RunConfig, points: list[PointRecord]) -> int:
    ctx = start_run(config, columns.written(columns.TRAINING), points=points)
    env, rounds = ctx.env, config.rounds
    watchdog.install()  # a rank stuck in its own code is interrupted when its point failed
    cfg = HarnessConfig(point_timeout_s=config.point_timeout, clip_grad_norm=config.clip_grad_norm)
    orders = round_orders(points, rounds, config.seed)
    if env.is_main:
        ctx.meta["round_orders"] = [[p.id for p in order] for order in orders]
        write_meta(ctx.run_dir / "meta.json", ctx.meta)
    rank0_print(
        f"sweep {config.sweep}: {len(points)} points x {rounds} round(s), world size "
        f"{env.world_size}, {env.backend} on {env.device.type}, results in {ctx.run_dir}"
    )
    floor = NoiseFloor(env)
    gap = ctx.gaps_done
    for r, order in enumerate(orders, 1):
        after = ""
        for i, point in enumerate(order, 1):
            label = f"[round {r}/{rounds} {i}/{len(order)}] {point.id}"
            if (point.id, r) in ctx.skip:
                rank0_print(f"{label}: already done, skipped (--resume)")
                continue
            gap += 1
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
            history = ctx.history.setdefault(point.id, History())
            _visit(ctx, cfg, point, r, rounds, history, label)
            after = point.id
    return finish_run(ctx, _summary)
