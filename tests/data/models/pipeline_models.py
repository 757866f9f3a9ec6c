"""Models for tests/test_pipeline_schedules.py: small language models of 4 blocks, so that 2
ranks can hold 2 stages each.

- ``tied``: its head tied to its embedding. Interleaved over 2 ranks the first stage (rank 0)
  and the last (rank 1) hold the tie apart; on a V (ZBV, DualPipeV) rank 0 holds both.
- ``failing``: its last block raises in every forward: the pipeline's last stage fails.
"""

from __future__ import annotations

import operator
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from parallel_kernels import Workload
from parallel_kernels.workload import PipelineCut, in_order

DIM, VOCAB, SEQ, LAYERS = 32, 64, 8, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class FailingBlock(Block):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this block always fails")


class TiedLM(nn.Module):
    def __init__(self, last: type[nn.Module] = Block) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([*(Block() for _ in range(LAYERS - 1)), last()])
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def batch(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (size, SEQ), generator=g)
    return tokens, (tokens * 7 + 3) % VOCAB


def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))


def tied() -> Workload:
    return Workload(
        name="tied4",
        build=TiedLM,
        batch=batch,
        loss=loss,
        tokens_per_sample=SEQ,
        fsdp_units=(Block,),
        pipeline=PipelineCut(
            blocks=operator.attrgetter("blocks"), embed=in_order("embed"), head=in_order("head")
        ),
    )


def _failing_lm() -> TiedLM:
    return TiedLM(last=FailingBlock)


def failing() -> Workload:
    return replace(tied(), name="failing", build=_failing_lm)
