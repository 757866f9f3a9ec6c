"""The memory stage of a pipelined family (``families.Family.pipelined``: ``pp``): each rank of
a pipeline tracked as the other families' ranks are (``memory.py``), the run's own code built
under ``FakeTensorMode`` over torch's fake process group, this process a chosen rank of the
pipeline, one step after a first followed by torch's ``MemTracker``; and the ops of each stage
counted for the time stage (``pipeline_counts.py``, ``pipeline_time.py``).

A rank holds its stage's parameters, gradients and AdamW state, the activations of the
micro-batches in flight (1F1B: at most p - s on stage s; GPipe: all m) and what the schedule
keeps to send (the reference's sends live to the step's end). Its micro-batches are alike, so
its memory over any schedule is composed from one tracked step of two micro-batches (GPipe's
F0 F1 B0 B1, each action marked: ``fakes.action_marks``): what a micro-batch holds in
flight, what it leaves once its backward ran, the gradients the first backward makes, each
action's transient above what is live before it (a later backward's apart: it accumulates into
the gradients), and the peaks after the schedule (its collectives) and in the optimiser's step
(``StageMemory``). Walking a schedule's order (``pipeline_theory``) over those gives the
rank's peak at any degree, micro-batch count and schedule (``compose``); a test holds it to the
rank tracked over the order itself.

The ranks that can hold the most are tracked: the first (the embedding, the most in flight),
the second (the most in flight of the middle ranks, which send both ways) and the last (the
head and the loss); the row's peak is the highest, and ``peak_stage`` says whose. Each is
tracked on a proxy pipeline of at most three stages (a stage's role is the same module
whatever the degree), of one and of two blocks a stage, and every figure extrapolated to the
stage's blocks (each block adds its parameters, state and activations alike); a model too
short for that proxy is cut at the row's own degree instead. A pipeline with data-parallel
replicas is tracked with two of them (a rank holds the same, its flat gradient all-reduce,
whatever their number); one whose replicas FSDP2 shards is tracked so too, its sharded state
then moved to its replicas (``stage_replicas.over_replicas``). One build per proxy, rank,
precision and sharding steps each micro-batch size and checkpointing in turn.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from dataclasses import dataclass, field, replace

import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.plan import memory
from bench.plan.fakes import (
    StageTracker,
    action_marks,
    backend_copies,
    fake_pipeline,
    fake_world,
)
from bench.plan.families import pipeline_blocks
from bench.plan.op_mix import OpMix
from bench.plan.pipeline_counts import CountJob, StageCounts, count_stages
from bench.plan.space import NO_CHECKPOINT_UNITS, Config, names_checkpoint_units
from bench.plan.stage_replicas import TRACKED_REPLICAS, over_replicas, replicas, sharded
from bench.plan.tracked import Tracked, failed
from bench.plan.tracking_workers import Progress, map_builds
from bench.plan.workspace import kernel_workspaces
from bench.runner.configure.resolve import PointRequest, VisitSettings, resolve_point
from bench.runner.train.step import Recipe, build_trainer
from parallel_kernels.checkpointing import set_checkpointing
from parallel_kernels.knobs import KNOBS
from parallel_kernels.models import workload
from parallel_kernels.pipeline_stages import block_ranges
from parallel_kernels.pipeline_theory import FORWARD, Pipeline, schedule_order
from parallel_kernels.workload import stamp, tensor_bytes

FIRST, SECOND, LAST = "first", "second", "last"
MiB = 2**20
TRACKED_MICROBATCHES = 2  # a tracked step's: GPipe's F0 F1 B0 B1


def stage_index(role: str, stages: int) -> int:
    return {FIRST: 0, SECOND: 1, LAST: stages - 1}[role]


def roles(stages: int) -> tuple[str, ...]:
    """The ranks that can hold the most: the first, the second (a middle one) and the last."""
    return (FIRST, SECOND, LAST) if stages >= 3 else (FIRST, LAST)


@dataclass(frozen=True)
class Proxy:
    """The pipeline a row's ranks are tracked on: ``stages`` stages of ``blocks`` blocks each
    (one tracking each; None: the model itself, cut into ``stages``)."""

    stages: int
    blocks: tuple[int, ...] | None


def proxy_of(degree: int, blocks: int) -> Proxy:
    """Three stages (first, second, last: what any degree's ranks are made of), or two for a
    model of two blocks; of one block a stage where every stage of the row has one, else of
    one and of two; the row's own cut where the model is too short for that proxy."""
    stages = min(blocks, 3)
    if blocks == degree:
        return Proxy(stages, (1,))
    if 2 * stages <= blocks:
        return Proxy(stages, (1, 2))
    return Proxy(degree, None)


Parts = dict[str, float]  # MiB by MemTracker's category (plan.csv's names), and "inputs"


def _plus(a: Parts, b: Parts, times: float = 1.0) -> Parts:
    return {k: a.get(k, 0.0) + times * b.get(k, 0.0) for k in a.keys() | b.keys()}


def _total(a: Parts) -> float:
    return sum(a.values())


@dataclass(frozen=True)
class StageMemory:
    """A pipeline rank's memory by what its schedule does, from one tracked step: live at the
    schedule's start (``start``); what the first forward leaves beyond a micro-batch's
    (``cached``: autocast's casts of the weights, kept to the step's end); what a micro-batch
    holds from its forward to its backward (``in_flight``) and leaves once its backward ran
    (``after``: its sends, kept to the step's end); the gradients the first backward makes;
    each action's transient above what is live before it (``first_forward``, ``forward``,
    ``first_backward``, ``backward``: a later one, accumulating); the peaks after the schedule
    (``post``: its collectives) and in the optimiser's step."""

    start: Parts
    cached: Parts
    in_flight: Parts
    after: Parts
    grads: Parts
    first_forward: Parts
    forward: Parts
    first_backward: Parts
    backward: Parts
    post: Parts
    optimiser: Parts

    def plus(self, other: StageMemory, times: float) -> StageMemory:
        """``self + times * other``, figure by figure (an extrapolation over blocks)."""
        return StageMemory(
            *(
                _plus(getattr(self, f.name), getattr(other, f.name), times)
                for f in dataclasses.fields(self)
            )
        )


def compose(mem: StageMemory, schedule: str, pipe: Pipeline, stage: int) -> Tracked:
    """The rank's step over its schedule's order: before each action, what is live (the start,
    the micro-batches in flight, what the backwards done left, the gradients once made), plus
    the action's transient; the highest of those and of the peak after the schedule, and the
    optimiser's peak, each a stage of the step (``Tracked.stages``)."""
    mem = _with_inputs(mem, pipe.microbatches)
    flight = done = 0
    best = mem.post
    for action in schedule_order(schedule, pipe, stage):
        live = _plus(_plus(mem.start, mem.in_flight, flight), mem.after, done)
        if flight or done:
            live = _plus(live, mem.cached)
        if done:
            live = _plus(live, mem.grads)
        if action.kind == FORWARD:
            first = not (flight or done)
            at = _plus(live, mem.first_forward if first else mem.forward)
            flight += 1
        else:
            at = _plus(live, mem.backward if done else mem.first_backward)
            flight, done = flight - 1, done + 1
        best = at if _total(at) > _total(best) else best
    stages = ((_total(best), best), (_total(mem.optimiser), mem.optimiser))
    peak, parts = max(stages, key=lambda s: s[0])
    return Tracked(peak, parts, 0.0, stages=stages)


def _with_inputs(mem: StageMemory, microbatches: int) -> StageMemory:
    """``mem`` with the step's batch, fetched at its start and live to its end, of
    ``microbatches`` micro-batches (it was tracked with ``TRACKED_MICROBATCHES``)."""
    scale = microbatches / TRACKED_MICROBATCHES

    def scaled(parts: Parts) -> Parts:
        return {**parts, "inputs": parts.get("inputs", 0.0) * scale}

    return replace(
        mem, start=scaled(mem.start), post=scaled(mem.post), optimiser=scaled(mem.optimiser)
    )


@dataclass(frozen=True)
class StageJob:
    """One rank of a proxy pipeline stepped once over two micro-batches: its build (model,
    implementation, precision, stages, blocks a stage, rank, replicas or not, sharded by FSDP2
    or not) and its phase (the micro-batches' samples, checkpointing)."""

    config: Config = field(compare=False)  # a row it serves (the progress line names it)
    model: str
    impl: str
    precision: str
    stages: int
    blocks: int | None
    rank: int
    replicas: bool
    micro_batch: int
    checkpointing: str  # a mode that treats every block alike (``memory.alike``)
    sharded: bool = False  # its replicas sharded by FSDP2 (``dp_shard``)

    @property
    def build(self) -> tuple:
        return (
            *(self.model, self.impl, self.precision, self.stages, self.blocks, self.rank),
            *(self.replicas, self.sharded),
        )

    def point(self, schedule: str = "gpipe", microbatches: int = TRACKED_MICROBATCHES):
        """The proxy's point, as ``bench/run.py`` resolves it: one pipeline of ``stages``
        ranks, or two replicas of it (where the knob table lets a pipeline have them),
        sharded by FSDP2 or not."""
        knobs = {
            "pp_schedule": schedule,
            "pp_microbatches": microbatches,
            "activation_checkpointing": self.checkpointing,
            "precision": self.precision,
            "grad_accum": 1,
        }
        world = self.stages
        if self.replicas and "pp_degree" in KNOBS:
            knobs["pp_degree"], world = self.stages, TRACKED_REPLICAS * self.stages
            knobs |= {"dp_shard": True} if self.sharded else {}
        return resolve_point(
            PointRequest(
                sweep="plan",
                values={"plan": f"pp{self.stages} rank {self.rank}"},
                model=self.model,
                strategy="pp",
                impl=self.impl,
                knobs=knobs,
                world_size=world,
                per_visit=VisitSettings(batch_size=microbatches * self.micro_batch),
            )
        )


def jobs_of(c: Config) -> dict[int | None, list[StageJob]]:
    """``c``'s trackings, by the proxy's blocks a stage: each role's job."""
    degree, m = int(c.knobs["pp_degree"]), int(c.knobs["pp_microbatches"])
    proxy = proxy_of(degree, memory_blocks(c.model))
    return {
        blocks: [
            StageJob(
                config=c,
                model=c.model,
                impl=c.impl,
                precision=c.knobs["precision"],
                stages=proxy.stages,
                blocks=blocks,
                rank=stage_index(role, proxy.stages),
                replicas=c.world_size > degree,
                micro_batch=c.micro_batch // m,
                checkpointing=c.checkpointing,
                sharded=sharded(c.knobs, c.world_size),
            )
            for role in roles(degree)
        ]
        for blocks in proxy.blocks or (None,)
    }


def memory_blocks(model: str) -> int:
    """The blocks the model's pipeline cut splits between the stages."""
    return pipeline_blocks(workload(model))


def count_job(c: Config, gpu: bool) -> CountJob:
    """The counting of ``c``'s stages' ops: a proxy of one block a stage, of three stages (two
    for a model of two blocks)."""
    m = int(c.knobs["pp_microbatches"])
    return CountJob(
        config=c,
        model=c.model,
        precision=c.knobs["precision"],
        checkpointing=c.checkpointing,
        stages=min(memory_blocks(c.model), 3),
        micro_batch=c.micro_batch // m,
        foreach=gpu,
    )


@dataclass(frozen=True)
class PipelineCosts:
    """What the time stage needs of a pipeline row, per stage in pipeline order: one
    micro-batch's forward and backward and the optimiser's step (``op_mix`` phases), the
    bytes stage s hands s + 1 per micro-batch, each stage's gradient bytes (its replicas'
    collectives), the tied weights' bytes (summed over the pipeline); and the tracked stages'
    peaks, MiB, the highest the row's (``peak_stage``)."""

    ops: tuple[OpMix, ...]
    sends: tuple[float, ...]
    grad_bytes: tuple[float, ...]
    shared_bytes: float
    peaks: dict[int, float]

    @property
    def peak_stage(self) -> int:
        return max(self.peaks, key=lambda s: self.peaks[s])

    def columns(self) -> dict:
        """plan.csv's: the most loaded stage, and each tracked stage's peak ("0:9.7;1:12.4")."""
        each = ";".join(f"{s}:{mib:.4g}" for s, mib in sorted(self.peaks.items()))
        return {"peak_stage": self.peak_stage, "stage_peaks_mib": each}


def stage_costs(c: Config, counts: StageCounts) -> tuple[tuple[OpMix, ...], tuple[float, ...]]:
    """Each stage's ops and gradient bytes at its blocks: its role's proxy stage (one block)
    and a block's more for each block beyond."""
    degree = int(c.knobs["pp_degree"])
    sizes = [len(r) for r in block_ranges(memory_blocks(c.model), degree)]
    proxy_roles = roles(len(counts.stages))
    ops, grads = [], []
    for s, blocks in enumerate(sizes):
        role = FIRST if s == 0 else LAST if s == degree - 1 else SECOND
        i = proxy_roles.index(role)
        ops.append(counts.stages[i].plus(counts.block, blocks - 1))
        grads.append(counts.params[i] + (blocks - 1) * counts.block_params)
    return tuple(ops), tuple(grads)


def _sends(c: Config, counts: StageCounts) -> tuple[float, ...]:
    """The bytes each stage hands the next per micro-batch (every block's output alike)."""
    return (counts.sends[0],) * (int(c.knobs["pp_degree"]) - 1)


def role_memory(c: Config, role: str, got: dict[tuple, StageMemory]) -> StageMemory:
    """One role's figures at its stage's blocks: along the proxy's one and two blocks a stage
    (or as the row's own cut tracked them)."""
    degree = int(c.knobs["pp_degree"])
    jobs = jobs_of(c)
    proxy = proxy_of(degree, memory_blocks(c.model))
    mine = {
        blocks: got[_key(next(j for j in js if j.rank == stage_index(role, proxy.stages)))]
        for blocks, js in jobs.items()
    }
    if len(mine) == 1:
        return next(iter(mine.values()))
    sizes = [len(r) for r in block_ranges(memory_blocks(c.model), degree)]
    blocks = sizes[stage_index(role, degree)]
    return mine[1].plus(mine[2].plus(mine[1], -1.0), blocks - 1)


def _replicas_memory(c: Config, role: str, got: dict) -> StageMemory:
    """One role's figures as its rank holds them: tracked with two replicas, moved to the
    row's where FSDP2 shards the stage over them (``stage_replicas.over_replicas``)."""
    mem = role_memory(c, role, got)
    if not sharded(c.knobs, c.world_size):
        return mem
    return over_replicas(mem, replicas(c.knobs, c.world_size))


def _key(job: StageJob) -> tuple:
    """What a tracking is of (all but the row that asked for it)."""
    return tuple(getattr(job, f.name) for f in dataclasses.fields(job) if f.compare)


def _how(c: Config, stage: int) -> str:
    degree = int(c.knobs["pp_degree"])
    proxy = proxy_of(degree, memory_blocks(c.model))
    tracked = ", ".join(str(stage_index(r, degree)) for r in roles(degree))
    how = f"stage {stage} of {degree}, the most loaded of {tracked}: composed over its order"
    how += f" from a step of {TRACKED_MICROBATCHES} micro-batches"
    if proxy.stages != degree:
        how += f" of a {proxy.stages}-stage proxy"
    if proxy.blocks == (1, 2):
        how += ", with 1 and 2 blocks a stage, extrapolated"
    if sharded(c.knobs, c.world_size):
        r = replicas(c.knobs, c.world_size)
        how += f"; sharded by FSDP2 over 2 replicas, its state moved to {r}"
    elif c.world_size > degree:
        how += "; with 2 replicas (a rank holds the same with more)"
    return how


def row_figures(c: Config, got: dict[tuple, StageMemory | str], counts: StageCounts) -> Tracked:
    """``c``'s figures: the most loaded rank's peak and parts over its schedule, a rank's
    FLOPs a step (the pipeline's over its ranks) and the stages' costs for the time stage."""
    if counts.error:
        return failed(counts.error)
    bad = [g for js in jobs_of(c).values() for j in js if isinstance(g := got[_key(j)], str)]
    if bad:
        return failed(bad[0])
    degree, m = int(c.knobs["pp_degree"]), int(c.knobs["pp_microbatches"])
    pipe = Pipeline(degree, m)
    per_stage = {
        stage_index(role, degree): compose(
            _replicas_memory(c, role, got),
            c.knobs["pp_schedule"],
            pipe,
            stage_index(role, degree),
        )
        for role in roles(degree)
    }
    peaks = {s: t.peak_mib for s, t in per_stage.items()}
    ops, grads = stage_costs(c, counts)
    flops = sum(o.of(("forward", "backward")).flops() for o in ops) * m / degree
    again = counts.block_recompute * memory_blocks(c.model) * m / degree
    costs = PipelineCosts(ops, _sends(c, counts), grads, counts.shared, peaks)
    top = per_stage[costs.peak_stage]
    how = _how(c, costs.peak_stage)
    return replace(top, flops=flops, recompute_flops=again, how=how, pipeline=costs)


@dataclass(frozen=True)
class StagePlan:
    """A pipelined family's rows and the work their figures need: the builds whose phases are
    tracked and the countings (``items``, each a tuple of jobs, for the memory stage's pool:
    ``run_item``), and why a row is refused unbuilt."""

    configs: tuple[Config, ...]
    gpu: bool
    items: tuple[tuple, ...]
    refused: tuple[str, ...]

    def assemble(self, done: list[list]) -> list[Tracked]:
        """Each row's figures, in order, from ``items``' results (``done``, in their order)."""
        got: dict[tuple, StageMemory | str] = {}
        counted: dict[CountJob, StageCounts] = {}
        for item, results in zip(self.items, done, strict=True):
            for job, result in zip(item, results, strict=True):
                if isinstance(job, CountJob):
                    counted[job] = result
                else:
                    got[_key(job)] = result
        return [
            failed(why) if why else row_figures(c, got, counted[count_job(c, self.gpu)])
            for c, why in zip(self.configs, self.refused, strict=True)
        ]


def plan_stages(configs: list[Config], gpu: bool) -> StagePlan:
    """The trackings and countings a pipelined family's rows need, each once: its ranks'
    builds (their phases together) and its stages' countings."""
    refused = tuple(_refused(c) for c in configs)
    jobs: dict[tuple, StageJob] = {}
    counts: dict[CountJob, CountJob] = {}
    for c, why in zip(configs, refused, strict=True):
        if why:
            continue
        for js in jobs_of(c).values():
            for j in js:
                jobs.setdefault(_key(j), j)
        counts.setdefault(count_job(c, gpu), count_job(c, gpu))
    builds: dict[tuple, list] = {}
    for j in jobs.values():
        builds.setdefault(j.build, []).append(j)
    items = [tuple(b) for b in builds.values()] + [(j,) for j in counts.values()]
    return StagePlan(tuple(configs), gpu, tuple(items), refused)


def predict(
    configs: list[Config], gpus_per_node: int, gpu: bool, workers: int, progress: Progress | None
) -> list[Tracked]:
    """Each pipeline configuration's figures, in order, its work in ``workers`` processes."""
    plan = plan_stages(configs, gpu)
    run = functools.partial(run_item, gpus_per_node=gpus_per_node, gpu=gpu)
    return plan.assemble(map_builds(run, list(plan.items), workers, progress))


def run_item(item: tuple, gpus_per_node: int, gpu: bool) -> list:
    """A worker's work on one item: a build's phases tracked, or a counting."""
    if isinstance(item[0], CountJob):
        return [count_stages(j) for j in item]
    return track_stage_build(item, gpus_per_node, gpu)


UNALIKE = (
    "a pipeline's memory is tracked on stages of one and two blocks, which do not checkpoint "
    "every N-th block as the row does (selective:layer=N: not planned for pipelines)"
)


def _refused(c: Config) -> str:
    """Why ``c`` is its error row, unbuilt: a checkpointed row of a model that names no
    blocks to recompute (its run fails saying so), or one checkpointing every N-th block,
    which the proxy's stages of one and two blocks do not lay out as the row's are."""
    if c.checkpointed and not names_checkpoint_units(c.model):
        return NO_CHECKPOINT_UNITS
    if not memory.alike(c.checkpointing):
        return UNALIKE
    return ""


def track_stage_build(
    jobs: tuple[StageJob, ...], gpus_per_node: int, gpu: bool
) -> list[StageMemory | str]:
    """The phases of one build, in order, each its ``StageMemory`` or its error; a phase that
    fails is its error and the phases after it are tracked on a build of their own (a failed
    step leaves the build unusable)."""
    points = [(job, job.point()) for job in jobs]
    got = _built(points, gpus_per_node, gpu, _phase_memory)
    rest = jobs[len(got) :]
    return got + (track_stage_build(rest, gpus_per_node, gpu) if rest else [])


def _built(points, gpus_per_node: int, gpu: bool, phase) -> list:
    """``phase(tracker, trainer, inputs, gpu)`` of each (job, point) on one build of their
    rank (the first's): the pipeline built by the strategy's implementation at the fake rank
    (outside the tracker: the reference keeps nothing of its build but the stage, which the
    step's tracking counts), the plain model then dropped (the rank keeps its stage only, as a
    run does), each phase's checkpointing switched on it. A failure is its phase's error, and
    ends the build."""
    first_job, first = points[0]
    blocks = None if first_job.blocks is None else first_job.blocks * first_job.stages
    # a step's batches, real: made outside the fake mode, which the sampler cannot run in
    inputs = [memory.step_inputs(point) for _, point in points]
    out: list = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's module-hierarchy notes: the row says more
        try:
            twin = memory.meta_plain(first_job.model, blocks)
            env = memory.plan_env(first.world_size, gpus_per_node)
            with (
                fake_world(first.world_size, first_job.rank),
                fake_pipeline(),
                backend_copies("nccl" if gpu else "gloo"),
                FakeTensorMode(allow_non_fake_inputs=True),
            ):
                plain = memory.plain_model(first_job.model, blocks, twin)
                recipe = Recipe(batches=iter(()), plain=plain, foreach=True if gpu else None)
                trainer = build_trainer(first, env, dist.group.WORLD, recipe)
                del plain, recipe, twin  # the other stages: freed, as a run frees them
                wrapped = stamp(trainer.wrapped, workload(first_job.model))  # its blocks
                memory.optimiser_state(trainer)
                tracker = StageTracker()
                mode = first_job.checkpointing
                for (job, point), batches in zip(points, inputs, strict=True):
                    if job.checkpointing != mode:
                        mode = job.checkpointing
                        set_checkpointing(wrapped, mode)
                    phased = replace(trainer, point=point, accum=1)
                    out.append(phase(tracker, phased, batches, gpu))
        except Exception as e:  # noqa: BLE001 - this phase's row; the rest rebuilt
            out.append(memory.failure(e).error)
    return out


def _phase_memory(tracker: StageTracker, trainer, inputs: list, gpu: bool) -> StageMemory:
    """One step of two micro-batches (GPipe: F0 F1 B0 B1), each action marked, read as what
    each part of the schedule holds (``StageMemory``)."""
    trainer.opt.zero_grad(set_to_none=True)
    tracker.track_external(trainer.wrapped, trainer.opt)
    tracker.reset_mod_stats()
    with action_marks(tracker) as marks, tracker, kernel_workspaces(not gpu):
        trainer.micro_step(*inputs[-1], last=True)
        post = tracker.restart_peak()
        trainer.finish_step()
    held = {"inputs": tensor_bytes(inputs) / MiB}  # real, made before the tracker
    peaks = [_parts(p) for p, _ in marks]
    live = [_plus(_parts(now), held) for _, now in marks]
    if len(marks) != 6:  # before F0, after F0 F1 B0 B1 and the sends' wait
        raise RuntimeError(f"a step of 2 micro-batches marked {len(marks)} times, not 6")
    in_flight = _plus(live[2], live[1], -1.0)
    after = _plus(_plus(live[4], live[3], -1.0), in_flight)
    return StageMemory(
        start=live[0],
        cached=_plus(_plus(live[1], live[0], -1.0), in_flight, -1.0),
        in_flight=in_flight,
        after=after,
        grads=_plus(_plus(_plus(live[3], live[2], -1.0), in_flight), after, -1.0),
        first_forward=_plus(_plus(peaks[1], held), live[0], -1.0),
        forward=_plus(_plus(peaks[2], held), live[1], -1.0),
        first_backward=_plus(_plus(peaks[3], held), live[2], -1.0),
        backward=_plus(_plus(peaks[4], held), live[3], -1.0),
        post=_plus(_parts(post), held),
        optimiser=_plus(_parts(tracker.get_tracker_snapshot("peak")), held),
    )


def _parts(snapshot: dict) -> Parts:
    """A MemTracker snapshot's categories, MiB, by plan.csv's names."""
    cpu = next(iter(snapshot.values())) if snapshot else {}
    return {memory.CATEGORIES[str(k.value)]: v / MiB for k, v in cpu.items() if k != "Total"}


def track_over_order(c: Config, role: str, gpus_per_node: int = 8) -> Tracked:
    """``c``'s rank of ``role`` tracked over its own schedule and micro-batches at its own
    degree, the model itself cut (what ``compose`` is held to by a test)."""
    degree = int(c.knobs["pp_degree"])
    m = int(c.knobs["pp_microbatches"])
    job = StageJob(
        config=c,
        model=c.model,
        impl=c.impl,
        precision=c.knobs["precision"],
        stages=degree,
        blocks=None,
        rank=stage_index(role, degree),
        replicas=c.world_size > degree,
        micro_batch=c.micro_batch // m,
        checkpointing=c.checkpointing,
        sharded=sharded(c.knobs, c.world_size),
    )
    point = job.point(c.knobs["pp_schedule"], m)
    (got,) = _built([(job, point)], gpus_per_node, False, _whole_step)
    return got if isinstance(got, Tracked) else failed(got)


def _whole_step(tracker: StageTracker, trainer, inputs: list, gpu: bool) -> Tracked:
    return memory.peak_of_step(tracker, trainer, inputs, here=not gpu)
