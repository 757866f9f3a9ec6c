"""Which fake trackings a plan's configurations need, and how each one's figures derive from
them.

Tracking under fake tensors (``memory.py``) is the plan's cost, so configurations share it
where the memory cannot differ, and the rest is derived from the fewest trackings:

- DDP's bucket size does not change what a rank holds (the buckets hold every gradient
  whatever their size). Accumulation is tracked at two micro-batches per step, whatever the
  configuration's number: from the second on, each micro-batch runs with the gradients of the
  ones before it live (the tensors it accumulates into), and the peak is the same with two as
  with eight; the FLOPs of ``accum`` micro-batches are ``accum`` times one's. One micro-batch
  would miss those gradients: none lives through its forward.
- FSDP1's SHARD_GRAD_OP takes FSDP2's tracking (its implementation's row says so); FSDP1's
  other shardings are tracked as themselves (``tracked_as``).
- A layout whose state is sharded over a group that does not grow with the world (DDP's
  replicas, a TP group, FSDP's NO_SHARD, a hybrid shard group: its family's ``state_group``)
  is tracked at two of those groups: a rank holds the same whatever their number.
- A layout sharded over the whole world, at more than ``PROXY_WORLD`` ranks, is tracked at
  two smaller worlds and extrapolated as ``a + b / world``: what a rank holds of sharded state
  falls as 1/world; the rest (activations, a unit's gathered parameters) does not change.
- The micro-batches of one layout: its smallest and largest are tracked and those between
  interpolated (activations and FLOPs grow with the micro-batch). The largest is tracked at
  the smaller proxy world only and takes the smallest's change with the world: the world
  moves the sharded state, the micro-batch the activations, and neither moves the other.
- A checkpointed layout of a world-sharded kind whose plain twin (checkpointing off, its
  smallest micro-batch) is in the plan: tracked at the smaller proxy world only and moved to
  the world as its twin is (checkpointing moves the activations, not the sharded state; what
  this misses: docs/benchmarks.md, "Planned memory").
- The trackings of one layout at one world, whatever their micro-batch, accumulation and
  checkpointing (``PHASE_KNOBS``), share one build (``builds``): ``memory.track_phases``
  steps each in turn on it.

The trackings a plan needs are a value (``TrackingPlan``): its jobs, and each layout's rule for
combining their figures (``Layout``), applied once the jobs have run (``TrackingPlan.assemble``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.plan.families import FAMILIES
from bench.plan.space import Config
from bench.plan.tracked import Tracked
from parallel_kernels.compiling import compiles
from parallel_kernels.strategies import STRATEGIES

# What one build steps each way in turn (bench/plan/memory.py's phases), the bucket size
# besides: it does not change what a rank holds.
PHASE_KNOBS = ("bucket_cap_mb", "grad_accum", "activation_checkpointing")
PROXY_WORLD = 64  # layouts sharded over the world beyond this many ranks use smaller worlds
PROXY_MIN = 16  # the smaller proxy world's floor (shards of real models split evenly there)


@dataclass(frozen=True)
class MemoryKey:
    """What a rank's memory depends on: a configuration but its bucket size and how many
    micro-batches it accumulates (whether it does counts, as a knob)."""

    strategy: str
    impl: str
    knobs: tuple
    micro_batch: int | None  # None: the layout's key, whatever the micro-batch
    world_size: int

    def layout(self) -> MemoryKey:
        return replace(self, micro_batch=None)


def memory_key(c: Config) -> MemoryKey:
    knobs = {k: v for k, v in c.knobs.items() if k not in ("bucket_cap_mb", "grad_accum")}
    knobs["accumulates"] = c.accumulates
    return MemoryKey(c.strategy, c.impl, tuple(sorted(knobs.items())), c.micro_batch, c.world_size)


def tracked_as(c: Config) -> Config:
    """The configuration whose tracking gives ``c``'s figures: its own, but where the
    implementation's row names another implementation's (``memory_as``) for the knobs' values
    it cannot track as itself. FSDP1's SHARD_GRAD_OP is FSDP2's: torch's FSDP1 fails a step
    under fake tensors there ("the unsharded flat parameter should be allocated"), and both
    hold the same ZeRO shards of the same tensors, gathered unit by unit. FSDP1's other
    shardings are tracked as themselves (``memory_own``), with the tracker's gradient hooks left
    off its original parameters, views of the flat one (``fakes.PeakTracker``): its NO_SHARD
    reduces its flat gradient in place, and its FULL_SHARD holds the next flat unit gathered
    beside the current one in backward, which FSDP2's figure misses (docs/benchmarks.md,
    "Planned memory")."""
    c = eager(c)
    impl = STRATEGIES[c.strategy].impls[c.impl]
    if impl.memory_as is None or any(c.knobs.get(k) in v for k, v in impl.memory_own.items()):
        return c
    return replace(c, impl=impl.memory_as)


def offset_twins(c: Config) -> tuple[Config, Config] | None:
    """Where ``c``'s figures are another implementation's (``tracked_as``) and its row names
    knob values where both are tracked (``memory_offset_at``): ``c`` at those values as itself
    and as the other. Their difference moves the other's figure to ``c``'s: FSDP1 holds over
    FSDP2 in SHARD_GRAD_OP what it holds in FULL_SHARD (docs/benchmarks.md, "Planned: every
    mode under fake tensors")."""
    plain = eager(c)
    impl = STRATEGIES[c.strategy].impls[c.impl]
    if tracked_as(c) == plain or not impl.memory_offset_at:
        return None
    own = replace(plain, knobs={**plain.knobs, **impl.memory_offset_at})
    return own, replace(own, impl=impl.memory_as)


def eager(c: Config) -> Config:
    """``c`` without ``compile``: a compiled configuration's memory is its eager twin's, tracked
    as that (dynamo does not run under the tracker's fake tensors; inductor's fused kernels
    hold fewer temporaries, so the eager figure is an upper bound on them, docs/plan.md)."""
    if not compiles(c.knobs):
        return c
    return replace(c, knobs={k: v for k, v in c.knobs.items() if k != "compile"})


def worlds(c: Config) -> tuple[int, ...]:
    """The fake world sizes ``c`` is tracked at: its own, two groups of a fixed state group
    (its family's ``state_group``), or two proxies of a world-sharded layout (``a + b / n``)."""
    world = c.world_size
    group = FAMILIES[c.family].state_group(c.knobs, world)
    if group is not None:
        return (2 * group,) if world > 2 * group else (world,)
    small = max(PROXY_MIN, 4 * c.tp_degree)
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
    def key(self) -> tuple[MemoryKey, int]:
        return memory_key(self.config), self.world


def _job(c: Config, world: int) -> Job:
    return Job(replace(c, knobs={**c.knobs, "grad_accum": 2 if c.accumulates else 1}), world)


def _got(got: dict[tuple, Tracked], c: Config, world: int) -> Tracked:
    return got[_job(c, world).key]


def builds(jobs: tuple[Job, ...] | list[Job]) -> list[tuple[Job, ...]]:
    """``jobs`` grouped by what one build serves: the same layout and knobs at the same world,
    whatever the micro-batch, accumulation and activation checkpointing
    (``memory.track_phases`` steps each in turn)."""
    out: dict[tuple, list[Job]] = {}
    for job in jobs:
        c = job.config
        knobs = {k: v for k, v in c.knobs.items() if k not in PHASE_KNOBS}
        built = (c.strategy, c.impl, tuple(sorted(knobs.items())), job.world)
        out.setdefault(built, []).append(job)
    return [tuple(group) for group in out.values()]


@dataclass(frozen=True)
class Layout:
    """One layout's configurations, one per micro-batch, and how their figures are made: the
    smallest micro-batch tracked at ``worlds`` (or, where ``twin`` is given, at the smaller
    only and moved to the world as that plain twin is), the largest at the smaller proxy world
    and moved as the smallest is, those between interpolated."""

    by_micro: dict[int, Config] = field(hash=False)
    worlds: tuple[int, ...]
    twin: Config | None  # the checkpointed smallest's plain twin, tracked at every world

    @property
    def smallest(self) -> Config:
        return self.by_micro[min(self.by_micro)]

    @property
    def largest(self) -> Config:
        return self.by_micro[max(self.by_micro)]

    def jobs(self) -> list[Job]:
        lo, ws = self.smallest, self.worlds
        at = ws if self.twin is None else ws[:1]
        return [_job(lo, w) for w in at] + [_job(self.largest, ws[0])]

    def figures(self, got: dict[tuple, Tracked]) -> dict[MemoryKey, Tracked]:
        """Each micro-batch's figures at the layout's world, from the jobs' trackings."""
        lo, hi, ws = self.smallest, self.largest, self.worlds
        if self.twin is None:
            lo_at = _at_world(lo, ws, got)
        else:
            twin_at = _at_world(self.twin, ws, got)
            lo_at = _moved(lo, self.twin, ws, got, twin_at, "checkpointing off")
        out = {memory_key(lo): lo_at}
        if hi is lo:
            return out
        out[memory_key(hi)] = hi_at = _largest(hi, lo, ws, got, lo_at)
        for m, c in self.by_micro.items():
            if c is not lo and c is not hi:
                out[memory_key(c)] = _between(lo_at, hi_at, lo.micro_batch, hi.micro_batch, m)
        return out


@dataclass(frozen=True)
class TrackingPlan:
    """The trackings a plan's configurations need (``jobs``, each once) and the layouts whose
    figures they make."""

    jobs: tuple[Job, ...]
    layouts: tuple[Layout, ...]

    def assemble(self, got: dict[tuple, Tracked]) -> dict[MemoryKey, Tracked]:
        """Each memory key's figures, from the jobs' trackings (by ``Job.key``)."""
        memo: dict[MemoryKey, Tracked] = {}
        for layout in self.layouts:
            memo.update(layout.figures(got))
        return memo


def plan_trackings(configs: list[Config]) -> TrackingPlan:
    """The trackings ``configs`` need: their layouts (a memory key but its micro-batch), each
    tracked as the module's docstring says."""
    by_layout: dict[MemoryKey, dict[int, Config]] = {}
    twins = (t for c in configs for t in offset_twins(c) or ())
    for c in map(tracked_as, [*configs, *twins]):
        by_layout.setdefault(memory_key(c).layout(), {}).setdefault(c.micro_batch, c)
    smallest = {memory_key(group[min(group)]) for group in by_layout.values()}
    layouts = []
    for group in by_layout.values():
        lo = group[min(group)]
        ws = worlds(lo)
        twin = _plain_twin(lo, smallest) if len(ws) > 1 else None
        layouts.append(Layout(group, ws, twin))
    jobs: dict[tuple, Job] = {}
    for layout in layouts:
        for job in layout.jobs():
            jobs.setdefault(job.key, job)
    return TrackingPlan(tuple(jobs.values()), tuple(layouts))


def _plain_twin(c: Config, smallest: set[MemoryKey]) -> Config | None:
    """``c``'s plain twin where ``c`` is checkpointed and its twin is a layout's smallest
    micro-batch too (tracked at every world ``c``'s would be)."""
    if not c.checkpointed:
        return None
    twin = replace(c, knobs={**c.knobs, "activation_checkpointing": "off"})
    return twin if memory_key(twin) in smallest else None


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
    ``like`` hold alike; what differs between them (a micro-batch's activations,
    checkpointing's) the world does not move."""
    here = _got(got, c, ws[0])
    if here.error or like_at.error:
        return here if here.error else like_at
    moved = here.plus(like_at.minus(_got(got, like, ws[0])), 1.0)
    return replace(moved, how=f"{here.how}; at {ws[0]} ranks, moved to {c.world_size} as {as_}")


def _between(a: Tracked, b: Tracked, lo: int, hi: int, m: int) -> Tracked:
    """A micro-batch between a layout's smallest and largest, from those two: what a rank
    holds is its state plus activations and temporaries that grow with the micro-batch, and
    FLOPs grow with it alike (tests/test_plan.py checks one against its tracking)."""
    if a.error or b.error:
        return a if a.error else b
    between = a.plus(b.minus(a), (m - lo) / (hi - lo))
    return replace(between, how=f"{a.how}; between micro-batches {lo} and {hi}")


def figures(c: Config, memo: dict[MemoryKey, Tracked]) -> Tracked:
    """``c``'s figures from the assembled trackings, saying where FSDP2's tracking gives
    FSDP1's (plan.csv's ``memory_how``)."""
    as_tracked = tracked_as(c)
    got = memo[memory_key(as_tracked)]
    if as_tracked != eager(c) and not got.error:
        got = _offset(c, replace(got, how=f"FSDP2's figure (FSDP1 stands in); {got.how}"), memo)
    if eager(c) != c and not got.error:
        got = replace(got, how=f"eager's tracked memory (compile={c.knobs['compile']}); {got.how}")
    return got


def _offset(c: Config, got: Tracked, memo: dict[MemoryKey, Tracked]) -> Tracked:
    """The stand-in's figures ``got`` moved by ``c``'s own difference from it where both are
    tracked (``offset_twins``); left as they are, saying why, where either tracking failed."""
    twins = offset_twins(c)
    if twins is None:
        return got
    own, other = (memo[memory_key(t)] for t in twins)
    at = ", ".join(f"{k}={v}" for k, v in twins[0].knobs.items() if v != c.knobs.get(k))
    if own.error or other.error:
        why = (own.error or other.error).splitlines()[0]
        return replace(got, how=f"{got.how}; its own difference at {at} unknown ({why})")
    moved = got.plus(own.minus(other), 1.0)
    return replace(moved, how=f"{got.how}; moved by its own difference from FSDP2's at {at}")
