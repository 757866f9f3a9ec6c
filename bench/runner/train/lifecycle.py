"""A training point's lifecycle, from its record to its row of results.csv.

Every training point runs through the same stages, on every rank of the job:

1. group: a process group of its own, with a short timeout (``outcome.new_point_group``);
2. build: its model, wrapped by its implementation, with its optimiser and data (``build``);
3. warm-up: untimed steps, a first visit's first step checked against the plain model, and a
   compiled step's compilation timed (``warm_up``);
4. timed steps: a point alone, in chunks until its median's interval is tight or its budget is
   spent (``time_steps``); a cohort's candidates in cycles, one step each in a fresh order
   (``cycles.py``);
5. profile: on a first visit, a few traced steps, their breakdown and MFU waterfall
   (``profile``);
6. figures: the replicas checked to agree, the timed figures, the FLOPs (``figures``);
7. memory: on a first visit, its memory on a build of its own, its trainer released first
   (``memory``);
8. row: the ranks' outcomes gathered, their figures aggregated, or a failure's root cause
   (``outcome.point_row``).

A round's visit is a cohort of one (``run_point``): the same stages, timed alone. With nothing
beside it, its stages run under one watch (``faults/hangs.run_watched``) and its ranks agree
on its outcome once, at its end. A cohort's candidates live side by side (``run_cohort``), so
each stage is watched on its own and the ranks agree after it: a candidate that fails is its
error row, and the others go on.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch.distributed as dist

from bench.analysis import breakdown as analysis
from bench.runfolder.points import PointRecord
from bench.runner.faults import watchdog
from bench.runner.faults.hangs import hang_dir, run_watched
from bench.runner.measure import flops
from bench.runner.measure.collector import settled
from bench.runner.measure.nvml import NvmlSampler
from bench.runner.measure.peak_memory import point_memory
from bench.runner.measure.pipeline_columns import layout_of, pipeline_columns, pipelines
from bench.runner.measure.profiling import profile_steps, reset_peak_rss
from bench.runner.measure.timing import Budget, TimedStep, adaptive_steps, common_clock
from bench.runner.measure.waterfall_columns import waterfall_columns
from bench.runner.session.distenv import DistEnv, synchronize
from bench.runner.train import plain_check, plain_compare
from bench.runner.train.candidate import PAIRED, Candidate, Visit
from bench.runner.train.cycles import ALONE_STEPS, CycleBudget, run_cycles, time_alone
from bench.runner.train.figures import Timed, visit_figures
from bench.runner.train.outcome import (
    LostRanksError,
    Outcome,
    agree_on_failures,
    first_line,
    gather,
    lost_in_cohort,
    new_point_group,
    point_row,
    write_row,
)
from bench.runner.train.replicas import check_replicas_agree
from bench.runner.train.row import Row, VisitResult
from bench.runner.train.step import LR, Recipe, build_trainer
from parallel_kernels.compiling import compiled_frames, compiles
from parallel_kernels.strategies import STRATEGIES

PROGRESS_S = 10.0  # a long visit says how far it is at most this often


@dataclass(frozen=True, kw_only=True)
class PointSettings:
    """How every point is run, beyond what its record says (steps and batch are the
    record's)."""

    profile_wait: int = 1
    profile_warmup: int = 1
    lr: float = LR
    seed: int = 0
    point_timeout_s: float = 120.0
    clip_grad_norm: float | None = None  # clip the gradient's global norm before each step

    @property
    def recipe(self) -> Recipe:
        """How each point's trainer is made."""
        return Recipe(seed=self.seed, lr=self.lr, clip=self.clip_grad_norm)


# -- the stages, one rank's part ------------------------------------------------------------
def build(c: Candidate, env: DistEnv, settings: PointSettings) -> None:
    """Build: the point's trainer, after MFU's peak is timed (before the model holds memory)."""
    gc.collect()  # earlier points' modules hold reference cycles (hooks): free them first
    c.peak = flops.point_peaks(c.point, env.device)
    reset_peak_rss()
    c.trainer = build_trainer(c.point, env, c.group, settings.recipe)


def warm_up(c: Candidate, env: DistEnv, settings: PointSettings) -> None:
    """Warm-up: the untimed steps, a first visit's first step checked against the plain model
    (``plain_check``). ``c.checked``: what was checked, or None on a later visit (its row
    carries the first visit's, as it does the traced figures)."""
    replicated = STRATEGIES[c.point.strategy].replicated
    checked = None  # the candidate's once every warm-up step is done
    step_s = []
    for i in range(c.point.warmup_steps):
        t0 = time.perf_counter()
        c.step()
        synchronize(env.device)
        step_s.append(time.perf_counter() - t0)
        if i == 0 and c.visit.profile:
            checked = plain_check.run(
                c.trainer,
                env,
                c.group,
                settings.recipe,
                replicas=lambda: check_replicas_agree(replicated(c.trainer.wrapped), c.group),
            )
            gc.collect()  # the plain model and the gathered copy go before anything is measured
            reset_peak_rss()  # the peak of the timed steps, not of the extra plain step
    if checked is None and c.visit.profile:
        checked = plain_compare.tolerance_for(c.point)  # no warm-up step: it says why
    c.checked = checked
    if c.visit.profile and compiles(c.point.knobs) and len(step_s) > 1:
        c.compile_s = max(0.0, step_s[0] - step_s[-1])
    c.compiled_at = compiled_frames()


def compile_figures(c: Candidate) -> dict:
    """``compile_seconds`` of a compiled point's first visit, and a note in its ``error`` where
    dynamo compiled anything while its steps were timed (``c.recompiled``: how many; those
    steps' times hold the compilation)."""
    if not compiles(c.point.knobs):
        return {}
    out = {} if c.compile_s is None else {"compile_seconds": c.compile_s}
    if c.recompiled:
        out["error"] = (
            f"warning: dynamo compiled {c.recompiled} frame(s) during the timed steps (a "
            "recompilation): their times include it"
        )
    return out


def time_steps(c: Candidate, env: DistEnv, progress: Callable[[str], None]) -> Timed:
    """Timed steps, a point alone: chunks until its budget says stop (``adaptive_steps``),
    each step's data fetched and NVML read between them, untimed."""
    c.clock = common_clock(c.group, env.device)  # once per visit: each has its own group
    nvml = NvmlSampler(env.device)

    def between() -> None:
        c.fetch()
        nvml.sample()

    timed = TimedStep(step=c.step, device=env.device, group=c.group, clock=c.clock, between=between)
    times, skew, stop = adaptive_steps(
        timed,
        c.visit.budget,
        on_chunk=_at_most_every(
            PROGRESS_S, lambda n, w: progress(f"{n} timed steps, median +-{w:.1f} %")
        ),
    )
    c.recompiled = compiled_frames() - c.compiled_at
    return Timed(times, skew, stop, float(np.median(c.data_ms)), nvml.mean_pct)


def profile(c: Candidate, env: DistEnv, settings: PointSettings, times: np.ndarray) -> dict:
    """Profile: the traced steps, analysed (the breakdown, the MFU waterfall, a pipeline's
    bubble), and what tracing adds to a step against ``times``, the untraced steps on this
    rank."""
    n_traced = settings.profile_wait + settings.profile_warmup + c.point.profile_steps
    inputs = [c.trainer.next_inputs() for _ in range(n_traced)]  # no data loading traced
    trace_path, traced_ms = profile_steps(
        lambda: c.step(inputs.pop(0)),
        trace_dir=c.trace_dir,
        worker_name=f"rank{env.rank}",
        device=env.device,
        wait=settings.profile_wait,
        warmup=settings.profile_warmup,
        active=c.point.profile_steps,
    )
    trace = analysis.load_trace(trace_path)
    traced = analysis.summarize(analysis.breakdown(trace))
    traced.update(waterfall_columns(trace, env.device))
    if pipelines(c.point):
        traced.update(pipeline_columns(trace, layout_of(c.point, c.trainer.wrapped)))
    traced.update(
        comm_bytes_per_sample=traced["comm_bytes_per_step"] / c.trainer.samples_per_step,
        trace_overhead_pct=100 * (float(np.median(traced_ms)) / float(np.median(times)) - 1),
    )
    return traced


def figures(c: Candidate, env: DistEnv, timed: Timed) -> dict:
    """Figures: the replicas checked to agree, the check against the plain model's word, the
    timed figures and the FLOPs. Every visit ends its timing here, alone or in cycles, so that
    their rows hold the same figures."""
    check_replicas_agree(STRATEGIES[c.point.strategy].replicated(c.trainer.wrapped), c.group)
    out = {} if c.checked is None else {"checked": c.checked}
    out.update(compile_figures(c))
    out.update(visit_figures(c, timed))
    mean_s = float(np.mean([*c.visit.prior_times, *timed.times])) / 1e3
    out.update(flops.figures(c.point, env.device, mean_s, c.peak))
    return out


def memory(c: Candidate, env: DistEnv, settings: PointSettings) -> dict:
    """Memory: ``point_memory`` on a build of the point's own (its trainer released first); a
    pipeline's row lists each rank's, its stage's."""
    out = point_memory(
        lambda: build_trainer(c.point, env, c.group, settings.recipe),
        c.step_of,
        device=env.device,
    )
    if pipelines(c.point):
        out["pp_peak_mem_by_rank_mb"] = out["peak_mem_mb"]
    return out


def _at_most_every(seconds: float, fn: Callable) -> Callable:
    """``fn``, called at most once per ``seconds`` (the first call waits that long too)."""
    last = [time.monotonic()]

    def call(*args) -> None:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            fn(*args)

    return call


# -- a round's visit: a cohort of one -------------------------------------------------------
def _visit_stages(
    c: Candidate, env: DistEnv, settings: PointSettings, progress: Callable[[str], None]
) -> dict:
    """This rank's stages of a round's visit, build to memory: its figures."""
    build(c, env, settings)
    if c.visit.profile:  # a point's first visit; later ones only say when they finish
        progress("warm-up")
    warm_up(c, env, settings)
    timed = time_steps(c, env, progress)
    out: dict = {}
    if c.visit.profile:
        progress("profiling")
        out = profile(c, env, settings, timed.times)
    out.update(figures(c, env, timed))
    c.trainer = None  # released before its memory is measured on a build of its own
    if c.visit.profile:
        progress("memory")
        out.update(memory(c, env, settings))
    return out


def exact_steps(point: PointRecord) -> Visit:
    """One visit of exactly ``point.steps`` timed steps."""
    steps = point.steps
    return Visit(
        budget=Budget(min_steps=steps, max_steps=steps, max_s=float("inf"), target_pct=0.0)
    )


@settled(flops.load_counter)  # the point's collections walk only what it made
def run_point(
    point: PointRecord,
    env: DistEnv,
    settings: PointSettings,
    trace_dir: Path,
    visit: Visit | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> VisitResult:
    """Run ``point`` on its ranks (the first ``point.world_size``) while the others wait
    (collective call on every rank); rank 0 gets the finished row. Without a ``visit``: one
    visit of exactly ``point.steps`` timed steps."""
    k = point.world_size
    if k > env.world_size:
        raise ValueError(f"point {point.id} needs {k} ranks, {env.world_size} were launched")
    c = Candidate(point=point, trace_dir=trace_dir, visit=visit or exact_steps(point))
    c.group = new_point_group(point, env, list(range(k)), settings.point_timeout_s)
    hangs = hang_dir(trace_dir)
    mine = Outcome(None, None, None)
    if env.rank < k:
        out, error = run_watched(
            lambda: _visit_stages(c, env, settings, progress),
            group=c.group,
            rank=env.rank,
            folder=hangs,
            key=f"bench.hang/{hangs}/{c.visit.round}",
        )
        if error is not None:
            # This rank's end of the point's group goes now, not after the others answer: its
            # connections close, so members still waiting in one of its collectives fail at
            # once instead of at the timeout.
            c.drop()
        mine = Outcome(out, error, c.checked)

    def lost(e: Exception) -> LostRanksError:
        own = mine.error or "finished on this rank"
        return LostRanksError(
            f"point {point.id}: lost contact with the other ranks ({first_line(e)}); "
            f"rank {env.rank}: {own}",
            hangs=hangs,
        )

    outcomes = gather(env, mine, lost)  # the ranks outside the point wait here: a barrier
    if env.rank < k and c.group is not None:
        dist.destroy_process_group(c.group)
    gc.collect()
    return point_row(c, env, outcomes[:k])


# -- a cohort: its candidates side by side ---------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Cohort:
    """Candidates timed together: their points, the cohort's name in results.csv (a reader
    pairs the samples of one cohort only), and an effect injected into some (point id ->
    ``Candidate.slow_pct``: selftime's known effects)."""

    points: tuple[PointRecord, ...]
    name: str = ""
    slow_pct: dict[str, float] = field(default_factory=dict)


def _watched(ctx, c: Candidate, fn: Callable[[], object], stage: str):
    """``fn()`` under the candidate's watchdog; on failure its error, its group dropped."""
    hangs = hang_dir(c.trace_dir)
    out, c.error = run_watched(
        fn, group=c.group, rank=ctx.env.rank, folder=hangs, key=f"bench.hang/{hangs}/{stage}"
    )
    if c.error:
        c.drop()
    return out


def _ready(c: Candidate, env: DistEnv, settings: PointSettings) -> None:
    """A candidate's stages before the cycles: build, warm-up, its steps timed alone."""
    build(c, env, settings)
    warm_up(c, env, settings)
    time_alone(c, env)


def _traced(c: Candidate, env: DistEnv, settings: PointSettings) -> dict:
    """A candidate's stages after the cycles, but memory: profile and figures, and how its
    step in the cycles compares with its steps alone."""
    times = np.array(c.times)
    reset_peak_rss()  # its traced steps' peak (the candidates built before it still held)
    out = profile(c, env, settings, times)
    # No NVML figure: its sample period (1/6 s to 1 s) spans the other candidates' steps.
    timed = Timed(times, np.array(c.skew), c.stop, float(np.median(c.data_ms)), float("nan"))
    out.update(figures(c, env, timed))
    alone = float(np.median(c.alone))
    out.update(
        cycles=len(c.times),
        alone_ms=alone,
        interleave_cost_pct=100 * (float(np.median(times)) / alone - 1),
    )
    return out


def _finish(ctx, settings: PointSettings, c: Candidate) -> VisitResult:
    """A live candidate after the cycles: its profile and figures, its model released, its
    memory on a build of its own, its row (written), and its group released."""
    out = _watched(ctx, c, lambda: _traced(c, ctx.env, settings), "finish")
    if out is not None:
        c.trainer = None  # released before its memory is measured on a build of its own
        mem = _watched(ctx, c, lambda: memory(c, ctx.env, settings), "memory")
        if mem is None:
            out = None
        else:
            out.update(mem)
    mine = [Outcome(out, c.error, c.checked)]
    per_rank = [g[0] for g in gather(ctx.env, mine, lambda e: lost_in_cohort("at the end", e))]
    result = point_row(c, ctx.env, per_rank)
    write_row(ctx, c, result)
    c.drop()
    return result


@settled(flops.load_counter)  # the cohort's collections walk only what it made
def run_cohort(
    ctx,
    settings: PointSettings,
    cohort: Cohort,
    budget: CycleBudget,
    progress: Callable[[str], None],
) -> list[VisitResult]:
    """The cohort's candidates built, cycled and measured on every rank of the job; every
    candidate's row (rank 0 has them written), in the order they finished. ``ctx``: the run
    (its ``env``, ``run_dir`` and ``write``)."""
    env = ctx.env
    cands = [
        Candidate(
            point=p,
            trace_dir=ctx.run_dir / "traces" / p.id,
            method=PAIRED,
            cohort=cohort.name,
            slow_pct=cohort.slow_pct.get(p.id, 0.0),
        )
        for p in cohort.points
    ]

    def lost(why: str) -> None:  # the rank must leave before the cohort ends (launcher lost)
        for c in cands:
            if not c.written:
                ctx.write(Row.of(c.point, round=1, status="error", error=why).cells())

    watchdog.point_started(lost if env.is_main else None)
    results = _cycled(ctx, settings, cands, budget, progress)
    alive = [c for c in cands if not c.error]
    results += [_finish(ctx, settings, c) for c in reversed(alive)]  # newest first
    watchdog.point_done()
    return results


def _cycled(
    ctx,
    settings: PointSettings,
    cands: list[Candidate],
    budget: CycleBudget,
    progress: Callable[[str], None],
) -> list[VisitResult]:
    """The candidates' groups, their stages up to the cycles, and the cycles: the rows of
    those that failed on the way."""
    env, failed = ctx.env, []
    for c in cands:  # every rank creates every group, in the same order
        c.group = new_point_group(
            c.point, env, list(range(env.world_size)), settings.point_timeout_s
        )
    for c in cands:  # agreed one by one: no rank waits in the next one's for a failed peer
        progress(f"{c.point.id}: warm-up, and {ALONE_STEPS} steps alone")
        _watched(ctx, c, lambda c=c: _ready(c, env, settings), "warm-up")
        failed += agree_on_failures(ctx, [c], f"after {c.point.id}'s warm-up")
    alive = [c for c in cands if not c.error]
    if alive:
        progress(f"{len(alive)} candidates in cycles")
        before = compiled_frames()  # every candidate warmed up: none compiles in the cycles
        n, lost = run_cycles(ctx, alive, budget, progress)
        for c in alive:
            c.recompiled = compiled_frames() - before
        failed += lost
        stops = ", ".join(
            f"{k} {v}" for k, v in Counter(c.stop for c in alive if not c.error).items()
        )
        progress(f"{n} cycles (stopped: {stops}); profiling")
    return failed
