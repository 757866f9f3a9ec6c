"""Reference pipeline schedules, GPipe and 1F1B, written from point-to-point primitives.

A stage is one rank's slice of a model, already split. ``run_schedule`` runs the forwards and
backwards of m micro-batches in the order ``pipeline_theory`` writes for the schedule, sending
each activation to the next stage and each input gradient to the previous one with
``dist.P2POp`` and ``dist.batch_isend_irecv``, so that every byte a stage sends is counted
here (against torch.distributed.pipelining's ``PipelineStage`` and schedules, which send the
same tensors but say nothing of them).

A send is posted the moment its tensor is made and waited on only at the step's end, and a
receive is waited on where its tensor is needed: the next stage starts on a micro-batch as soon
as it arrives (GPipe's forwards overlap across stages), and two neighbours that both send
before they receive in 1F1B's steady state never wait on each other's sends. The last stage's
loss is scaled by 1 / m, so the gradients are those of the full batch's mean loss when
``loss_fn`` takes a mean over equal micro-batches. Each micro-batch's forward and backward
(its receive, computation and send) runs in a profiler span of its own (``pipeline F 3``,
``facts.pipeline_micro_span``), so that a trace shows the schedule micro-batch by micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import record_function

from parallel_kernels.facts import pipeline_micro_span
from parallel_kernels.pipeline_theory import (
    FORWARD,
    SCHEDULES,
    Action,
    Pipeline,
    schedule_order,
)


@dataclass(frozen=True)
class Stage:
    """One rank's stage: its module (one activation in, one out), its index of
    ``num_stages``, the pipeline's process group (every stage's rank, nothing else), the
    global ranks of its neighbours (None at the ends), and the shape and dtype of the
    activation it receives per micro-batch (the first stage's: its input micro-batch)."""

    module: nn.Module
    index: int
    num_stages: int
    group: dist.ProcessGroup | None
    prev_rank: int | None
    next_rank: int | None
    recv_shape: tuple[int, ...]
    recv_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.num_stages:
            raise ValueError(f"stage index {self.index} is not in 0..{self.num_stages - 1}")
        if (self.prev_rank is None) != self.is_first or (self.next_rank is None) != self.is_last:
            raise ValueError(
                f"stage {self.index} of {self.num_stages} needs a previous rank unless first "
                f"and a next rank unless last, got {self.prev_rank} and {self.next_rank}"
            )

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.num_stages - 1


@dataclass(frozen=True)
class MicroBatches:
    """A step's m micro-batches as one stage sees them: the inputs (first stage only) and the
    targets (last stage only), already chunked."""

    count: int
    inputs: tuple[torch.Tensor, ...] = ()
    targets: tuple[torch.Tensor, ...] = ()


@dataclass(frozen=True)
class PipelineStep:
    """What a stage did in one step: the last stage's per-micro-batch losses (unscaled, as
    ``loss_fn`` gave them; empty elsewhere), the point-to-point bytes it sent, and the most
    micro-batches' activations it held at once."""

    losses: tuple[torch.Tensor, ...]
    bytes_sent: int
    max_in_flight: int


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def gpipe(stage: Stage, micro: MicroBatches, loss_fn: LossFn) -> PipelineStep:
    """GPipe: all forwards, then all backwards; holds all m micro-batches' activations."""
    return run_schedule(stage, micro, loss_fn, "gpipe")


def one_f_one_b(stage: Stage, micro: MicroBatches, loss_fn: LossFn) -> PipelineStep:
    """1F1B: warm-up forwards, one forward one backward, cool-down backwards."""
    return run_schedule(stage, micro, loss_fn, "1f1b")


def run_schedule(stage: Stage, micro: MicroBatches, loss_fn: LossFn, schedule: str) -> PipelineStep:
    """Forward and backward of a step's micro-batches on this stage, in the schedule's order
    (``pipeline_theory.SCHEDULES``); gradients accumulate in the module's parameters. Every
    stage must call it with the same schedule and micro-batch count: the count and each
    stage's own inputs are agreed on first, and a disagreement is a ValueError on every stage
    before anything is sent."""
    _agree(stage, micro, _local_error(stage, micro, schedule))
    order = schedule_order(schedule, Pipeline(stage.num_stages, micro.count), stage.index)
    run = _StageRun(stage, micro, loss_fn)
    for action in order:
        run.act(action)
    run.finish()
    return PipelineStep(tuple(run.losses), run.bytes_sent, run.peak)


def _local_error(stage: Stage, micro: MicroBatches, schedule: str) -> str | None:
    """What is wrong with this stage's own schedule or micro-batches, if anything."""
    m = micro.count
    if schedule not in SCHEDULES:
        return f"unknown pipeline schedule {schedule!r} (known: {', '.join(SCHEDULES)})"
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        return f"the micro-batch count must be a positive integer, got {m!r}"
    for kind, given, needed in (
        ("input", micro.inputs, stage.is_first),
        ("target", micro.targets, stage.is_last),
    ):
        if needed and len(given) != m:
            return f"stage {stage.index} has {len(given)} {kind} micro-batches for a count of {m}"
    for i, x in enumerate(micro.inputs if stage.is_first else ()):
        if tuple(x.shape) != tuple(stage.recv_shape) or x.dtype != stage.recv_dtype:
            return (
                f"stage {stage.index}'s input micro-batch {i} is {tuple(x.shape)} {x.dtype}, "
                f"the stage takes {tuple(stage.recv_shape)} {stage.recv_dtype}"
            )
    return None


def _agree(stage: Stage, micro: MicroBatches, error: str | None) -> None:
    """One small all-reduce over the pipeline's group before any send: every stage learns
    whether any stage refused its micro-batches and whether all have the same count, so that
    a disagreement is an error on every stage and not a send with no matching receive."""
    size = dist.get_world_size(stage.group)
    if size != stage.num_stages:
        raise ValueError(f"the pipeline's group has {size} ranks for {stage.num_stages} stages")
    m = micro.count if error is None else 0
    facts = torch.tensor([m, -m, int(error is not None)], dtype=torch.int64)
    dist.all_reduce(facts, op=dist.ReduceOp.MAX, group=stage.group)
    most, least, refused = int(facts[0]), -int(facts[1]), int(facts[2])
    if error is not None:
        raise ValueError(f"{error}; nothing was sent")
    if refused:
        raise ValueError(f"stage {stage.index}: another stage refused its micro-batches")
    if most != least:
        raise ValueError(
            f"the stages disagree on the micro-batch count ({least} to {most}, stage "
            f"{stage.index} has {m}); nothing was sent"
        )


class _StageRun:
    """One step's state on a stage: the activations kept for backward, the sends in flight
    (their tensors kept alive until they are waited on), the losses and the bytes sent."""

    def __init__(self, stage: Stage, micro: MicroBatches, loss_fn: LossFn) -> None:
        self.stage, self.micro, self.loss_fn = stage, micro, loss_fn
        self.in_flight: list[tuple[torch.Tensor, list]] = []
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.losses: list[torch.Tensor] = []
        self.bytes_sent = 0
        self.peak = 0

    def act(self, action: Action) -> None:
        with record_function(pipeline_micro_span(action.kind, action.micro)):
            if action.kind == FORWARD:
                self.forward(action.micro)
            else:
                self.backward(action.micro)

    def finish(self) -> None:
        """Wait for every send of the step."""
        for _, works in self.in_flight:
            for work in works:
                work.wait()
        self.in_flight = []

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        """Post ``tensor`` to ``peer`` now; waited on at the step's end."""
        tensor = tensor.detach().contiguous()
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, peer, self.stage.group)])
        self.in_flight.append((tensor, works))
        self.bytes_sent += tensor.numel() * tensor.element_size()

    def receive(self, like: torch.Tensor | None, peer: int) -> torch.Tensor:
        """The next tensor from ``peer``, shaped as ``like`` (None: the stage's input)."""
        s = self.stage
        if like is None:
            buf = torch.empty(s.recv_shape, dtype=s.recv_dtype)
        else:
            buf = torch.empty_like(like)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, peer, s.group)]):
            work.wait()
        return buf

    def forward(self, i: int) -> None:
        s = self.stage
        # a received activation is a leaf whose gradient goes back to the previous stage
        x = self.micro.inputs[i] if s.is_first else self.receive(None, s.prev_rank)
        if not s.is_first:
            x.requires_grad_()
        y = s.module(x)
        if s.is_last:
            loss = self.loss_fn(y, self.micro.targets[i])
            self.losses.append(loss.detach())
            y = loss / self.micro.count
        else:
            self.send(y, s.next_rank)
        self.kept[i] = (x, y)
        self.peak = max(self.peak, len(self.kept))

    def backward(self, i: int) -> None:
        s = self.stage
        x, y = self.kept.pop(i)
        grad = None if s.is_last else self.receive(y, s.next_rank)
        torch.autograd.backward(y, grad)
        if not s.is_first:
            self.send(x.grad, s.prev_rank)
