"""Run one sweep point on every rank and turn it into one row of results.csv.

A point runs in a process group of its own, created with a short timeout, so that a point that
raises on one rank makes the others time out of their collectives instead of hanging; the ranks
then agree on the outcome over the default group and all move on to the next point together.
"""

from __future__ import annotations

import datetime
import functools
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch.distributed as dist

from bench.analysis import breakdown as analysis
from bench.runfolder.points import PointRecord
from bench.runner.faults import watchdog
from bench.runner.faults.hangs import diagnosis, hang_dir, run_watched
from bench.runner.faults.root_cause import root_cause
from bench.runner.measure import flops
from bench.runner.measure.collector import settled
from bench.runner.measure.nvml import NvmlSampler
from bench.runner.measure.peak_memory import point_memory
from bench.runner.measure.profiling import profile_steps, reset_peak_rss
from bench.runner.measure.timing import Budget, adaptive_steps, common_clock
from bench.runner.session.distenv import DistEnv, synchronize
from bench.runner.train import plain_check, plain_compare
from bench.runner.train.figures import Timed, aggregate, point_columns, visit_figures
from bench.runner.train.replicas import check_replicas_agree
from bench.runner.train.step import LR, build_trainer
from parallel_kernels.groups import mesh_lines, prepare
from parallel_kernels.strategies import STRATEGIES


@dataclass(frozen=True, kw_only=True)
class HarnessConfig:
    """How every point is run, beyond what its record says (steps and batch are the
    record's)."""

    profile_wait: int = 1
    profile_warmup: int = 1
    lr: float = LR
    seed: int = 0
    point_timeout_s: float = 120.0
    clip_grad_norm: float | None = None  # clip the gradient's global norm before each step


@dataclass(frozen=True, kw_only=True)
class Visit:
    """One round's run of a point: its round, the samples of its earlier rounds (every member
    rank holds the same, all-reduced), whether to profile it (its first visit that finishes:
    traces and their breakdown are made once per point) and this visit's timing budget."""

    budget: Budget
    round: int = 1
    prior_times: tuple[float, ...] = ()  # step times (first start to last end)
    prior_skew: tuple[float, ...] = ()  # last end - first end per step
    prior_medians: tuple[float, ...] = ()  # each earlier round's median
    profile: bool = True


PROGRESS_S = 10.0  # a long visit says how far it is at most this often


def _every(seconds: float, fn: Callable) -> Callable:
    """``fn``, called at most once per ``seconds`` (the first call waits that long too)."""
    last = [time.monotonic()]

    def call(*args) -> None:
        now = time.monotonic()
        if now - last[0] >= seconds:
            last[0] = now
            fn(*args)

    return call


class LostRanksError(RuntimeError):
    """The ranks could not agree on a point's outcome: a rank or a node is gone."""

    def __init__(self, message: str, hangs: Path | None = None):
        super().__init__(message)
        self.hangs = hangs  # where the ranks that could still act left their dumps


def _train_and_measure(
    point: PointRecord,
    env: DistEnv,
    cfg: HarnessConfig,
    visit: Visit,
    group: dist.ProcessGroup,
    trace_dir: Path,
    progress: Callable[[str], None],
    seen: dict,
) -> dict:
    """This rank's visit of the point: warm-up (its first step checked against the plain
    model), the timed steps, on a first visit the traced steps, its figures, and on a first
    visit its memory on a build of its own (``point_memory``)."""
    gc.collect()  # earlier points' modules hold reference cycles (hooks): free them first
    peak = flops.point_peaks(point, env.device)  # MFU's peak: timed before the model holds memory
    reset_peak_rss()

    def build():
        return build_trainer(point, env, group, seed=cfg.seed, lr=cfg.lr, clip=cfg.clip_grad_norm)

    def step_of(trainer, *inputs):
        watchdog.check_terminated()  # a cancelled job ends the point at its next step
        return trainer.step(*inputs)

    trainer = build()
    step = functools.partial(step_of, trainer)

    if visit.profile:  # a point's first visit; later ones only say when they finish
        progress("warm-up")
    checked = seen["checked"] = warm_up(point, env, cfg, visit, group, trainer, step)
    timed = _timed_steps(env, visit, group, trainer, step, progress)
    metrics: dict = {}
    if visit.profile:
        progress("profiling")
        metrics = profiled(point, env, cfg, trainer, step, trace_dir, timed.times)
    metrics = visit_metrics(point, env, visit, group, trainer, timed, peak, checked, metrics)
    trainer = step = None  # released before its memory is measured on a build of its own
    if visit.profile:
        progress("memory")
        metrics.update(memory_of(env, trace_dir, build, step_of))
    return metrics


