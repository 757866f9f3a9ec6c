"""Which fake trackings stand for a plan's configurations, and how their figures combine.

Tracking under fake tensors (``memory.py``) is the plan's cost, so configurations share it
where the memory cannot differ, and the rest is derived from the fewest trackings:

- DDP's bucket size does not change what a rank holds (the buckets hold every gradient
  whatever their size). Accumulation is tracked at two micro-batches per step, whatever the
  configuration's number: from the second on, each micro-batch runs with the gradients of the
  ones before it live (the tensors it accumulates into), and the peak is the same with two as
  with eight; the FLOPs of ``accum`` micro-batches are ``accum`` times one's. (Tracked at one
  micro-batch, llama:tiny's DDP at 2 x 2 read 15.7 % under the harness's peak: no gradient
  lives through one micro-batch's forward.)
- FSDP2's SHARD_GRAD_OP stands in for FSDP1's; FSDP1's other shardings are tracked as
  themselves (``tracked_as``).
- A layout whose state is sharded over a group that does not grow with the world (DDP's
  replicas, a TP group, FSDP's NO_SHARD, a hybrid shard group) is tracked at two of those
  groups: a rank holds the same whatever their number.
- A layout sharded over the whole world, at more than ``PROXY_WORLD`` ranks, is tracked at
  two smaller worlds and extrapolated as ``a + b / world``: what a rank holds of sharded state
  falls as 1/world; the rest (activations, a unit's gathered parameters) does not change.
- The micro-batches of one layout: its smallest and largest are tracked and those between
  interpolated (activations and FLOPs grow with the micro-batch). The largest is tracked at
  the smaller proxy world only and takes the smallest's change with the world: the world
  moves the sharded state, the micro-batch the activations, and neither moves the other.
- A checkpointed layout of a world-sharded kind whose plain twin (checkpointing off, its
  smallest micro-batch) is in the plan: tracked at the smaller proxy world only and moved to
  the world as its twin is (checkpointing moves the activations, not the sharded state; one of
  llama:1b's 176 rows at 1024 ranks reads 0.4 % over its tracking at both proxies: its peak
  holds more gradient shards than its twin's, which the world shrinks less).
- The trackings of one layout at one world, whatever their micro-batch, accumulation and
  checkpointing (``PHASE_KNOBS``), share one build (``builds``): ``memory.track_phases``
  steps each in turn on it. An accumulating configuration of an implementation that cannot
  skip gradient synchronisation is its error row, unbuilt, and so is a checkpointed one of a
  model that names no checkpoint units (``space.names_checkpoint_units``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from bench.plan.memory import track_phases
from bench.plan.space import NO_CHECKPOINT_UNITS, Config, names_checkpoint_units
from bench.plan.tracked import Tracked, failed
from parallel_kernels.fsdp_layout import shard_group_size
from parallel_kernels.strategies import STRATEGIES

CANNOT_ACCUMULATE = "the implementation cannot accumulate gradients (no way to skip their sync)"
# An accumulating step under DTensor's fake dispatch costs two micro-batches' steps, too slow
# for a plan's time target, so those TP rows are not tracked; ``bench/run.py`` runs them
# (MeshParallel.no_sync). The cost: docs/benchmarks.md, "Planning time".
TP_ACCUMULATION_UNTRACKED = (
    "not tracked: TP's accumulating step costs the plan two micro-batches' steps under "
    "DTensor's fake dispatch; bench/run.py runs it (its command)"
)
# What one build steps each way in turn (bench/plan/memory.py's phases), the bucket size
# besides: it does not change what a rank holds.
PHASE_KNOBS = ("bucket_cap_mb", "grad_accum", "activation_checkpointing")
PROXY_WORLD = 64  # layouts sharded over the world beyond this many ranks use smaller worlds
PROXY_MIN = 16  # the smaller proxy world's floor (shards of real models split evenly there)


def _accumulates(c: Config) -> bool:
    return int(c.knobs.get("grad_accum", 1)) > 1


def _checkpointed(c: Config) -> bool:
    return c.knobs.get("activation_checkpointing") == "on"


def memory_key(c: Config) -> tuple:
    """What a rank's memory depends on: everything but the bucket size and how many
    micro-batches it accumulates (whether it does counts)."""
    knobs = {k: v for k, v in c.knobs.items() if k not in ("bucket_cap_mb", "grad_accum")}
    knobs["accumulates"] = _accumulates(c)
    return (c.strategy, c.impl, tuple(sorted(knobs.items())), c.micro_batch, c.world_size)


def tracked_as(c: Config) -> Config:
    """The configuration whose tracking stands for ``c``'s: its own, but where the
    implementation's row names a stand-in (``memory_as``) for the knobs' values it cannot track
    as itself: FSDP1's SHARD_GRAD_OP is FSDP2's (torch's FSDP1 fails a step under fake tensors
    there: "the unsharded flat parameter should be allocated"; both hold the same ZeRO shards of
    the same tensors, gathered unit by unit). FSDP1's other shardings are tracked as themselves
    (``memory_own``), with the tracker's gradient hooks left off its original parameters, views
    of the flat one (``fakes.PeakTracker``): its NO_SHARD reduces its flat gradient in place,
    and its FULL_SHARD holds the next flat unit gathered beside the current one in backward,
    where FSDP2's figure read ResNet's measured peak at 0.947 and its own at 1.000."""
    impl = STRATEGIES[c.strategy].impls[c.impl]
    if impl.memory_as is None or any(c.knobs.get(k) in v for k, v in impl.memory_own.items()):
        return c
    return replace(c, impl=impl.memory_as)


def _inner(c: Config) -> int:
    """Ranks of the group inside a replica (a TP group; 1 without one)."""
    return int(c.knobs.get("tp_degree") or 1)


def _state_group(c: Config) -> int | None:
    """Ranks a rank's state is sharded over where that does not grow with the world, None where
    it is sharded over the world's data-parallel ranks."""
    if c.strategy == "fsdp":
        knobs = c.knobs
        s = shard_group_size(knobs["sharding_strategy"], c.world_size, knobs.get("shard_size"))
        return None if s == c.world_size else s
    return None if c.knobs.get("dp_shard") else _inner(c)


