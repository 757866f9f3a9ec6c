"""Run a training sweep on every rank: its visits planned first (``visits.py``), then each one
run through the point's lifecycle (``lifecycle.py``), its row written as it finishes."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import torch.distributed as dist

from bench.console import human_duration
from bench.runfolder.folder import write_meta
from bench.runfolder.points import PointRecord
from bench.runfolder.schema import Run
from bench.runner.configure.config import RunConfig
from bench.runner.faults import watchdog
from bench.runner.faults.hangs import diagnosis
from bench.runner.measure.collector import for_the_run
from bench.runner.measure.noise import NoiseFloor
from bench.runner.measure.timing import Budget
from bench.runner.session.context import History, RunContext, finish_run, start_run
from bench.runner.session.distenv import rank0_print
from bench.runner.train.candidate import Visit
from bench.runner.train.cycles import CycleBudget
from bench.runner.train.eta import Allowance, SweepClock
from bench.runner.train.lifecycle import Cohort, PointSettings, run_cohort, run_point
from bench.runner.train.outcome import LostRanksError, first_line
from bench.runner.train.row import Row, VisitResult
from bench.runner.train.visits import CohortVisit, RoundVisit, Schedule, plan_visits


def _summary(run: Run) -> str:
    # The reading side's answers, imported once the sweep is done (as the report is).
    from bench.report.answers import close_training_run

    return close_training_run(run)  # verdicts.csv written, and the console's closing text


def lost_ranks(ctx: RunContext, point: PointRecord, e: LostRanksError) -> None:
    """A rank or node is gone: record the point as failed, report it, and end this rank now
    (its process group cannot be torn down cleanly without the lost peers)."""
    why = watchdog.terminated()  # a peer that left with its launcher: report that, not the symptom
    error = f"{why}; {e}" if why else str(e)
    row = Row.of(point, status="error", error=error, **diagnosis(e.hangs))
    if ctx.env.is_main:
        watchdog.write_row(lambda: ctx.write(row.cells()))
    # Said while the point still defers SIGTERM: the launcher stops the survivors the moment
    # a lost rank's exit reaches it, and would cut these lines off.
    print(f"error: {e}", file=sys.stderr, flush=True)
    if row.diagnosis:
        print(f"diagnosis: {row.diagnosis}", file=sys.stderr, flush=True)
    watchdog.IN_POINT.clear()
    os._exit(1)


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
        prior=tuple(history.times),
    )


def visit_lines(label: str, row: Row, seconds: float, left: float | None) -> list[str]:
    """The console's lines for a visit: its step time and interval and how long the sweep has
    left, or its error and diagnosis."""
    if row.status != "ok":
        lines = [f"{label}: error: {row.error}"]
        return lines + ([f"{label}: diagnosis: {row.diagnosis}"] if row.diagnosis else [])
    eta = f", about {human_duration(left)} left" if left else ""
    return [
        f"{label}: ok, step {row.step_ms_median:.1f} ms median "
        f"[{row.step_ms_ci_low:.1f}, {row.step_ms_ci_high:.1f}] over "
        f"{row.steps} steps (stop: {row.stop}), overlap {row.overlap_pct:.0f} % "
        f"({seconds:.1f} s{eta})"
    ]


@dataclass
class SweepRun:
    """A sweep under way on this rank: its run, how its points run, its clock and the noise
    floor's gaps (timed before each visit in rounds; a resumed run's numbering goes on)."""

    ctx: RunContext
    settings: PointSettings
    clock: SweepClock
    gaps: int = 0
    floor: NoiseFloor | None = None

    def from_rank0(self, value):
        """Rank 0's ``value`` on every rank where the budget makes the ranks' differ: their
        clocks differ, their steps' budgets must not."""
        if self.clock.budget_s is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, group_src=0)
        return box[0]

    def cohort(self, cohort: CohortVisit) -> None:
        """A cohort's candidates interleaved in cycles, their rows written as they finish."""
        config, clock, i = self.ctx.config, self.clock, cohort.number - 1
        max_s = self.from_rank0(clock.cohort_seconds(i))
        if clock.unspent:
            rank0_print(
                f"{cohort.label}: {max_s:.0f} s of timed steps, {clock.unspent:.0f} s of them "
                "unspent by the cohorts before"
            )
        budget = CycleBudget(
            min_cycles=config.steps,
            max_cycles=config.max_steps,
            max_s=max_s,
            band_pct=config.tie_band_pct,
            seed=config.seed + cohort.number,
        )
        # this launch's cohort i (a resume's differ)
        name = f"{self.ctx.meta.get('start_time', '')}/{cohort.number}"
        t0 = time.perf_counter()
        try:
            results = run_cohort(
                self.ctx,
                self.settings,
                Cohort(points=cohort.points, name=name),
                budget,
                lambda m: rank0_print(f"{cohort.label}: {m}"),
            )
        except LostRanksError as e:
            lost_ranks(self.ctx, cohort.points[0], e)
        seconds = (time.perf_counter() - t0) / len(cohort.points)
        clock.cohort_done(i, max_s, sum(r.timed_s for r in results))
        for r in results:
            clock.done(r.row.point, 1, seconds, r.timed_s)
            for line in visit_lines(f"{cohort.label} {r.row.point}", r.row, seconds, clock.left()):
                rank0_print(line)
        self._forecast()

    def visit(self, v: RoundVisit, after: str) -> bool:
        """A point's visit in a round, unless resumed past it or over the budget: whether it
        ran. ``after``: the point visited before it in this round (noise.csv's)."""
        if v.done:
            rank0_print(f"{v.label}: already done, skipped (--resume)")
            return False
        allowed: Allowance = self.from_rank0(self.clock.allowance(v.point.id, v.round))
        if not allowed.runs:
            self._not_run(v)
            return False
        t0 = time.perf_counter()
        self._noise_gap(v, after)
        history = self.ctx.history.setdefault(v.point.id, History())
        visit = Visit(
            budget=visit_budget(self.ctx.config, history, v.rounds_left, allowed.timed_cap_s),
            round=v.round,
            prior_times=tuple(history.times),
            prior_skew=tuple(history.skew),
            prior_medians=tuple(history.medians),
            profile=history.row is None,
        )
        row, timed_s = self._run_point(v, visit, history)
        seconds = time.perf_counter() - t0
        self.clock.done(v.point.id, v.round, seconds, timed_s)
        for line in visit_lines(v.label, row, seconds, self.clock.left()):
            rank0_print(line)
        self._forecast()
        return True

    def _run_point(self, v: RoundVisit, visit: Visit, history: History) -> tuple[Row, float]:
        """The visit run, its row carrying the first visit's traced figures and written with
        its samples, and the point's history grown by them: the row and its timed seconds."""
        ctx, point = self.ctx, v.point

        def lost(why: str) -> None:  # the rank must leave before the point ends (launcher lost)
            ctx.write(Row.of(point, round=v.round, status="error", error=why).cells())

        watchdog.point_started(lost if ctx.env.is_main else None)
        try:
            result = run_point(
                point,
                ctx.env,
                self.settings,
                ctx.run_dir / "traces" / point.id,
                visit=visit,
                progress=lambda msg: rank0_print(f"{v.label}: {msg}"),
            )
        except LostRanksError as e:
            lost_ranks(ctx, point, e)
        row = result.row
        if row.status == "ok":
            history.add(list(result.samples_ms), list(result.skew_ms))
            if history.row is not None:  # not profiled again: the first visit's figures
                row = row.filled_from(history.row)
            history.row = row.cells()
        written = VisitResult(row, result.samples_ms)
        watchdog.write_row(lambda: ctx.write(written.as_dict()))
        watchdog.point_done()
        return row, result.timed_s

    def _noise_gap(self, v: RoundVisit, after: str) -> None:
        """The noise floor timed in the gap before a visit (a peer gone here is a lost rank)."""
        self.gaps += 1
        try:
            self.ctx.write_noise(
                {"gap": self.gaps, "round": v.round, "after": after, **self.floor.measure()}
            )
        except Exception as e:  # noqa: BLE001  (a peer gone between points: report it)
            lost_ranks(
                self.ctx,
                v.point,
                LostRanksError(
                    f"point {v.point.id}: lost contact with the other ranks before the point, "
                    f"timing the noise floor ({first_line(e)})"
                ),
            )

    def _not_run(self, v: RoundVisit) -> None:
        self.clock.not_run(v.point.id, v.round)
        rank0_print(
            f"{v.label}: not run: the budget ({human_duration(self.clock.budget_s)}) is spent"
        )
        if self.ctx.env.is_main:
            self.ctx.meta.setdefault("visits_not_run", []).append([v.point.id, v.round])

    def _forecast(self) -> None:
        text = self.clock.forecast()
        if text:
            rank0_print(text)