def memory_of(env: DistEnv, trace_dir: Path, build: Callable, step: Callable) -> dict:
    """``point_memory`` where a point's (or a cohort's candidate's) traces lie."""
    scratch = trace_dir / f".memory-rank{env.rank}"
    return point_memory(build, step, device=env.device, scratch_dir=scratch)


def visit_metrics(
    point: PointRecord,
    env: DistEnv,
    visit: Visit,
    group,
    trainer,
    timed: Timed,
    peak,
    checked: str | None,
    metrics: dict,
) -> dict:
    """A visit's ``metrics`` (its profile's, if any) completed after its timed steps: the
    replicas checked to agree, the plain check's word, the timed figures and the FLOPs. Every
    visit ends here, in rounds and interleaved, so that their rows hold the same figures."""
    check_replicas_agree(STRATEGIES[point.strategy].replicated(trainer.wrapped), group)
    if checked is not None:  # a later visit's row carries the first visit's (the runner)
        metrics["checked"] = checked
    metrics.update(visit_figures(point, visit, trainer, timed))
    mean_s = float(np.mean([*visit.prior_times, *timed.times])) / 1e3
    metrics.update(flops.figures(point, env.device, mean_s, peak))  # FLOPs
    return metrics


def _timed_steps(
    env: DistEnv,
    visit: Visit,
    group: dist.ProcessGroup,
    trainer,
    step: Callable,
    progress: Callable[[str], None],
) -> Timed:
    """The visit's timed steps, each step's data fetched and NVML read between them."""
    clock = common_clock(group, env.device)  # once per point: every visit builds its own group
    nvml = NvmlSampler(env.device)
    data_ms: list[float] = []

    def between() -> None:
        """Untimed, before each step's barrier: its data onto the device, and NVML's reading."""
        t0 = time.perf_counter()
        trainer.fetch()
        synchronize(env.device)
        data_ms.append((time.perf_counter() - t0) * 1e3)
        nvml.sample()

    times, skew, stop = adaptive_steps(
        step,
        visit.budget,
        prior=list(visit.prior_times),
        device=env.device,
        group=group,
        clock=clock,
        between=between,
        on_chunk=_every(PROGRESS_S, lambda n, w: progress(f"{n} timed steps, median +-{w:.1f} %")),
    )
    return Timed(times, skew, stop, float(np.median(data_ms)), nvml.mean_pct)


def profiled(
    point: PointRecord,
    env: DistEnv,
    cfg: HarnessConfig,
    trainer,
    step: Callable,
    trace_dir: Path,
    times: np.ndarray,
) -> dict:
    """A first visit's traced steps, analysed (the breakdown)."""
    n_traced = cfg.profile_wait + cfg.profile_warmup + point.profile_steps
    inputs = [trainer.next_inputs() for _ in range(n_traced)]  # no data loading traced
    trace_path, traced_ms = profile_steps(
        lambda: step(inputs.pop(0)),
        trace_dir=trace_dir,
        worker_name=f"rank{env.rank}",
        device=env.device,
        wait=cfg.profile_wait,
        warmup=cfg.profile_warmup,
        active=point.profile_steps,
    )
    metrics = analysis.summarize(analysis.breakdown(analysis.load_trace(trace_path)))
    metrics.update(
        comm_bytes_per_sample=metrics["comm_bytes_per_step"] / trainer.samples_per_step,
        # what tracing adds to a step, against this visit's untraced steps on this rank
        trace_overhead_pct=100 * (float(np.median(traced_ms)) / float(np.median(times)) - 1),
    )
    return metrics


def warm_up(
    point: PointRecord,
    env: DistEnv,
    cfg: HarnessConfig,
    visit: Visit,
    group: dist.ProcessGroup,
    trainer,
    step: Callable,
) -> str | None:
    """The warm-up steps, the first of a point's first visit checked against the plain model
    (``plain_check``): what was checked, or None on later visits (the runner carries the
    first visit's, as it does the traced figures)."""
    checked = None
    replicated = STRATEGIES[point.strategy].replicated
    for i in range(point.warmup_steps):
        step()
        if i == 0 and visit.profile:
            checked = plain_check.run(
                trainer,
                env,
                group,
                seed=cfg.seed,
                lr=cfg.lr,
                clip=cfg.clip_grad_norm,
                replicas=lambda: check_replicas_agree(replicated(trainer.wrapped), group),
            )
            gc.collect()  # the plain model and the gathered copy go before anything is measured
            reset_peak_rss()  # the peak of the timed steps, not of the extra plain step
    if checked is None and visit.profile:
        checked = plain_compare.tolerance_for(point)  # no warm-up step: it says why
    return checked


