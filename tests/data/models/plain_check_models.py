"""Models that a strategy can get wrong without a word, for tests/test_plain_check.py: each one
trains, and only the check against the plain model says that it trained another function.

- ``gated_mlp``: a gated MLP whose forward splits one projection's output in two
  (``u, v = self.up(x).chunk(2, dim=-1)``) under a plan that shards ``up`` column-wise: every
  rank pairs halves of its own slice, not the plain model's halves.
  ``swiglu`` is the same function written as tensor parallelism needs it (separate gate and up
  projections, both column-wise): right.
- ``tied_split``: a language model with its head tied to its embedding, whose FSDP units name
  the embedding apart from the root that holds the head: the tie is split across units.
- ``rank_batch``: a workload whose batches depend on the rank that makes them.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parallel_kernels import Workload

DIM, HIDDEN, VOCAB, SEQ, LAYERS = 32, 64, 64, 8, 2


class GatedBlock(nn.Module):
    """x + down(silu(u) * v), (u, v) the two halves of one projection."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, v = self.up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(u) * v)


class SwiGLUBlock(nn.Module):
    """The same function with the halves as two projections (Llama's MLP)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.gate = nn.Linear(DIM, HIDDEN)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Tagger(nn.Module):
    """Embed tokens, the blocks, a head over the vocabulary (tied to the embedding when
    ``tied``)."""

    def __init__(self, block: type[nn.Module] = GatedBlock, tied: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        if tied:
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


def gated_mlp() -> Workload:
    return Workload(
        name="gated_mlp",
        build=Tagger,
        batch=batch,
        loss=loss,
        tokens_per_sample=SEQ,
        fsdp_units=(GatedBlock,),
        tp_plan={"blocks.*.up": "colwise", "blocks.*.down": "rowwise"},
    )


def swiglu() -> Workload:
    return Workload(
        name="swiglu",
        build=lambda: Tagger(SwiGLUBlock),
        batch=batch,
        loss=loss,
        tokens_per_sample=SEQ,
        fsdp_units=(SwiGLUBlock,),
        tp_plan={"blocks.*.gate": "colwise", "blocks.*.up": "colwise", "blocks.*.down": "rowwise"},
    )


def tied() -> Workload:
    """Head tied to the embedding, the blocks FSDP's units: right (the root holds both)."""
    return Workload(
        name="tied",
        build=lambda: Tagger(SwiGLUBlock, tied=True),
        batch=batch,
        loss=loss,
        tokens_per_sample=SEQ,
        fsdp_units=(SwiGLUBlock,),
    )


def tied_split() -> Workload:
    """The wrong unit list: the embedding a unit of its own, so the tied weight is sharded
    with the embedding while the head, left to the root, holds it apart."""
    return replace(tied(), name="tied_split", fsdp_units=(nn.Embedding, SwiGLUBlock))


def _rank_batch(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    rank = dist.get_rank() if dist.is_initialized() else 0
    return batch(size, seed + 1000 * rank)  # the mistake: each rank its own data set


def rank_batch() -> Workload:
    return replace(swiglu(), name="rank_batch", batch=_rank_batch)


# Forward calls of every model ``counted`` built in this process, by instance, in order of
# their first call (not on FakeTensors or meta: the FLOP counter's runs). Instances are told
# apart by a serial number: ``id`` is an address, which a model built after another is freed
# can reuse (two instances' calls then counted as one's).
FORWARDS: dict[int, int] = {}
_SERIALS = itertools.count()


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DIM))
        self.serial = next(_SERIALS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x).__name__ != "FakeTensor" and not x.is_meta:
            FORWARDS[self.serial] = FORWARDS.get(self.serial, 0) + 1
        return self.net(x)


def _regression(size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, DIM, generator=g)
    return x, x.flip(-1)


def counted() -> Workload:
    """A small MLP that counts its forward calls (import it by module path, so that the test
    reads the same ``FORWARDS``)."""
    return Workload(name="counted", build=Counted, batch=_regression, loss=F.mse_loss)