def worlds(c: Config) -> tuple[int, ...]:
    """The fake world sizes ``c`` is tracked at: its own, two groups of a fixed state group,
    or two proxies of a world-sharded layout (``a + b / n``)."""
    world, group = c.world_size, _state_group(c)
    if group is not None:
        return (2 * group,) if world > 2 * group else (world,)
    small = max(PROXY_MIN, 4 * _inner(c))
    if world > PROXY_WORLD and world >= 4 * small:
        return (small, 2 * small)
    return (world,)


@dataclass(frozen=True)
class Job:
    """One tracking: a configuration (one micro-batch per step, or two where it accumulates)
    at a fake world size."""

    config: Config
    world: int

    @property
    def key(self) -> tuple:
        return memory_key(self.config), self.world


def _job(c: Config, world: int) -> Job:
    return Job(replace(c, knobs={**c.knobs, "grad_accum": 2 if _accumulates(c) else 1}), world)


def _got(got: dict[tuple, Tracked], c: Config, world: int) -> Tracked:
    return got[_job(c, world).key]


def builds(jobs: list[Job]) -> list[tuple[Job, ...]]:
    """``jobs`` grouped by what one build serves: the same layout and knobs at the same world,
    whatever the micro-batch, accumulation and activation checkpointing
    (``memory.track_phases`` steps each in turn)."""
    out: dict[tuple, list[Job]] = {}
    for job in jobs:
        c = job.config
        knobs = {k: v for k, v in c.knobs.items() if k not in PHASE_KNOBS}
        key = (c.strategy, c.impl, tuple(sorted(knobs.items())), job.world)
        out.setdefault(key, []).append(job)
    return [tuple(group) for group in out.values()]


