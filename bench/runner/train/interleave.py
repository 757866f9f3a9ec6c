"""A cohort of candidates (``cohort.py``) timed together in one launch, in cycles.

Each candidate is built once, in a process group of its own (as a point is), warmed up with its
first step checked against the plain model, and timed alone for ``ALONE_STEPS`` steps. Then every
cycle times one step of every candidate still racing, in a fresh seeded random order: a candidate
whose comparison with the best is decided at one of the looks (cycles 8, 16, 32, ...:
``bench.stats.paired``) leaves, and after half the budget only the best and the default go on
(``racing.py``), until none is left or the cohort's shared steps or seconds are spent. A candidate's
cycle i and another's were timed moments apart, so drift and a neighbour's load fall on both and
cancel in their ratio. Then, newest first, each candidate's traced steps (as a point's first
visit has them), its release, its memory on a build of its own once every candidate after
it is gone (``point_memory``: the candidates built before it still hold theirs, which its
baseline holds too), and its row.

A candidate that fails is its error row; the others go on. Every rank leaves a cycle with the
same candidates alive (their failures gathered), and decides to stop from the same all-reduced
step times, so they all stop after the same cycle.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch.distributed as dist

from bench.runfolder.points import PointRecord
from bench.runner.faults import watchdog
from bench.runner.faults.hangs import hang_dir, run_watched
from bench.runner.measure import flops
from bench.runner.measure.collector import settled
from bench.runner.measure.profiling import reset_peak_rss
from bench.runner.measure.timing import (
    MAX_SECONDS,
    MAX_STEPS,
    Budget,
    Clock,
    common_clock,
    timed_steps,
)
from bench.runner.session.distenv import DistEnv, synchronize
from bench.runner.train import racing
from bench.runner.train.figures import Timed, point_columns
from bench.runner.train.harness import (
    HarnessConfig,
    LostRanksError,
    Visit,
    memory_of,
    new_point_group,
    point_row,
    profiled,
    visit_metrics,
    warm_up,
)
from bench.runner.train.step import build_trainer
from bench.stats.paired import interim_look
from parallel_kernels.groups import set_point_group

ALONE_STEPS = 3  # each candidate's step timed alone after its warm-up (the interference)
# A candidate's one visit, as the harness's pieces see it: round 1, first (warm-up checked
# against the plain model), no earlier samples; its budget is the cycles' (``CycleBudget``).
ONE_VISIT = Visit(budget=Budget(min_steps=1, max_steps=1, max_s=0.0, target_pct=0.0))


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


@dataclass
class Candidate:
    point: PointRecord
    trace_dir: object  # Path: the point's traces/<id>/
    group: dist.ProcessGroup | None = None
    trainer: object = None
    clock: Clock | None = None
    peak: tuple | None = None  # MFU's peaks, timed before the model held memory
    checked: str | None = None
    alone: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    skew: list[float] = field(default_factory=list)
    data_ms: list[float] = field(default_factory=list)
    error: str | None = None
    written: bool = False  # its row is in results.csv
    active: bool = True  # still in the cycles (``racing.py``: a decided one leaves)
    stop: str = ""  # why it left the cycles (results.csv's ``stop``)
    # an effect of known size for selftime (bench/selftime/paired_power.py): each timed step
    # made this % longer, by a spin of that share of the candidate's last step
    slow_pct: float = 0.0
    cohort: str = ""  # results.csv's ``cohort``

    def step(self, *inputs) -> None:
        self.step_of(self.trainer, *inputs)

    def step_of(self, trainer, *inputs) -> None:
        watchdog.check_terminated()
        set_point_group(self.group)  # a model's own collectives go to the point's group
        try:
            trainer.step(*inputs)
        finally:
            set_point_group(None)
        if self.slow_pct and (self.times or self.alone):
            # a spin, not a sleep: a sleep of a fraction of a millisecond overshoots by more
            # than itself on a loaded machine; the spin is exact, as a slower kernel would be
            until = time.perf_counter() + self.slow_pct / 100 * (self.times or self.alone)[-1] / 1e3
            while time.perf_counter() < until:
                pass

    def fetch(self) -> None:
        t0 = time.perf_counter()
        self.trainer.fetch()
        synchronize(self.trainer.device)
        self.data_ms.append((time.perf_counter() - t0) * 1e3)


def _prepare(c: Candidate, env: DistEnv, cfg: HarnessConfig) -> dict:
    """Build, warm up (the first step checked against the plain model) and time alone."""
    gc.collect()
    c.peak = flops.point_peaks(c.point, env.device)
    reset_peak_rss()
    c.trainer = _build(c, env, cfg)
    c.checked = warm_up(c.point, env, cfg, ONE_VISIT, c.group, c.trainer, c.step)
    c.clock = common_clock(c.group, env.device)
    alone, _ = timed_steps(
        c.step, ALONE_STEPS, device=env.device, group=c.group, clock=c.clock, between=c.fetch
    )
    c.alone = alone.tolist()
    return {}


def _agree(ctx, cands: list[Candidate], stage: str) -> list[dict]:
    """Every rank's errors of this stage gathered: a candidate that failed on any rank is
    failed on all, its error row written (its root cause and diagnosis as a point's). The
    rows written."""
    mine = [(None, c.error, c.checked) for c in cands]
    gathered = _gather(ctx.env, mine, stage)
    rows = []
    for i, c in enumerate(cands):
        per_rank = [g[i] for g in gathered]
        if any(e for _, e, _ in per_rank):
            c.error = c.error or next(e for _, e, _ in per_rank if e)
            _drop(c)
            rows.append(_row(ctx, c, per_rank))
            _write(ctx, c, rows[-1])
    return rows


def _drop(c: Candidate) -> None:
    """A failed candidate's group goes at once (members still waiting in it wake) and its
    model with it."""
    if c.group is not None:
        dist.destroy_process_group(c.group)
        c.group = None
    c.trainer = None
    gc.collect()


def _one_cycle(env: DistEnv, order: list[Candidate]) -> dict[str, tuple]:
    """One timed step of each candidate in ``order``: candidate id -> (step ms, skew ms).
    A candidate that fails ends the cycle on this rank: a peer still in its collective wakes
    when its group goes (or at its timeout) and leaves the cycle too, so that no rank waits
    in the next candidate's barrier for one that is not coming (and fails it)."""
    timed: dict[str, tuple] = {}
    for c in order:
        try:
            c.fetch()
            s, k = timed_steps(c.step, 1, device=env.device, group=c.group, clock=c.clock)
        except Exception as e:  # noqa: BLE001  (the candidate's error row; the others go on)
            c.error = f"{type(e).__name__}: {e}"
        if c.error:
            # out of the handler: its traceback's frames hold the model, and with it the
            # group whose connections must close now, so that peers waiting in it wake
            _drop(c)
            break
        timed[c.point.id] = (float(s[0]), float(k[0]))
    return timed


def run_cycles(
    ctx,
    cands: list[Candidate],
    budget: CycleBudget,
    progress: Callable[[str], None],
    failed: list[dict],
) -> int:
    """Cycles over the live candidates still racing (``racing.py``) until every comparison is
    decided or the budget ends: how many ran; each candidate's ``stop`` set, the rows of those
    that failed in them appended to ``failed``. A cycle in which a candidate failed is not
    kept (some candidates missed it), so that every candidate's sample i is from cycle i."""
    rng = np.random.default_rng(budget.seed)
    spent, steps, n, headline_done = 0.0, 0, 0, False
    max_steps = budget.max_cycles * len(cands)  # the cohort's, shared as its seconds are
    while True:
        active = [c for c in cands if c.active and not c.error]
        timed = _one_cycle(ctx.env, [active[i] for i in rng.permutation(len(active))])
        lost = _agree(ctx, active, f"in cycle {n + 1}")
        failed += lost
        alive = [c for c in cands if not c.error]
        active = [c for c in active if not c.error]
        if not active:
            racing.finish(alive, MAX_STEPS)
            return n
        if lost:
            continue
        for c in active:
            c.times.append(timed[c.point.id][0])
            c.skew.append(timed[c.point.id][1])
        spent += sum(t for t, _ in timed.values()) / 1e3
        steps, n = steps + len(active), n + 1
        if interim_look(n) is not None and n >= budget.min_cycles:  # the looks, no others
            left = racing.at_look(alive, n, budget.band_pct)
            still = sum(c.active for c in alive)
            progress(f"{n} cycles, {left} comparison(s) undecided, {still} candidates cycling")
            if not still:
                return n
        stop = MAX_STEPS if steps >= max_steps else MAX_SECONDS if spent >= budget.max_s else ""
        if stop:
            racing.finish(alive, stop)
            return n
        half = racing.HEADLINE_SHARE
        if not headline_done and (steps >= half * max_steps or spent >= half * budget.max_s):
            headline_done = True
            why = MAX_STEPS if steps >= half * max_steps else MAX_SECONDS
            racing.headline(alive, n, budget.band_pct, why)


def _build(c: Candidate, env: DistEnv, cfg: HarnessConfig):
    return build_trainer(c.point, env, c.group, seed=cfg.seed, lr=cfg.lr, clip=cfg.clip_grad_norm)


def _finish(c: Candidate, env: DistEnv, cfg: HarnessConfig) -> dict:
    """A candidate's figures after the cycles: traced steps, replicas, its row's."""
    times = np.array(c.times)
    reset_peak_rss()  # its traced steps' peak (the candidates built before it still held)
    metrics = profiled(c.point, env, cfg, c.trainer, c.step, c.trace_dir, times)
    # No NVML figure: its sample period (1/6 s to 1 s) spans the other candidates' steps.
    timed = Timed(times, np.array(c.skew), c.stop, float(np.median(c.data_ms)), float("nan"))
    metrics = visit_metrics(
        c.point, env, ONE_VISIT, c.group, c.trainer, timed, c.peak, c.checked, metrics
    )
    alone = float(np.median(c.alone))
    metrics.update(
        method="paired",
        cycles=len(c.times),
        alone_ms=alone,
        interleave_cost_pct=100 * (float(np.median(times)) / alone - 1),
    )
    return metrics


def _gather(env: DistEnv, mine: list, stage: str) -> list[list]:
    """Every rank's ``mine`` (one entry per candidate), by rank; a peer gone is a lost job."""
    gathered: list = [None] * env.world_size
    try:
        dist.all_gather_object(gathered, mine)
    except Exception as e:  # noqa: BLE001  (a peer gone: the job cannot go on)
        raise LostRanksError(
            f"interleaved candidates: lost contact with the other ranks {stage} "
            f"({type(e).__name__}: {str(e).splitlines()[0][:300]})"
        ) from None
    return gathered


def _row(ctx, c: Candidate, per_rank: list) -> dict:
    """The candidate's row from its ranks' (metrics, error, checked), as a point's is."""
    row = point_row(c.point, ctx.env, c.trace_dir, per_rank, hang_dir(c.trace_dir))
    row["round"] = 1
    row["method"] = "paired"
    row["cohort"] = c.cohort
    row.pop("skew_ms", None)  # kept by the rounds runner only, for a point's next visit
    return row


def _write(ctx, c: Candidate, row: dict) -> None:
    """Rank 0 writes the candidate's row (a copy: the write takes its samples)."""

    def write() -> None:
        ctx.write(dict(row))
        c.written = True

    if ctx.env.is_main:
        watchdog.write_row(write, last=False)


def _watched(ctx, c: Candidate, fn: Callable[[], dict], stage: str) -> dict | None:
    """``fn`` under the point's watchdog; on failure the candidate's error, its group gone."""
    hangs = hang_dir(c.trace_dir)
    out, c.error = run_watched(
        fn, group=c.group, rank=ctx.env.rank, folder=hangs, key=f"bench.hang/{hangs}/{stage}"
    )
    if c.error:
        _drop(c)
    return out


def _finish_all(ctx, cfg: HarnessConfig, alive: list[Candidate]) -> list:
    """Newest first: each live candidate's traced steps, its model released, its memory on
    a build of its own, its row written, and its group released before the next one."""
    rows = []
    for c in reversed(alive):
        metrics = _watched(ctx, c, lambda c=c: _finish(c, ctx.env, cfg), "finish")
        if metrics is not None:
            c.trainer = None  # released before its memory is measured on a build of its own
            memory = _watched(
                ctx,
                c,
                lambda c=c: memory_of(
                    ctx.env, c.trace_dir, lambda: _build(c, ctx.env, cfg), c.step_of
                ),
                "memory",
            )
            metrics = None if memory is None else {**metrics, **memory}
        per_rank = [g[0] for g in _gather(ctx.env, [(metrics, c.error, c.checked)], "at the end")]
        row = _row(ctx, c, per_rank)
        _write(ctx, c, row)
        rows.append(row)
        _drop(c)
    return rows


@settled(flops.load_counter)  # the cohort's collections walk only what it made
def run_cohort(
    ctx,
    cfg: HarnessConfig,
    points: list[PointRecord],
    budget: CycleBudget,
    progress: Callable[[str], None],
    slow_pct: dict[str, float] | None = None,
    cohort: str = "",
) -> list[dict]:
    """The cohort's candidates built, cycled and measured on every rank of the job; every
    candidate's row (rank 0 has them written), in the order they finished. ``ctx``: the run
    (its ``env``, ``run_dir`` and ``write``); ``slow_pct``: point id -> an injected effect
    (``Candidate.slow_pct``); ``cohort``: its name in results.csv (a reader pairs the samples
    of one cohort only)."""
    env, slow = ctx.env, slow_pct or {}
    cands = [
        Candidate(
            point=p,
            trace_dir=ctx.run_dir / "traces" / p.id,
            slow_pct=slow.get(p.id, 0.0),
            cohort=cohort,
        )
        for p in points
    ]
    rows: list[dict] = []

    def lost(why: str) -> None:  # the rank must leave before the cohort ends (launcher lost)
        for c in cands:
            if not c.written:
                ctx.write({**point_columns(c.point), "round": 1, "status": "error", "error": why})

    watchdog.point_started(lost if env.is_main else None)
    for c in cands:  # every rank creates every group, in the same order
        c.group = new_point_group(c.point, env, cfg, list(range(env.world_size)))
    for c in cands:  # agreed one by one: no rank waits in the next one's for a failed peer
        progress(f"{c.point.id}: warm-up, and {ALONE_STEPS} steps alone")
        _watched(ctx, c, lambda c=c: _prepare(c, env, cfg), "warm-up")
        rows += _agree(ctx, [c], f"after {c.point.id}'s warm-up")
    alive = [c for c in cands if not c.error]
    if alive:
        progress(f"{len(alive)} candidates in cycles")
        n = run_cycles(ctx, alive, budget, progress, rows)
        alive = [c for c in alive if not c.error]
        stops = ", ".join(f"{k} {v}" for k, v in Counter(c.stop for c in alive).items())
        progress(f"{n} cycles (stopped: {stops}); profiling")
    rows += _finish_all(ctx, cfg, alive)
    watchdog.point_done()
    return rows
