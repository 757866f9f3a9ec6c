"""Pipeline parallelism as a strategy: the plain model cut into stages
(``pipeline_stages.split_stages``), each rank of the pipeline holding its stages, and a step
that runs the schedule over the batch's micro-batches: torch's own
(``torch.distributed.pipelining``'s ``PipelineStage`` and schedules: the native
implementation, every schedule of ``pp_schedules``) or ours from point-to-point primitives
(``pipeline_schedule``: the reference, GPipe and 1F1B, every byte a stage sends counted).

A schedule with v stages a rank (interleaved, zero-bubble V) cuts p x v stages and places
them as its row says (``pp_schedules.PipeSchedule.stages_of``). The point's ranks form a
(replica, stage rank, TP rank) grid (``dims.ParallelDims``, ``pp_degree`` ranks a pipeline,
``pipeline_mesh``): each stage may be tensor-parallel over ``tp_degree`` ranks, each replica
runs the pipeline on its own batch, and after the schedule each stage's gradients are averaged
over the ranks holding the same stages in the other replicas (data parallelism over the
replicas, after backward rather than during it), or, with ``dp_shard``, FSDP2 shards each stage
over them and reduce-scatters its gradients in backward.

A pipeline steps otherwise than a wrapped module: its schedule runs the forwards and
backwards itself, so the model a strategy hands the trainer here is a ``PipelinedModel``
whose ``train_step`` is one micro-batch of the trainer's (the implementation's ``steps`` fact
says so, ``strategies.Impl``). The first stage takes its inputs, the last its targets, and
every rank returns its pipeline's loss (the last stage's, broadcast). A weight two stages hold
(an embedding tied to the head) has its gradient summed over the pipeline before the
optimiser steps, as Megatron's embedding group does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.profiler import record_function

from parallel_kernels.facts import PIPELINE_SCHEDULE_SPAN
from parallel_kernels.pipeline_mesh import (
    PipeGroups,
    check_tp,
    full_tensor,
    local,
    local_shape,
    pipe_dims,
    pipe_groups,
    shard_stages,
    tensor_parallel,
)
from parallel_kernels.pipeline_schedule import MicroBatches, Stage, run_schedule
from parallel_kernels.pipeline_stages import StageError, StageSplit, pipeline_cut, split_stages
from parallel_kernels.pp_schedules import SCHEDULES, schedule

# The span a traced step's schedule runs in (forwards, backwards and their sends and receives,
# not the tied weights' reduction nor the loss's broadcast): facts.py names it for its readers.
SCHEDULE_SPAN = PIPELINE_SCHEDULE_SPAN


@dataclass(frozen=True)
class PipePlan:
    """How the pipeline steps: its schedule, its micro-batches per step, whose schedules, and
    the stages a rank holds (the schedule's row)."""

    schedule: str
    microbatches: int
    native: bool
    per_rank: int = 1


@dataclass(frozen=True, kw_only=True)
class PipeLayout:
    """The knobs that lay a pipeline out: its schedule and micro-batches, its degree (None:
    every rank the TP groups leave), the TP degree of each stage, and whether the replicas
    shard the stages (FSDP2) instead of averaging their gradients after the schedule."""

    pp_schedule: str = "1f1b"
    pp_microbatches: int = 2
    pp_degree: int | None = None
    tp_degree: int = 1
    dp_shard: bool = False


def check_layout(world: int, model: nn.Module, **knobs) -> None:
    """Refuse, in one ValueError line and before any rank trains, a pipeline the world or the
    model cannot run: degrees that do not divide the world, a micro-batch count torch's
    schedule refuses, more stages than the model has blocks, a TP degree its plan cannot
    split, FSDP2 over a schedule that splits its backward (``split_backward``). ``model``: the
    plain model (on the meta device will do); one that does not say where its blocks are is
    left to its error row."""
    lay = PipeLayout(**{k: v for k, v in knobs.items() if k in _LAYOUT_KNOBS})
    dims = pipe_dims(world, lay.pp_degree, lay.tp_degree, lay.dp_shard)
    row = schedule(lay.pp_schedule)
    why = row.refusal(lay.pp_microbatches, dims.pp)
    if why is not None:
        raise ValueError(why)
    try:
        wl, cut = pipeline_cut(model)
    except ValueError:
        return
    check_tp(model, dims.tp)
    blocks, stages = len(cut.blocks(model)), dims.pp * row.per_rank
    if stages > blocks:
        raise ValueError(
            f"workload {wl.name} has {blocks} blocks, fewer than the {stages} stages of "
            f"pp_schedule={row.name} over {dims.pp} ranks ({row.per_rank} a rank)"
        )
    if dims.dp_shard and dims.dp > 1 and row.split_backward:
        raise ValueError(
            f"dp_shard=true cannot shard pp_schedule={row.name}: its weight gradients run in a "
            "pass of their own, which FSDP2 misses (gpipe, 1f1b and interleaved_1f1b take it)"
        )


_LAYOUT_KNOBS = {f.name for f in dataclasses.fields(PipeLayout)}


class PipelinedModel(nn.Module):
    """This rank's stages of the model and the schedule that steps them; ``parameters()`` are
    the stages' (what the optimiser steps), ``full_state()`` the whole model's by the plain
    names. The other ranks' stage modules are not kept."""

    def __init__(
        self,
        split: StageSplit,
        groups: PipeGroups,
        device: torch.device,
        plan: PipePlan,
        tp_dims: dict[str, int] | None = None,
    ):
        super().__init__()
        self.groups, self.group, self.replica_group = groups, groups.pipe, groups.replicas
        self.device, self.plan = device, plan
        self.dp_rank, self.dp_size = groups.dp_rank, groups.dims.dp
        self.pp_rank, self.pp_size = groups.pp_rank, groups.dims.pp
        self._tp_dims = tp_dims or {}  # our TP layers' split dimensions, by plain names
        row = schedule(plan.schedule)
        self.indices = row.stages_of(self.pp_rank, self.pp_size)
        self.owners = row.owners(self.pp_size)  # the pipeline rank of each stage
        self.num_stages = len(split.stages)
        self.stages = nn.ModuleList(split.stages[i] for i in self.indices)
        self.names = [dict(split.param_names[i]) for i in self.indices]
        world = self.group if self.group is not None else dist.group.WORLD
        self.ranks = [dist.get_global_rank(world, i) for i in range(self.pp_size)]
        plain = {
            split.param_names[i][n]: t
            for i, st in enumerate(split.stages)
            for n, t in st.named_parameters()
        }
        self._shared = [
            (s.name, local_shape(plain[s.name], groups), plain[s.name].dtype) for s in split.shared
        ]
        self._received = None if plan.native else _received_per_sample(split, self.index, device)
        if groups.sharded:
            shard_stages(list(self.stages), split.workload.fsdp_units, groups)
        self._split = dataclasses.replace(split, stages=())  # its batch split and loss only
        self._native = _native_schedule(self) if plan.native else None

    @property
    def index(self) -> int:
        """The stage of a rank that holds one (the reference's)."""
        return self.indices[0]

    def forward(self, *args, **kwargs):
        raise RuntimeError("a pipeline steps through train_step, not a forward call")

    def _chunks(self, tensor) -> tuple[torch.Tensor, ...]:
        m = self.plan.microbatches
        if tensor.shape[0] % m:
            raise ValueError(
                f"a batch of {tensor.shape[0]} does not split into {m} pipeline micro-batches "
                "(pp_microbatches)"
            )
        return tuple(tensor.chunk(m))

    def train_step(self, inputs, targets) -> torch.Tensor:
        """Forward and backward of one batch over the schedule's micro-batches, gradients
        accumulated in the stages' parameters (a tied weight's summed over its stages, every
        one averaged over the replicas); the pipeline's mean loss on every rank. A stage whose
        forward raises is named in the error."""
        x, y = self._split.stage_batch(inputs, targets)
        losses: list[torch.Tensor] = []
        with record_function(SCHEDULE_SPAN):
            try:
                self._run_schedule(x, y, losses)
            except Exception as e:
                named = _stage_error(e)
                if named is None or named is e:
                    raise
                raise named from None
        self._sum_shared()
        self._average_replicas()
        last = self.owners[-1] == self.pp_rank
        loss = torch.stack(losses).mean().detach() if last else torch.zeros((), device=self.device)
        dist.broadcast(loss, self.ranks[self.owners[-1]], group=self.group)
        return loss

    def _run_schedule(self, x, y, losses: list) -> None:
        first, last = 0 in self.indices, self.num_stages - 1 in self.indices
        if self._native is not None:
            self._chunks(x)  # the reference's refusal of a batch that does not split
            args = (x,) if first else ()
            target = y if last else None
            self._native.step(*args, target=target, losses=losses if last else None)
            for p in self.parameters():  # each tensor once: a tie two local stages hold too
                if p.grad is not None:
                    p.grad.div_(self.plan.microbatches)
            return
        micro = MicroBatches(
            self.plan.microbatches,
            self._chunks(x) if first else (),
            self._chunks(y) if last else (),
        )
        step = run_schedule(self._stage(x), micro, self._split.loss, self.plan.schedule)
        losses.extend(step.losses)

    def _stage(self, x: torch.Tensor) -> Stage:
        """The reference schedule's view of this rank's stage: it receives per micro-batch the
        first stage's input chunk, or what the stages before it make of one."""
        trailing, dtype = self._received
        shape = (x.shape[0] // self.plan.microbatches, *trailing)
        last = self.num_stages - 1
        return Stage(
            module=self.stages[0],
            index=self.index,
            num_stages=self.num_stages,
            group=self.group,
            prev_rank=self.ranks[self.index - 1] if self.index else None,
            next_rank=self.ranks[self.index + 1] if self.index < last else None,
            recv_shape=shape,
            recv_dtype=dtype,
        )

    def _mine(self) -> dict[str, nn.Parameter]:
        """This rank's parameters by the plain model's names (a tied one once)."""
        return {
            names[n]: p
            for stage, names in zip(self.stages, self.names, strict=True)
            for n, p in stage.named_parameters()
        }

    def _sum_shared(self) -> None:
        """Each tied weight's gradient summed over the pipeline's ranks that hold it (the
        others add zeros: every rank joins, in the plain model's order); this rank's part of
        it where TP or FSDP2 split it (each rank of the pipeline holds the same part)."""
        mine = self._mine()
        for name, shape, dtype in self._shared:
            p = mine.get(name)
            held = p is not None and p.grad is not None
            grad = local(p.grad) if held else torch.zeros(shape, dtype=dtype, device=self.device)
            dist.all_reduce(grad, group=self.group)
            if p is not None and not held:
                p.grad = grad

    def _average_replicas(self) -> None:
        """The stages' gradients averaged over the replicas, in one flat all-reduce; FSDP2's
        reduce-scatter has averaged them already (``dp_shard``)."""
        if self.replica_group is None or self.groups.sharded:
            return
        grads = [local(p.grad) for p in self.parameters() if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.replica_group)
        flat.div_(self.dp_size)
        for g, f in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(f)

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every stage's parameters in full under the plain model's names, on every rank (each
        gathered over its TP and FSDP2 ranks, then one all-gather of objects over the
        pipeline; the replicas hold the same)."""
        mine = {
            n: full_tensor(p, self._tp_dims.get(n), self.groups).cpu()
            for n, p in self._mine().items()
        }
        every: list = [None] * self.pp_size
        dist.all_gather_object(every, mine, group=self.group)
        out: dict[str, torch.Tensor] = {}
        for part in every:
            out.update(part)
        return out


def _stage_error(e: BaseException) -> StageError | None:
    """The stage's own error that ``e`` was raised from (torch wraps a stage's forward error
    in a many-line RuntimeError), or None."""
    seen = e
    while seen is not None:
        if isinstance(seen, StageError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _received_per_sample(
    split: StageSplit, index: int, device: torch.device
) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape past the batch dimension and the dtype of what stage ``index`` receives: the
    first stage's input, or the output of the stages before it for one sample of the
    workload's data (every rank holds the whole plain model while it is cut)."""
    inputs, targets = split.workload.batch(1, 0)
    x = split.stage_batch(inputs, targets)[0].to(device)
    with torch.no_grad():
        for stage in split.stages[:index]:
            x = stage(x)
    return tuple(x.shape[1:]), x.dtype


def _native_schedule(model: PipelinedModel):
    """torch's ``PipelineStage`` over each of this rank's stages and the schedule of the
    plan's name (one stage, or the list of a multi-stage schedule). Its gradients are left
    summed over the micro-batches (``scale_grads=False``) and scaled by the caller: torch
    scales each stage's parameters, so a weight two stages of a rank hold (a tie on a V)
    would be scaled twice."""
    from torch.distributed.pipelining import PipelineStage

    row = schedule(model.plan.schedule)
    stages = [
        PipelineStage(module, i, model.num_stages, model.device, group=model.group)
        for i, module in zip(model.indices, model.stages, strict=True)
    ]
    kind = row.torch_type()
    return kind(
        stages[0] if row.per_rank == 1 else stages,
        n_microbatches=model.plan.microbatches,
        loss_fn=model._split.loss,
        scale_grads=False,
    )


def apply_pipeline(
    model: nn.Module, *, group, device: torch.device, native: bool = True, **knobs
) -> PipelinedModel:
    """``model`` cut into the stages of ``pp_schedule`` over pipelines of ``pp_degree`` ranks of
    ``group`` (the knobs of ``PipeLayout``), each stage tensor-parallel over ``tp_degree``
    ranks, stepped over ``pp_microbatches`` micro-batches: torch's schedules (``native``) or
    ours (GPipe and 1F1B); the replicas average their gradients, or shard the stages
    (``dp_shard``)."""
    lay = PipeLayout(**knobs)
    if lay.pp_schedule not in SCHEDULES:
        known = ", ".join(SCHEDULES)
        raise ValueError(f"unknown pipeline schedule {lay.pp_schedule!r} (known: {known})")
    row = SCHEDULES[lay.pp_schedule]
    if not native and not row.reference:
        ours = ", ".join(s.name for s in SCHEDULES.values() if s.reference)
        raise ValueError(
            f"pp_schedule={lay.pp_schedule} runs in torch's schedules only (the native "
            f"implementation); the reference runs {ours}"
        )
    dims = pipe_dims(dist.get_world_size(group), lay.pp_degree, lay.tp_degree, lay.dp_shard)
    check_tp(model, dims.tp)  # before any group exists: a bad degree fails cleanly
    groups = pipe_groups(group, dims, device, native)
    tp_dims = tensor_parallel(model, groups, native)
    cut = split_stages(model, dims.pp * row.per_rank)
    plan = PipePlan(lay.pp_schedule, lay.pp_microbatches, native, row.per_rank)
    return PipelinedModel(cut, groups, device, plan, tp_dims)