def run_build(jobs: tuple[Job, ...], gpus_per_node: int, gpu: bool = False) -> list:
    """The trackings of ``jobs`` (one build's, ``builds``), in order; a job whose configuration
    does not resolve is its error, the others are tracked."""
    got: list[Tracked | None] = []
    points = []
    for job in jobs:
        try:
            job.config.point()  # the configuration itself must resolve, not only its proxy
            point = job.config.point(world_size=job.world)
        except ValueError as e:
            got.append(failed(f"{e}"))
            continue
        if _checkpointed(job.config) and not names_checkpoint_units(point.model):
            got.append(failed(NO_CHECKPOINT_UNITS))  # as its build would raise, unbuilt
            continue
        if _accumulates(job.config) and point.impl_facts["skip_sync"] is None:
            got.append(failed(CANNOT_ACCUMULATE))  # as the harness refuses it, before a build
            continue
        if _accumulates(job.config) and point.schedule == "tp":
            got.append(failed(TP_ACCUMULATION_UNTRACKED))
            continue
        points.append(point)
        got.append(None)
    tracked = iter(track_phases(points, gpus_per_node=gpus_per_node, gpu=gpu) if points else [])
    out = []
    for job, early in zip(jobs, got, strict=True):
        t = early or next(tracked)
        # a micro-batch's FLOPs, whatever the number tracked per step
        out.append(replace(t, flops=t.flops / int(job.config.knobs["grad_accum"])))
    return out


def run_job(job: Job, gpus_per_node: int, gpu: bool = False) -> Tracked:
    return run_build((job,), gpus_per_node, gpu)[0]


def _extrapolated(a: Tracked, b: Tracked, small: int, world: int) -> Tracked:
    # m(w) = A + K / w through m(s) = a and m(2s) = b: K = 2s (a - b), so
    # m(world) = a + K (1/world - 1/s) = a + (a - b)(2s / world - 2)
    return a.plus(a.minus(b), 2 * small / world - 2)


def _at_world(c: Config, ws: tuple[int, ...], got: dict[tuple, Tracked]) -> Tracked:
    """The smallest micro-batch's figures at ``c``'s own world, from its trackings at ``ws``."""
    first = _got(got, c, ws[0])
    if first.error:
        return first
    if len(ws) == 1:
        how = "" if ws[0] == c.world_size else f"; at {ws[0]} ranks (groups of its state alike)"
        return replace(first, how=first.how + how)
    second = _got(got, c, ws[1])
    if second.error:
        return second
    at = _extrapolated(first, second, ws[0], c.world_size)
    return replace(at, how=f"{first.how}; at {ws[0]} and {ws[1]} ranks, extrapolated as a + b/n")


def _largest(c: Config, lo: Config, ws: tuple[int, ...], got: dict, lo_at: Tracked) -> Tracked:
    """The largest micro-batch at ``c``'s world: tracked at the smaller proxy, moved by the
    smallest micro-batch's change from there to the world (see the module's docstring)."""
    if len(ws) == 1:
        return _at_world(c, ws, got)
    return _moved(c, lo, ws, got, lo_at, f"micro-batch {lo.micro_batch}")


def _moved(c: Config, like: Config, ws: tuple[int, ...], got: dict, like_at: Tracked, as_: str):
    """``c`` at its world: tracked at the smaller proxy world, moved from there by ``like``'s
    change to the world (``like_at``): the world moves the sharded state, which ``c`` and
    ``like`` hold alike; what tells them apart (a micro-batch's activations, checkpointing's)
    the world does not move."""
    here = _got(got, c, ws[0])
    if here.error or like_at.error:
        return here if here.error else like_at
    moved = here.plus(like_at.minus(_got(got, like, ws[0])), 1.0)
    return replace(moved, how=f"{here.how}; at {ws[0]} ranks, moved to {c.world_size} as {as_}")