def _record_schedule(ctx: RunContext, schedule: Schedule) -> None:
    """meta.json: each round's order, the cohorts, the budget."""
    if ctx.env.is_main:
        ctx.meta["round_orders"] = schedule.round_orders()
        ctx.meta["interleaved"] = schedule.cohort_ids()
        ctx.meta["budget_s"] = ctx.config.budget
        write_meta(ctx.run_dir / "meta.json", ctx.meta)


def run_sweep(config: RunConfig, points: list[PointRecord]) -> int:
    ctx = start_run(config, Row.columns(), points=points)
    env = ctx.env
    watchdog.install()  # a rank stuck in its own code is interrupted when its point failed
    settings = PointSettings(
        point_timeout_s=config.point_timeout, clip_grad_norm=config.clip_grad_norm
    )
    schedule = plan_visits(ctx, config, points)
    _record_schedule(ctx, schedule)
    clock = SweepClock(
        visits=schedule.to_do(),
        budget_s=config.budget,
        cohorts=schedule.cohort_ids(),
        max_point_s=config.max_point_s,
    )
    rank0_print(
        f"sweep {config.sweep}: {schedule.opening()}, world size {env.world_size}, "
        f"{env.backend} on {env.device.type}, results in {ctx.run_dir}"
    )
    if schedule.note:
        rank0_print(schedule.note)
    sweep = SweepRun(ctx, settings, clock, gaps=ctx.gaps_done)
    with for_the_run():  # each point's collection walks what the points before it left
        for cohort in schedule.cohorts:
            sweep.cohort(cohort)
        sweep.floor = NoiseFloor(env)
        for visits in schedule.rounds:
            after = ""  # the noise floor's gap before a round's first visit follows no point
            for v in visits:
                if sweep.visit(v, after):
                    after = v.point.id
    return finish_run(ctx, _summary)
