"""The memory stage: each configuration's peak memory per rank, predicted without its hardware
or its weights (``predict_memory``), from the fewest trackings that serve them all
(``trackings.py``), tracked in a pool of processes (``tracking_workers.py``).

A tracking builds the configuration by the suite's own code (``bench.runner.train.step``: the
plain model, activation checkpointing, the strategy's implementation, AdamW) under torch's
``FakeTensorMode`` over torch's fake process group at the target world size, so no weight is
allocated and no collective moves a byte; torch's ``MemTracker``
(``torch.distributed._tools.mem_tracker``) then follows one training step after a first one
(the optimiser's state exists by then, as in the harness's measured step) and reports the most
bytes live at once: parameters, gradients, optimiser state, activations and temporaries. This
is the method of torchtitan's memory estimator (FSDP2 under ``FakeTensorMode`` with
``FSDPMemTracker``), applied to every strategy the suite runs.

What lets the suite's own code run there, and what the tracker is told that it cannot see
(a backend's copies of a collective's buffers), is ``fakes.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.plan.fakes import (
    PeakTracker,
    backend_copies,
    fake_ddp,
    fake_world,
    resolve_ddp_hooks,
    untracked_propagation,
)
from bench.plan.families import FAMILIES
from bench.plan.fusion import compiled_regions, fused
from bench.plan.op_mix import OpMix, along_batch, mix_of
from bench.plan.space import NO_CHECKPOINT_UNITS, Config, names_checkpoint_units
from bench.plan.tracked import Tracked, collinear, failed, shifted
from bench.plan.tracking_workers import Progress, map_builds
from bench.plan.trackings import Job, builds, figures, plan_trackings
from bench.plan.workspace import kernel_workspaces
from bench.roofline.op_count import OpCounter, Record
from bench.runfolder.points import PointRecord
from bench.runner.session.distenv import DistEnv
from bench.runner.train.data import Batches
from bench.runner.train.step import Recipe, build_trainer
from parallel_kernels.checkpointing import checkpoint_mode, parse_checkpointing, set_checkpointing
from parallel_kernels.compiling import compiles
from parallel_kernels.facts import torch_dtype
from parallel_kernels.float8 import convert_blocks, converts
from parallel_kernels.models import build_model, workload
from parallel_kernels.workload import block_list, keep_blocks, stamp, tensor_bytes

CPU = torch.device("cpu")
CANNOT_ACCUMULATE = "the implementation cannot accumulate gradients (no way to skip their sync)"

MiB = 2**20
SMALL = 4  # blocks: a model of at most this many is tracked in full (``track_phases``)
STEPS = 4  # blocks: the most a larger model is tracked with to extrapolate from, else in full
# MemTracker's categories, as plan.csv names them (its "Total" is the peak).
CATEGORIES = {
    "Parameter": "params",
    "Gradient": "grads",
    "Optstate": "optim",
    "Activation": "activations",
    "Temp": "temporaries",
    "Buffer": "buffers",
    "Other": "other",
}


def predict_memory(
    configs: list[Config],
    *,
    gpus_per_node: int,
    gpu: bool = False,
    workers: int = 1,
    progress: Progress | None = None,
) -> list[Tracked]:
    """Each configuration's figures, in order: its peak per rank with its parts, the FLOPs of
    one micro-batch, or its error. The trackings run in ``workers`` processes; ``gpu``: the
    target is a GPU, its step tracked as a GPU runs it (AdamW foreach, NCCL's collectives)."""
    plan = plan_trackings(configs)
    groups = builds(plan.jobs)
    track = functools.partial(run_build, gpus_per_node=gpus_per_node, gpu=gpu)
    got = map_builds(track, groups, workers, progress)
    memo = plan.assemble(
        {
            job.key: t
            for group, ts in zip(groups, got, strict=True)
            for job, t in zip(group, ts, strict=True)
        }
    )
    return [levered(c, figures(c, memo), gpu) for c in configs]


def levered(c: Config, t: Tracked, gpu: bool) -> Tracked:
    """``t`` (a configuration's figures, tracked eager) with its ops as ``c``'s ``compile``
    runs them (``fusion.py``), counted on the plain model as the eager ones are; a pipeline's
    compiled stages are not counted (its row says so). An fp8 row's memory is tracked as the
    run builds it (torchao's float8 Linears under fake tensors), and says so."""
    if converts(c.knobs.get("precision", "fp32")) and not t.error:
        t = replace(t, how=f"fp8 tracked (torchao's float8 under fake tensors); {t.how}")
    if not compiles(c.knobs) or t.error:
        return t
    if FAMILIES[c.family].pipelined:
        return failed(
            "compile is planned for layouts of one stage (a pipeline's stages are counted eager)"
        )
    blocks = blocks_of(c.model)
    of = Counting(
        c.model,
        c.checkpointing,
        blocks if blocks > 2 else None,
        c.knobs.get("precision", "fp32"),
        gpu,
        c.knobs["compile"],
    )
    return replace(t, ops=step_ops(of, c.point().batch_per_replica))


def track_config(c: Config, gpus_per_node: int = 8, gpu: bool = False) -> Tracked:
    """One configuration's figures, tracked as a plan would (tests and benchmarks)."""
    return predict_memory([c], gpus_per_node=gpus_per_node, gpu=gpu)[0]


def run_build(jobs: tuple[Job, ...], gpus_per_node: int, gpu: bool = False) -> list[Tracked]:
    """The trackings of ``jobs`` (one build's, ``trackings.builds``), in order; a job whose
    configuration does not resolve or cannot be built is its error, the others are tracked."""
    early: list[Tracked | None] = []
    points = []
    for job in jobs:
        try:
            job.config.point()  # the configuration itself must resolve, not only its proxy
            point = job.config.point(world_size=job.world)
        except ValueError as e:
            early.append(failed(f"{e}"))
            continue
        refused = _refused(job.config, point)
        early.append(failed(refused) if refused else None)
        if not refused:
            points.append(point)
    tracked = iter(track_phases(points, gpus_per_node=gpus_per_node, gpu=gpu) if points else [])
    out = []
    for job, known in zip(jobs, early, strict=True):
        t = known or next(tracked)
        # a micro-batch's FLOPs, whatever the number tracked per step
        accum = int(job.config.knobs["grad_accum"])
        out.append(replace(t, flops=t.flops / accum, recompute_flops=t.recompute_flops / accum))
    return out


def run_job(job: Job, gpus_per_node: int, gpu: bool = False) -> Tracked:
    return run_build((job,), gpus_per_node, gpu)[0]


def _refused(c: Config, point: PointRecord) -> str:
    """Why ``c`` is its error row, unbuilt, as its run would refuse or fail it: a checkpointed
    model without checkpoint units, an accumulating implementation that cannot skip its
    gradients' sync, an accumulating row its family does not track; "" where it is tracked."""
    if c.checkpointed and not names_checkpoint_units(point.model):
        return NO_CHECKPOINT_UNITS  # as its build would raise
    if c.accumulates and point.impl_facts["skip_sync"] is None:
        return CANNOT_ACCUMULATE  # as the harness refuses it, before a build
    if c.accumulates:
        return FAMILIES[c.family].accumulation_untracked
    return ""


def failure(e: Exception) -> Tracked:
    line = " ".join(str(e).split()) or type(e).__name__
    return failed(f"{type(e).__name__}: {line[:300]}")


def plan_env(world_size: int, gpus_per_node: int) -> DistEnv:
    return DistEnv(
        rank=0,
        world_size=world_size,
        local_rank=0,
        local_world_size=min(world_size, gpus_per_node),
        backend="fake",
        device=torch.device("cpu"),
        host="plan",
        nnodes=math.ceil(world_size / gpus_per_node),
    )


def step_inputs(point: PointRecord) -> list:
    """One step's micro-batches, real (a few samples' ids or pixels, not weights): made
    outside the fake mode, which the data loader's sampler cannot run in."""
    accum = int(point.knobs["grad_accum"])
    batch = point.batch_per_replica
    data = workload(point.model).dataset(batch * accum, 0)
    batches = Batches(data, batch_size=batch, rank=0, world_size=1, device=torch.device("cpu"))
    return [next(batches) for _ in range(accum)]


@functools.cache
def blocks_of(model: str) -> int:
    """How many repeated blocks the model has (0: none to shorten), from its meta twin."""
    with torch.device("meta"):
        twin = stamp(workload(model).build(), workload(model))
    blocks = block_list(twin)
    return 0 if blocks is None else len(blocks)


def meta_plain(model: str, blocks: int | None) -> torch.nn.Module | None:
    """The plain model (its first ``blocks`` blocks where given) on the meta device, built
    outside the fake mode and the tracker: building under fake tensors runs every initialiser
    of all the blocks through both, slowly (docs/benchmarks.md, "Planning time"), and the
    weights' values are no concern of fake tensors. None for a model that keeps a tensor
    outside its parameters and buffers, which would stay on the meta device."""
    with torch.device("meta"):
        twin = _shortened(model, blocks)
    if any(isinstance(v, torch.Tensor) for m in twin.modules() for v in vars(m).values()):
        return None
    return twin


def plain_model(model: str, blocks: int | None, twin: torch.nn.Module | None) -> torch.nn.Module:
    """Under the fake mode: ``twin`` given storage, or (no twin) the model built there."""
    if twin is not None:
        _give_storage(twin)
        return twin
    return _shortened(model, blocks)


def _shortened(model: str, blocks: int | None) -> torch.nn.Module:
    """The plain model built, its first ``blocks`` blocks kept where given."""
    plain = build_model(model)
    if blocks is not None:
        keep_blocks(plain, blocks)
    return plain


def _give_storage(model: torch.nn.Module) -> None:
    """Every meta parameter and buffer of ``model`` replaced by an empty one on the CPU (fake,
    under the fake mode), tied ones tied still. ``Module.to_empty`` swaps tensors in place,
    which fails for parameters another object (the memory tracker) refers to."""
    made: dict[int, torch.Tensor] = {}

    def empty(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            new = torch.empty_like(t, device=CPU)
            if isinstance(t, torch.nn.Parameter):
                new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            made[id(t)] = new
        return made[id(t)]

    for m in model.modules():
        for table in (m._parameters, m._buffers):
            for name, t in table.items():
                if t is not None and t.is_meta:
                    table[name] = empty(t)


def track(point: PointRecord, *, gpus_per_node: int = 8, gpu: bool = False) -> Tracked:
    """The point's step at its world size, tracked under fake tensors (``track_phases``)."""
    return track_phases([point], gpus_per_node=gpus_per_node, gpu=gpu)[0]


def track_phases(
    points: list[PointRecord], *, gpus_per_node: int = 8, gpu: bool = False
) -> list[Tracked]:
    """Each point's step, tracked in turn on one build: the points differ only in micro-batch,
    accumulation and activation checkpointing (a layout's phases; checkpointing is switched
    on the blocks, which the wrappers hook whichever forward they run), so one model, wrapper
    and optimiser state serve them all, each step starting, as a step does, with no gradient
    live. A model of at most ``SMALL`` repeated blocks is tracked in full: no dearer than two
    shortened trackings (each builds and steps what is not a block too: the embedding, the
    head, the optimiser), and exact. A larger one is tracked with one and with two blocks and
    extrapolated to all of them (each block adds the same parameters, gradients, state,
    activations and FLOPs; the peak's transient, one block's, is in both), each stage of the
    step apart (``Tracked.stages``), or from two and three where the implementation's row says
    one block is laid out unlike the rest (``memory_blocks_from``: FSDP1's); a point whose
    peak lies elsewhere with one block more (``tracked.shifted``) is tracked with a block
    more again, until it stays, for at most ``STEPS`` blocks (a peak can move twice:
    docs/benchmarks.md, "Planned memory"); one still moving there is extrapolated along the
    line its last three trackings lie on where they do (``tracked.collinear``), else tracked
    in full. A build or step that fails is every point's error, in one line.
    ``gpu``: the target is a GPU, where AdamW runs as foreach (torch's default there, whose
    step holds temporaries the size of the state; on a CPU, one tensor at a time) and the
    collectives as NCCL runs them (on a CPU, as gloo does: ``fakes.backend_copies``)."""
    with warnings.catch_warnings():
        # torch's warnings on the way to a failure (FSDP1's views under the tracker) say less
        # than the row's error does
        warnings.simplefilter("ignore")
        try:
            n = blocks_of(points[0].model)
            # a mode that checkpoints every N-th block: a shortened model's blocks are not
            # laid out as all of them are, so tracked in full
            whole = [i for i, p in enumerate(points) if n <= SMALL or not alike(_mode(p))]
            if not whole:
                first = int(points[0].impl_facts.get("memory_blocks_from", 1))
                return _stepped(points, n, first, gpus_per_node, gpu)
            full = iter(_track([points[i] for i in whole], gpus_per_node, None, gpu))
            rest = [p for i, p in enumerate(points) if i not in whole]
            first = int(points[0].impl_facts.get("memory_blocks_from", 1))
            stepped = iter(_stepped(rest, n, first, gpus_per_node, gpu) if rest else [])
            return [
                replace(next(full), how="tracked in full") if i in whole else next(stepped)
                for i in range(len(points))
            ]
        except Exception as e:  # noqa: BLE001 - any failure is these configurations' rows
            return [failure(e)] * len(points)


def alike(mode: str) -> bool:
    """Whether ``mode`` checkpoints every block alike (off, full, selective:op), so that a
    model shortened to a few blocks stands for all of them; ``selective:layer=N`` does not."""
    return checkpoint_mode(mode).every <= 1


def _stepped(
    points: list[PointRecord], n: int, first: int, gpus_per_node: int, gpu: bool
) -> list[Tracked]:
    """``track_phases``' extrapolation: each point from the first two block counts in a row,
    from ``first`` on (the implementation's ``memory_blocks_from``), between which its peak
    stays where it is."""
    track = functools.partial(_track, gpus_per_node=gpus_per_node, gpu=gpu)
    k = first
    at = {k: track(points, blocks=k), k + 1: track(points, blocks=k + 1)}  # one per point
    out: list[Tracked | None] = [None] * len(points)
    while True:
        moving = []
        for i, (a, b) in enumerate(zip(at[k], at[k + 1], strict=True)):
            if out[i] is not None:
                continue
            if not shifted(a, b):
                how = f"tracked with {k} and {k + 1} of its {n} blocks, extrapolated"
                out[i] = replace(_along(a, b, k, n), how=how)
            else:
                moving.append(i)
        if not moving:
            return out
        if k + 2 > STEPS:
            # still moving: along the line its last three trackings lie on, if they do
            # (``tracked.collinear``), else tracked in full
            lined = [
                i for i in moving if k - 1 in at and collinear(at[k - 1][i], at[k][i], at[k + 1][i])
            ]
            for i in lined:
                how = f"tracked with {k - 1} to {k + 1} of its {n} blocks, on one line"
                out[i] = replace(_along(at[k][i], at[k + 1][i], k, n), how=how + ", extrapolated")
            rest = [i for i in moving if i not in lined]
            full = track([points[i] for i in rest], blocks=None) if rest else []
            for i, t in zip(rest, full, strict=True):
                how = f"tracked in full (its peak still moved from {k} blocks to {k + 1})"
                out[i] = replace(t, how=how)
            return out
        # only the points still moving are stepped with a block more
        more = iter(track([points[i] for i in moving], blocks=k + 2))
        at[k + 2] = [next(more) if i in moving else at[k + 1][i] for i in range(len(points))]
        k += 1


def _along(a: Tracked, b: Tracked, k: int, n: int) -> Tracked:
    """At ``n`` blocks, on the line through ``a`` (tracked with ``k``) and ``b`` (``k + 1``):
    every block adds what the last one did."""
    return a.plus(b.minus(a), n - k)


def _track(
    points: list[PointRecord], gpus_per_node: int, blocks: int | None, gpu: bool
) -> list[Tracked]:
    first = points[0]
    inputs = [step_inputs(p) for p in points]
    twin = meta_plain(first.model, blocks)
    env = plan_env(first.world_size, gpus_per_node)
    tracker = PeakTracker()
    peaks = []
    foreach = True if gpu else None  # torch's default there; here, this CPU's
    backend = "nccl" if gpu else "gloo"  # the backend a run picks (bench/runner/session)
    with (
        fake_world(first.world_size),
        fake_ddp(),
        backend_copies(backend),
        untracked_propagation(tracker),
        FakeTensorMode(allow_non_fake_inputs=True),
    ):
        # The build is tracked: what a wrapper allocates as it wraps (DDP's buckets) lives
        # through every step, and the harness counts it too.
        with tracker:
            plain = plain_model(first.model, blocks, twin)
            recipe = Recipe(batches=iter(()), plain=plain, foreach=foreach)
            trainer = build_trainer(first, env, dist.group.WORLD, recipe)
            resolve_ddp_hooks(trainer.wrapped)
        optimiser_state(trainer)
        mode = _mode(first)
        for point, micro_batches in zip(points, inputs, strict=True):
            try:
                if _mode(point) != mode:
                    mode = _mode(point)
                    set_checkpointing(plain, mode)
                phase = dataclasses.replace(trainer, point=point, accum=len(micro_batches))
                peaks.append(peak_of_step(tracker, phase, micro_batches, here=not gpu))
            except Exception as e:  # noqa: BLE001 - this phase's row
                peaks.append(failure(e))
                break
    out = []
    for point, peak in zip(points, peaks, strict=False):
        if peak.error:
            out.append(peak)
            continue
        # what one micro-batch computes, and the optimiser's step (``op_mix.py``)
        precision = point.knobs.get("precision", "fp32")
        of = Counting(point.model, _mode(point), blocks, precision, gpu)
        flops = _flops(of, point.batch_per_replica)
        again = recomputed(of, point.batch_per_replica)
        ops = step_ops(of, point.batch_per_replica)
        accum = int(point.knobs["grad_accum"])
        out.append(replace(peak, flops=flops * accum, recompute_flops=again * accum, ops=ops))
    rest = points[len(peaks) :]
    # A step that failed part-way leaves the build in no state to step again, and a later
    # phase may run where that one fails: FSDP1's NO_SHARD in bf16 fails accumulating ("a
    # gradient with dtype BFloat16 to a tensor with grad_dtype Float", as its run does), not in
    # one micro-batch with checkpointing, which followed it on the build: the rest on a new one.
    return out + (_rebuilt(rest, gpus_per_node, blocks, gpu) if rest else [])


def _rebuilt(
    points: list[PointRecord], gpus_per_node: int, blocks: int | None, gpu: bool
) -> list[Tracked]:
    """``_track`` of the phases after a failed one, on a build of their own: where that build
    fails too (its first phase's knobs cannot be built), the failure is theirs, not the
    tracked phases' before them (a checkpointed phase of a model without blocks, first on a
    new build, had failed every phase of its layout)."""
    try:
        return _track(points, gpus_per_node, blocks, gpu)
    except Exception as e:  # noqa: BLE001 - these phases' rows
        return [failure(e)] * len(points)


def _mode(point: PointRecord) -> str:
    """The point's checkpointing mode, as rows spell it."""
    return parse_checkpointing(point.knobs["activation_checkpointing"])


def peak_of_step(tracker: PeakTracker, trainer, micro_batches: list, *, here: bool) -> Tracked:
    """One step of ``trainer`` over ``micro_batches``, tracked from what is live before it,
    its forward and backward and its optimiser step each a stage (``Tracked.stages``);
    ``here``: its kernels are this machine's, whose working buffers are measured
    (``workspace.py``)."""
    trainer.opt.zero_grad(set_to_none=True)
    # Accumulating: the micro-batches before the last leave their gradients live for it;
    # the tracker follows one call of each module, so they run before it.
    for x, y in micro_batches[:-1]:
        trainer.micro_step(x, y, last=False)
    tracker.track_external(trainer.wrapped, trainer.opt)
    tracker.reset_mod_stats()
    with tracker, kernel_workspaces(here):  # entering again starts the peak from what is live
        # Trainer.step's order: the last micro-batch synchronised, then the optimiser
        trainer.micro_step(*micro_batches[-1], last=True)
        backward = tracker.restart_peak()
        trainer.finish_step()
    # The step's micro-batches, fetched at its start and live to its end (``Trainer.step``):
    # real tensors made before the tracker, which it does not count, added here.
    inputs = tensor_bytes(micro_batches) / MiB
    stages = []
    for peak in (backward, tracker.get_tracker_snapshot("peak")):
        cpu = next(iter(peak.values())) if peak else {}
        parts = {CATEGORIES[str(k.value)]: v / MiB for k, v in cpu.items() if k != "Total"}
        parts["inputs"] = inputs
        stages.append((cpu.get("Total", 0.0) / MiB + inputs, parts))
    peak, parts = max(stages, key=lambda stage: stage[0])
    return Tracked(peak, parts, 0.0, stages=tuple(stages))


def optimiser_state(trainer) -> None:
    """AdamW's state, made as its first step makes it, without a forward and backward (the
    measured step is one after the first): a step over zero gradients, which are then
    dropped as the step's ``zero_grad`` drops them."""
    for p in trainer.wrapped.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    trainer.opt.step()
    trainer.opt.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Counting:
    """What a step's ops are counted on: the plain model, shortened to ``blocks`` (None: all),
    checkpointed in a mode of the knob (``set_checkpointing``'s: a label, or a bool for off and
    full), its forward at ``precision``, AdamW with ``foreach`` as the target runs it; the
    micro-batch apart, since counts at several make one at another. ``fp8``: the blocks'
    Linears converted as the run converts them (torchao's float8, its casts counted; the rest
    fp32, no autocast)."""

    model: str
    checkpointing: str | bool
    blocks: int | None = None
    precision: str = "fp32"
    foreach: bool = False
    compile: str = "off"  # its memory-bound ops fused as ``compile`` would (``fusion.py``)

    def __post_init__(self) -> None:
        # one spelling per mode, so that the counts a cache keeps are shared (True is "full")
        object.__setattr__(self, "checkpointing", parse_checkpointing(self.checkpointing))


def _flops(of: Counting, micro_batch: int) -> float:
    """FLOPs of one micro-batch's forward and backward (recomputation included): a sample's
    times the micro-batch where the model's FLOPs grow in proportion to it (counted at one
    sample and at two: every op ``FlopCounterMode`` counts, a matrix product, a convolution,
    attention, is linear in the batch), else counted at the micro-batch itself. Of three
    blocks or more of a shortened model, one block's and the next's apart (every block adds
    the same FLOPs, as ``track_phases``' extrapolation has it): no count of its own.
    ``precision`` and ``foreach`` change no FLOPs: they name the count that ``step_ops``
    shares."""
    if of.blocks is not None and of.blocks > 2 and alike(of.checkpointing):
        one, two = (_flops(replace(of, blocks=k), micro_batch) for k in (1, 2))
        return one + (of.blocks - 1) * (two - one)
    one = _counted(of, 1).flops
    if micro_batch == 1 or _counted(of, 2).flops != 2 * one:
        return _counted(of, micro_batch).flops
    return one * micro_batch


def step_ops(of: Counting, micro_batch: int) -> OpMix:
    """The ops of one micro-batch's forward and backward (recomputation included) and of
    AdamW's step over the plain model (``op_mix.py``), as ``_flops`` derives its FLOPs: of
    three blocks or more of a shortened model from one block's and two's; at ``micro_batch``
    op by op along the line through the ops at one sample and two, or where those ran other
    ops (a reshape that copies from two samples on), at two and three (``op_mix.along_batch``);
    else counted there."""
    if of.blocks is not None and of.blocks > 2 and alike(of.checkpointing):
        one, two = (step_ops(replace(of, blocks=k), micro_batch) for k in (1, 2))
        return one.plus(two.plus(one, -1.0), of.blocks - 1)
    if micro_batch > 2:
        two = _counted(of, 2).records
        derived = along_batch(_counted(of, 1).records, two, micro_batch - 1) or along_batch(
            two, _counted(of, 3).records, micro_batch - 2
        )
        if derived is not None:
            return derived
    return mix_of(_counted(of, micro_batch).records)


def recompute_ratio(model: str, micro_batch: int) -> float:
    """A checkpointed micro-batch's FLOPs over a plain one's (its recomputation; the whole
    model's, counted)."""
    return _flops(Counting(model, "full"), micro_batch) / _flops(
        Counting(model, "off"), micro_batch
    )


def recomputed(of: Counting, micro_batch: int) -> float:
    """FLOPs of one micro-batch that ``of``'s checkpointing recomputes: its count less the
    plain model's (0 with it off); what the runner's ``recompute_flops_per_step`` counts."""
    if not checkpoint_mode(of.checkpointing).every:
        return 0.0
    return _flops(of, micro_batch) - _flops(replace(of, checkpointing="off"), micro_batch)


def _counted_flops(model: str, micro_batch: int, checkpointing: str, blocks: int | None) -> float:
    """FLOPs of one micro-batch's forward and backward, counted at it (``_counted``)."""
    return _counted(Counting(model, checkpointing, blocks), micro_batch).flops


@dataclass(frozen=True)
class Counted:
    flops: float  # the forward's and backward's, as FlopCounterMode counts them
    records: tuple[Record, ...]  # every op of the forward, backward and optimiser step, in order


@functools.cache
def _counted(of: Counting, micro_batch: int) -> Counted:
    """One micro-batch's forward and backward (recomputation included) under torch's
    ``FlopCounterMode`` (``bench.roofline.op_count.OpCounter``), on the plain model under fake
    tensors, the forward at ``of.precision`` (under autocast where it is not fp32), then AdamW's
    step (its second: the first makes its state; ``of.foreach`` as the target runs it). The same
    for every layout of the model (a TP rank's share is the planner's division), so counted once.
    Counted apart from the tracked step: both modes at once change what activation
    checkpointing keeps, and so the tracked peak (docs/benchmarks.md, "Planned memory")."""
    wl = workload(of.model)
    data = wl.dataset(micro_batch, 0)
    x, y = next(iter(Batches(data, batch_size=micro_batch, rank=0, world_size=1, device=CPU)))
    twin = meta_plain(of.model, of.blocks)
    float8 = converts(of.precision)
    dtype = None if float8 else torch_dtype(of.precision)
    cast = (
        torch.autocast("cpu", dtype=dtype)
        if dtype not in (None, torch.float32)
        else contextlib.nullcontext()
    )
    with FakeTensorMode(allow_non_fake_inputs=True):
        plain = plain_model(of.model, of.blocks, twin)
        if float8:  # the run's order: float8, then checkpointing
            convert_blocks(plain, CPU)
        if checkpoint_mode(of.checkpointing).every:
            set_checkpointing(plain, of.checkpointing)
        opt = torch.optim.AdamW(plain.parameters(), foreach=of.foreach)
        with OpCounter(flow=compiles({"compile": of.compile})) as counter:
            with compiled_regions(plain, of.compile, counter):
                with cast:
                    loss = wl.compute_loss(wl.forward(plain, x), y)
                counter.phase = "backward"
                loss.backward()
            flops = float(counter.get_total_flops())
            counter.phase = None
            opt.step()
            counter.phase = "optimiser"
            opt.step()
    records = counter.records
    if counter.flow:
        records = fused(records, counter.flows)
    return Counted(flops, tuple(records))