def schedule(configs: list[Config]) -> tuple[list[Job], Callable[[dict[tuple, Tracked]], dict]]:
    """The trackings ``configs`` need, and the function from their results (by ``Job.key``)
    to each memory key's figures."""
    by_layout: dict[tuple, dict[int, Config]] = {}
    for c in map(tracked_as, configs):
        key = memory_key(c)
        by_layout.setdefault(key[:3] + key[4:], {}).setdefault(c.micro_batch, c)
    smallest = {key: group[min(group)] for key, group in by_layout.items()}
    lows = {memory_key(c) for c in smallest.values()}

    def plain(c: Config) -> Config | None:
        """``c``'s plain twin where ``c`` is checkpointed and its twin is a layout's smallest
        micro-batch too (tracked at every world ``c``'s would be)."""
        if c.knobs["activation_checkpointing"] != "on":
            return None
        twin = replace(c, knobs={**c.knobs, "activation_checkpointing": "off"})
        return twin if memory_key(twin) in lows else None

    def moved_as(lo: Config, ws: tuple[int, ...]) -> Config | None:
        """The plain twin a layout tracked at two proxy worlds is moved to the world as."""
        return plain(lo) if len(ws) > 1 else None

    jobs: dict[tuple, Job] = {}
    for key, lo in smallest.items():
        hi = by_layout[key][max(by_layout[key])]
        ws = worlds(lo)
        # a checkpointed layout with a plain twin: its own trackings at the smaller proxy only
        at = ws if moved_as(lo, ws) is None else ws[:1]
        for job in [_job(lo, w) for w in at] + [_job(hi, ws[0])]:
            jobs.setdefault(job.key, job)

    def assemble(got: dict[tuple, Tracked]) -> dict[tuple, Tracked]:
        memo: dict[tuple, Tracked] = {}
        for group in by_layout.values():
            lo, hi = group[min(group)], group[max(group)]
            ws = worlds(lo)
            twin = moved_as(lo, ws)
            if twin is None:
                lo_at = _at_world(lo, ws, got)
            else:
                lo_at = _moved(lo, twin, ws, got, _at_world(twin, ws, got), "checkpointing off")
            memo[memory_key(lo)] = lo_at
            if hi is lo:
                continue
            memo[memory_key(hi)] = hi_at = _largest(hi, lo, ws, got, lo_at)
            for m, c in group.items():
                if c is not lo and c is not hi:
                    memo[memory_key(c)] = _between(lo_at, hi_at, lo.micro_batch, hi.micro_batch, m)
        return memo

    return list(jobs.values()), assemble


def _between(a: Tracked, b: Tracked, lo: int, hi: int, m: int) -> Tracked:
    """A micro-batch between a layout's smallest and largest, from those two: what a rank
    holds is its state plus activations and temporaries that grow with the micro-batch, and
    FLOPs grow with it alike (tests/test_plan.py checks one against its tracking)."""
    if a.error or b.error:
        return a if a.error else b
    between = a.plus(b.minus(a), (m - lo) / (hi - lo))
    return replace(between, how=f"{a.how}; between micro-batches {lo} and {hi}")


def figures(c: Config, memo: dict[tuple, Tracked]) -> Tracked:
    """``c``'s figures from the assembled trackings, saying where FSDP2's stand for FSDP1's."""
    stand_in = tracked_as(c)
    got = memo[memory_key(stand_in)]
    if stand_in != c and not got.error:
        return replace(got, how=f"FSDP2's figure (FSDP1 stands in); {got.how}")
    return got


def track_config(c: Config, gpus_per_node: int = 8, gpu: bool = False) -> Tracked:
    """One configuration's figures, tracked as a plan would (tests and benchmarks)."""
    jobs, assemble = schedule([c])
    got = {}
    for build in builds(jobs):
        keys = [j.key for j in build]
        got.update(zip(keys, run_build(build, gpus_per_node, gpu), strict=True))
    return figures(c, assemble(got))
