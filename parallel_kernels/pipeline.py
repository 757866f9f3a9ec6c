"""Pipeline parallelism as a strategy: the plain model cut into one stage per rank of the group
(``pipeline_stages.split_stages``), each rank holding its stage, and a step that runs the
schedule over the batch's micro-batches: torch's own (``torch.distributed.pipelining``'s
``PipelineStage`` and schedules: the native implementation) or ours from point-to-point
primitives (``pipeline_schedule``: the reference, every byte a stage sends counted).

A pipeline steps otherwise than a wrapped module: its schedule runs the forwards and
backwards itself, so the model a strategy hands the trainer here is a ``PipelinedModel``
whose ``train_step`` is one micro-batch of the trainer's (the implementation's ``steps`` fact
says so, ``strategies.Impl``). Every rank reads the same batch (one pipeline, no data
parallelism); the first stage takes its inputs, the last its targets, and every rank returns
the pipeline's loss (the last stage's, broadcast). A weight two stages hold (an embedding tied
to the head) has its gradient summed over the group before the optimiser steps, as Megatron's
embedding group does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from parallel_kernels.knobs import PP_SCHEDULES as SCHEDULES  # both implementations run them
from parallel_kernels.pipeline_schedule import MicroBatches, Stage, run_schedule
from parallel_kernels.pipeline_stages import StageSplit, split_stages


@dataclass(frozen=True)
class PipePlan:
    """How the pipeline steps: its schedule, its micro-batches per step, whose schedules."""

    schedule: str
    microbatches: int
    native: bool


class PipelinedModel(nn.Module):
    """This rank's stage of the model and the schedule that steps it; ``parameters()`` are the
    stage's (what the optimiser steps), ``full_state()`` the whole model's by the plain names.
    The other stages' modules are not kept."""

    dp_rank, dp_size = 0, 1  # one pipeline: every rank reads the replica's one batch

    def __init__(self, split: StageSplit, group, device: torch.device, plan: PipePlan) -> None:
        super().__init__()
        self.group, self.device, self.plan = group, device, plan
        self.index = dist.get_rank(group)
        self.num_stages = dist.get_world_size(group)
        self.stage = split.stages[self.index]
        self.names = dict(split.param_names[self.index])
        world = group if group is not None else dist.group.WORLD
        self.ranks = [dist.get_global_rank(world, i) for i in range(self.num_stages)]
        self._received = _received_per_sample(split, self.index, device)
        plain = {
            split.param_names[i][n]: t
            for i, st in enumerate(split.stages)
            for n, t in st.named_parameters()
        }
        self._shared = [(s.name, plain[s.name].shape, plain[s.name].dtype) for s in split.shared]
        self._split = dataclasses.replace(split, stages=())  # its batch split and loss only
        self._native = _native_schedule(self) if plan.native else None

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
        accumulated in the stage's parameters (a tied weight's summed over its stages); the
        batch's mean loss on every rank."""
        x, y = self._split.stage_batch(inputs, targets)
        first, last = self.index == 0, self.index == self.num_stages - 1
        losses: list[torch.Tensor] = []
        if self._native is not None:
            self._chunks(x)  # the reference's refusal of a batch that does not split
            args = (x,) if first else ()
            self._native.step(*args, target=y if last else None, losses=losses if last else None)
        else:
            micro = MicroBatches(
                self.plan.microbatches,
                self._chunks(x) if first else (),
                self._chunks(y) if last else (),
            )
            step = run_schedule(self._stage(x), micro, self._split.loss, self.plan.schedule)
            losses = list(step.losses)
        self._sum_shared()
        loss = torch.stack(losses).mean().detach() if last else torch.zeros((), device=self.device)
        dist.broadcast(loss, self.ranks[-1], group=self.group)
        return loss

    def _stage(self, x: torch.Tensor) -> Stage:
        """The reference schedule's view of this rank's stage: it receives per micro-batch the
        first stage's input chunk, or what the stages before it make of one."""
        trailing, dtype = self._received
        shape = (x.shape[0] // self.plan.microbatches, *trailing)
        last = self.num_stages - 1
        return Stage(
            module=self.stage,
            index=self.index,
            num_stages=self.num_stages,
            group=self.group,
            prev_rank=self.ranks[self.index - 1] if self.index else None,
            next_rank=self.ranks[self.index + 1] if self.index < last else None,
            recv_shape=shape,
            recv_dtype=dtype,
        )

    def _sum_shared(self) -> None:
        """Each tied weight's gradient summed over the stages that hold it (the others add
        zeros: every rank joins, in the plain model's order)."""
        mine = {self.names[n]: p for n, p in self.stage.named_parameters()}
        for name, shape, dtype in self._shared:
            p = mine.get(name)
            held = p is not None and p.grad is not None
            grad = p.grad if held else torch.zeros(shape, dtype=dtype, device=self.device)
            dist.all_reduce(grad, group=self.group)
            if p is not None:
                p.grad = grad

    def full_state(self) -> dict[str, torch.Tensor]:
        """Every stage's parameters under the plain model's names, on every rank (one
        all-gather of objects over the group)."""
        mine = {self.names[n]: p.detach().cpu() for n, p in self.stage.named_parameters()}
        every: list = [None] * self.num_stages
        dist.all_gather_object(every, mine, group=self.group)
        out: dict[str, torch.Tensor] = {}
        for part in every:
            out.update(part)
        return out


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
    """torch's ``PipelineStage`` over this rank's stage and its schedule of the plan's name."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = PipelineStage(
        model.stage, model.index, model.num_stages, model.device, group=model.group
    )
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[model.plan.schedule]
    return kind(stage, n_microbatches=model.plan.microbatches, loss_fn=model._split.loss)


def apply_pipeline(
    model: nn.Module,
    *,
    group,
    device: torch.device,
    pp_schedule: str = "1f1b",
    pp_microbatches: int = 2,
    native: bool = True,
) -> PipelinedModel:
    """``model`` cut into one stage per rank of ``group`` and stepped by ``pp_schedule`` over
    ``pp_microbatches`` micro-batches: torch's schedules (``native``) or ours."""
    if pp_schedule not in SCHEDULES:
        known = ", ".join(SCHEDULES)
        raise ValueError(f"unknown pipeline schedule {pp_schedule!r} (known: {known})")
    split = split_stages(model, dist.get_world_size(group))
    return PipelinedModel(split, group, device, PipePlan(pp_schedule, pp_microbatches, native))
