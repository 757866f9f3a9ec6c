"""A plain model cut into pipeline stages, in one process, by its workload's ``PipelineCut``.

Each stage is a module taking one tensor and returning one (what ``pipeline_schedule`` sends
between ranks): the first stage takes the model's input tensor (token ids) and runs the cut's
``embed`` before its blocks, the others take the hidden state, and the last runs the cut's
``head`` after its blocks; the loss on the last stage's output (``StageSplit.loss``) is the
plain model's. The blocks are split as evenly as they go, the earlier stages taking one more
where they do not divide (as ``numpy.array_split`` does): ``blocks_per_stage`` says so.

A stage holds the plain model's own modules, so its parameters are the plain model's, shared,
not copied: ``param_names`` maps each stage's parameter names to the plain model's, for checks
against it. A weight that two stages need (an LM head tied to the token embedding, used by the
first stage and the last) is held by both and named in ``shared``: run in one process, both
uses add into the one gradient, as in the plain model; on separate ranks each holds a copy,
and the stages that share it must sum its gradient (Megatron's embedding group) before the
optimizer steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from parallel_kernels.workload import PipelineCut, Workload, workload_of


class StageError(RuntimeError):
    """A stage's forward raised: the message names the stage (a pipeline's error row)."""


@dataclass(frozen=True)
class _StageParts:
    """The modules one stage is made of (embed and head only at the ends)."""

    stage: int
    indices: tuple[int, ...]
    blocks: tuple[nn.Module, ...]
    block_inputs: nn.Module | None
    embed: nn.Module | None
    head: nn.Module | None


class StageModule(nn.Module):
    """One stage: the first stage's embedding, its blocks (named by their index in the plain
    model), the last stage's head; one tensor in, one out. An error in its forward is a
    ``StageError`` naming the stage."""

    def __init__(self, parts: _StageParts) -> None:
        super().__init__()
        self.index = parts.stage
        self.embed = parts.embed
        self.blocks = nn.ModuleDict(
            {str(i): b for i, b in zip(parts.indices, parts.blocks, strict=True)}
        )
        self.block_inputs = parts.block_inputs
        self.head = parts.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            return self._forward(x)
        except StageError:
            raise
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0]
            raise StageError(f"pipeline stage {self.index}: {type(e).__name__}: {first}") from e

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        extra = self.block_inputs(x) if self.block_inputs is not None else {}
        for block in self.blocks.values():
            x = block(x, **extra)
        return self.head(x) if self.head is not None else x


@dataclass(frozen=True)
class SharedParam:
    """A plain-model parameter that more than one stage holds (a tied embedding and head)."""

    name: str
    stages: tuple[int, ...]


@dataclass(frozen=True)
class StageSplit:
    """A model cut into stages: the stage modules, the plain model's block indices each holds,
    each stage's parameter names mapped to the plain model's, and the parameters held by more
    than one stage."""

    workload: Workload
    stages: tuple[StageModule, ...]
    blocks: tuple[tuple[int, ...], ...]
    param_names: tuple[Mapping[str, str], ...]
    shared: tuple[SharedParam, ...]

    @property
    def blocks_per_stage(self) -> tuple[int, ...]:
        return tuple(len(b) for b in self.blocks)

    @property
    def uneven(self) -> bool:
        return len(set(self.blocks_per_stage)) > 1

    def stage_batch(self, inputs: Any, targets: Any) -> tuple[torch.Tensor, Any]:
        """A batch as the pipeline takes it: the first stage's one tensor, the last stage's
        targets."""
        split = self.workload.pipeline.split_batch
        return split(inputs, targets) if split is not None else (inputs, targets)

    def loss(self, output: torch.Tensor, targets: Any) -> torch.Tensor:
        """The loss on the last stage's output: the plain model's loss on the same batch."""
        loss = self.workload.pipeline.loss
        return (
            loss(output, targets)
            if loss is not None
            else self.workload.compute_loss(output, targets)
        )


def block_ranges(blocks: int, stages: int) -> tuple[tuple[int, ...], ...]:
    """``blocks`` block indices in ``stages`` consecutive runs as even as they go, the earlier
    runs one longer where they do not divide."""
    if stages < 1:
        raise ValueError(f"a pipeline needs at least 1 stage, got {stages}")
    if stages > blocks:
        raise ValueError(
            f"cannot split {blocks} blocks into {stages} stages: each stage needs a block"
        )
    base, extra = divmod(blocks, stages)
    out, start = [], 0
    for i in range(stages):
        n = base + (1 if i < extra else 0)
        out.append(tuple(range(start, start + n)))
        start += n
    return tuple(out)


def pipeline_cut(model: nn.Module) -> tuple[Workload, PipelineCut]:
    """The workload the model was built from and its ``PipelineCut``, or one line naming the
    missing fact."""
    wl = workload_of(model)
    if wl is None:
        raise ValueError("the model carries no workload to say how to cut it (build_model)")
    if wl.pipeline is None:
        raise ValueError(
            f"workload {wl.name} does not say where its repeated blocks are (Workload.pipeline)"
        )
    return wl, wl.pipeline


def split_stages(model: nn.Module, stages: int) -> StageSplit:
    """The model (built by ``build_model``) cut into ``stages`` stages sharing its parameters;
    more stages than blocks, or a cut that leaves a parameter on no stage, is one ValueError."""
    wl, cut = pipeline_cut(model)
    blocks = cut.blocks(model)
    try:
        ranges = block_ranges(len(blocks), stages)
    except ValueError as e:
        raise ValueError(f"workload {wl.name}: {e}") from None
    block_inputs = cut.block_inputs(model) if cut.block_inputs is not None else None
    embed, head = cut.embed(model), cut.head(model)
    modules = tuple(
        StageModule(
            _StageParts(
                stage=s,
                indices=r,
                blocks=tuple(blocks[i] for i in r),
                block_inputs=block_inputs,
                embed=embed if s == 0 else None,
                head=head if s == stages - 1 else None,
            )
        )
        for s, r in enumerate(ranges)
    )
    names = _plain_names(wl, model, modules)
    return StageSplit(wl, modules, ranges, names, _shared(wl, model, names))


def _plain_names(
    wl: Workload, model: nn.Module, stages: tuple[StageModule, ...]
) -> tuple[dict[str, str], ...]:
    """Each stage's parameter names -> the plain model's names for the same tensors."""
    plain = {id(p): n for n, p in model.named_parameters()}
    out = []
    for s, stage in enumerate(stages):
        foreign = [n for n, p in stage.named_parameters() if id(p) not in plain]
        if foreign:
            raise ValueError(
                f"workload {wl.name}'s pipeline cut gives stage {s} parameters the model does "
                f"not have ({', '.join(foreign)}): its parts must be the model's own modules"
            )
        out.append({n: plain[id(p)] for n, p in stage.named_parameters()})
    return tuple(out)


def _shared(
    wl: Workload, model: nn.Module, names: tuple[dict[str, str], ...]
) -> tuple[SharedParam, ...]:
    """The plain parameters held by more than one stage; a parameter on no stage is refused."""
    holders: dict[str, list[int]] = {n: [] for n, _ in model.named_parameters()}
    for s, mapping in enumerate(names):
        for plain in mapping.values():
            holders[plain].append(s)
    missing = [n for n, stages in holders.items() if not stages]
    if missing:
        raise ValueError(
            f"workload {wl.name}'s pipeline cut puts parameters on no stage "
            f"({', '.join(missing)}): its embed, blocks and head must hold them all"
        )
    return tuple(SharedParam(n, tuple(s)) for n, s in holders.items() if len(s) > 1)
