"""A pipeline's stages' ops, counted under fake tensors as the memory stage counts a plain
model's step (``memory.step_ops``, ``op_mix.py``): what the time stage prices each stage's
forward, backward and optimiser step by (``pipeline_time.py``).

A proxy of one block a stage is cut as a run cuts the model (``pipeline_stages.split_stages``)
into two stages, or three where the pipeline has middle ones, and each stage's micro-batch is
counted on its own: the first takes the model's input (its embedding's ops), a later one the
previous one's output as a leaf whose gradient it makes (as the schedules receive it), the last
adds the loss; then AdamW's step over the stage's parameters. A stage of more blocks adds one
block's ops for each (the plain model's with two blocks less with one), and each boundary
carries one block's output, whose bytes are the sends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.plan import memory
from bench.plan.op_mix import OpMix, mix_of
from bench.roofline.op_count import OpCounter
from bench.runner.train.data import Batches
from parallel_kernels.checkpointing import set_checkpointing
from parallel_kernels.facts import torch_dtype
from parallel_kernels.models import workload
from parallel_kernels.pipeline_stages import split_stages


@dataclass(frozen=True)
class CountJob:
    """The stages of a proxy of ``stages`` stages, one block each, counted at one micro-batch
    of ``micro_batch`` samples, at ``precision``, checkpointed in a mode that treats every block
    alike (``memory.alike``) or not at all, AdamW ``foreach`` as the target runs it."""

    config: object = field(compare=False, hash=False)  # a row it serves (the progress line's)
    model: str
    precision: str
    checkpointing: str
    stages: int
    micro_batch: int
    foreach: bool


@dataclass(frozen=True)
class StageCounts:
    """Per proxy stage (first, [middle,] last): its ops, the bytes it sends the next one per
    micro-batch, its parameters' bytes (a tied weight on each stage that holds it); one block's
    ops and parameter bytes; the bytes of the weights two stages hold; or the error."""

    stages: tuple[OpMix, ...] = ()
    sends: tuple[float, ...] = ()
    params: tuple[float, ...] = ()
    block: OpMix = field(default_factory=OpMix)
    block_params: float = 0.0
    shared: float = 0.0
    error: str = ""
    block_recompute: float = 0.0  # the FLOPs one block recomputes per micro-batch


def count_stages(job: CountJob) -> StageCounts:
    """``job``'s counts, or its error in one line."""
    try:
        return _count(job)
    except Exception as e:  # noqa: BLE001 - the rows' error
        return StageCounts(error=memory.failure(e).error)


def _bytes(tensors) -> float:
    seen, total = set(), 0.0
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _count(job: CountJob) -> StageCounts:
    wl = workload(job.model)
    data = wl.dataset(job.micro_batch, 0)
    cpu = torch.device("cpu")
    x, y = next(iter(Batches(data, batch_size=job.micro_batch, rank=0, world_size=1, device=cpu)))
    twin = memory.meta_plain(job.model, job.stages)
    dtype = torch_dtype(job.precision)
    cast = dtype not in (None, torch.float32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        plain = memory.plain_model(job.model, job.stages, twin)
        set_checkpointing(plain, job.checkpointing)
        split = split_stages(plain, job.stages)
        hidden, targets = split.stage_batch(x, y)
        mixes, sends, params = [], [], []
        for s, stage in enumerate(split.stages):
            last = s == job.stages - 1
            given = hidden if s == 0 else hidden.detach().requires_grad_()
            autocast = torch.autocast("cpu", dtype=dtype) if cast else contextlib.nullcontext()
            loss = (split.loss, targets) if last else None
            mix, out = _counted_stage(stage, given, loss, autocast, job.foreach)
            mixes.append(mix)
            params.append(_bytes(stage.parameters()))
            if not last:
                sends.append(float(out.numel() * out.element_size()))
                hidden = out.detach()
        named = dict(plain.named_parameters(remove_duplicate=False))
        shared = _bytes(named[s.name] for s in split.shared)
        block_params = _bytes(wl.pipeline.blocks(plain)[0].parameters())
    of = memory.Counting(job.model, job.checkpointing, None, job.precision, job.foreach)
    one, two = (memory.step_ops(replace(of, blocks=k), job.micro_batch) for k in (1, 2))
    again = (memory.recomputed(replace(of, blocks=k), job.micro_batch) for k in (2, 1))
    return StageCounts(
        tuple(mixes),
        tuple(sends),
        tuple(params),
        two.plus(one, -1.0),
        block_params,
        shared,
        block_recompute=next(again) - next(again),
    )


def _counted_stage(stage, given, loss, autocast, foreach: bool) -> tuple[OpMix, torch.Tensor]:
    """One micro-batch's forward and backward through ``stage`` (its output's gradient, or
    with ``loss``, (loss function, targets), the loss's), then AdamW's step over its
    parameters (its second: the first makes its state), counted op by op."""
    opt = torch.optim.AdamW(stage.parameters(), foreach=foreach)
    with OpCounter() as counter:
        with autocast:
            out = stage(given)
            value = loss[0](out, loss[1]) if loss is not None else None
        counter.phase = "backward"
        if value is not None:
            value.backward()
        else:
            out.backward(torch.ones_like(out))
        counter.phase = None
        opt.step()
        counter.phase = "optimiser"
        opt.step()
    return mix_of(counter.records), out
