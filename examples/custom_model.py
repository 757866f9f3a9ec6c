"""A worked example of benchmarking your own model: a small token tagger.

    torchrun --nproc_per_node=2 bench/run.py --sweep bucket_cap_mb \
        --model examples/custom_model.py:workload

``workload()`` returns a ``Workload``: how to build the model, how to make a deterministic
synthetic batch, the loss, and the facts that parallelism needs (the blocks FSDP wraps and
activation checkpointing recomputes, a tensor-parallel plan, where a pipeline cuts it). Leave
out a fact and the strategies that need it give an error row naming it; every other sweep
still runs.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from parallel_kernels import Workload
from parallel_kernels.workload import PipelineCut, in_order

VOCAB, TAGS, DIM, SEQ, LAYERS = 1000, 16, 128, 32, 4


class Block(nn.Module):
    """A pre-norm residual MLP block: ``up`` and ``down`` are a column/row tensor-parallel pair."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Tagger(nn.Module):
    """Embeds tokens, runs the blocks, tags every token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(DIM) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, TAGS)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` samples of SEQ tokens, each tagged by its token id (a rule the model can learn),
    the same for the same seed on every rank."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (size, SEQ), generator=g)
    return tokens, tokens % TAGS


def loss(logits: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, TAGS), tags.reshape(-1))


def workload() -> Workload:
    return Workload(
        name="tagger",
        description=f"token tagger, {LAYERS} residual MLP blocks, dim {DIM}, seq {SEQ}",
        build=Tagger,
        batch=batch,
        loss=loss,
        tokens_per_sample=SEQ,  # activation rows per sample, for tensor parallelism's volume
        fsdp_units=(Block,),  # FSDP's units, and what activation checkpointing recomputes
        tp_plan={"blocks.*.up": "colwise", "blocks.*.down": "rowwise"},
        # pipeline stages: the embedding first, the blocks split between the stages, the head last
        pipeline=PipelineCut(
            blocks=operator.attrgetter("blocks"), embed=in_order("embed"), head=in_order("head")
        ),
    )