@settled(flops.load_counter)  # the point's collections walk only what it made
def run_point(
    point: PointRecord,
    env: DistEnv,
    cfg: HarnessConfig,
    trace_dir: Path,
    visit: Visit | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict:
    """Run ``point`` on its ranks (the first ``point.world_size``) while the others wait
    (collective call on every rank); rank 0 gets the finished row. Without a ``visit``: one
    round of exactly ``point.steps`` timed steps."""
    if visit is None:
        visit = Visit(
            budget=Budget(
                min_steps=point.steps, max_steps=point.steps, max_s=float("inf"), target_pct=0.0
            )
        )
    k = point.world_size
    if k > env.world_size:
        raise ValueError(f"point {point.id} needs {k} ranks, {env.world_size} were launched")
    members = list(range(k))
    group = new_point_group(point, env, cfg, members)
    metrics, error = None, None
    hangs = hang_dir(trace_dir)
    seen: dict = {}  # what the point got to before it failed: its check against the plain model
    if env.rank in members:
        metrics, error = run_watched(
            lambda: _train_and_measure(point, env, cfg, visit, group, trace_dir, progress, seen),
            group=group,
            rank=env.rank,
            folder=hangs,
            key=f"bench.hang/{hangs}/{visit.round}",
        )
        if error is not None:
            # This rank's end of the point's group goes now, not after the others answer: its
            # connections close, so members still waiting in one of its collectives fail at
            # once instead of at the timeout (gloo has no other way to wake them).
            dist.destroy_process_group(group)
            group = None
            gc.collect()
    gathered: list = [None] * env.world_size
    try:
        # the others wait here: a barrier
        dist.all_gather_object(gathered, (metrics, error, seen.get("checked")))
    except Exception as e:  # noqa: BLE001  (the job cannot go on: say what is known)
        own = error or "finished on this rank"
        raise LostRanksError(
            f"point {point.id}: lost contact with the other ranks "
            f"({type(e).__name__}: {str(e).splitlines()[0][:300]}); rank {env.rank}: {own}",
            hangs=hangs,
        ) from None
    if env.rank in members and group is not None:
        dist.destroy_process_group(group)
    gc.collect()
    return point_row(point, env, trace_dir, gathered[:k], hangs)


def new_point_group(
    point: PointRecord, env: DistEnv, cfg: HarnessConfig, members: list[int]
) -> dist.ProcessGroup | None:
    """The point's own process group (None on a rank outside it). Every rank takes part in
    creating it (a fresh one each point, so that a point that broke its group cannot harm the
    next); only members get one. On part of the job, every rank also creates the subgroups the
    strategy will ask for (groups.py)."""
    timeout = datetime.timedelta(seconds=cfg.point_timeout_s)
    try:
        group = dist.new_group(members, timeout=timeout, group_desc="point")
        if len(members) < env.world_size:
            try:
                shape = STRATEGIES[point.strategy].mesh_shape(len(members), **point.knobs)
            except ValueError:  # a bad layout: the members' apply raises it as the point's error
                shape = None
            if shape:
                prepare(members, mesh_lines(shape), timeout)
    except Exception as e:  # noqa: BLE001  (a peer gone between points: say so, no traceback)
        raise LostRanksError(
            f"point {point.id}: lost contact with the other ranks while forming the point's "
            f"group ({type(e).__name__}: {str(e).splitlines()[0][:300]})"
        ) from None
    return group


def point_row(
    point: PointRecord, env: DistEnv, trace_dir: Path, gathered: list, hangs: Path
) -> dict:
    """The point's row from its members' (metrics, error, checked): its figures, or its root
    cause and, on rank 0, the diagnosis of the dumps its ranks left."""
    row = {
        **point_columns(point),
        "backend": env.backend,
        "device": env.device.type,
        "trace_dir": str(trace_dir),
    }
    errors = [e for _, e, _ in gathered]
    if any(errors):
        said = [c for _, _, c in gathered]
        row.update(
            status="error",
            error=root_cause(errors),
            checked=plain_check.checked_of_failed(errors, said),
        )
        # a mismatch with the plain model is every rank's agreed verdict after its
        # collectives completed: no hang to diagnose
        if env.is_main and not plain_check.is_mismatch(errors):
            row.update(diagnosis(hangs))
    else:
        row.update(status="ok", error="")
        row.update(aggregate([m for m, _, _ in gathered]))
    return row
