"""A model with every kind of parameter and buffer real models have, for the ``--model
FILE:factory`` contract: tied input/output embeddings, blocks in a ``ModuleDict``, a learned
0-dim gate, a ``ParameterList``, a frozen parameter, integer, boolean, non-contiguous and
non-persistent buffers, and a dict output carrying its own loss.

``workload`` is the right factory; ``returns_a_dict_batch`` is the mistake of returning the
model's batch dict where ``(inputs, targets)`` is asked for.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from parallel_kernels import Workload

VOCAB, DIM, SEQ, LAYERS = 64, 32, 8, 2


class Block(nn.Module):
    """A residual MLP block with a learned gate, 0-dim unless ``GATE_SHAPE`` says otherwise
    (``up``/``down``: a column/row pair)."""

    gate_shape: tuple[int, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, 2 * DIM)
        self.down = nn.Linear(2 * DIM, DIM)
        self.gate = nn.Parameter(torch.full(self.gate_shape, 0.5))  # 0-dim by default
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))  # integer buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gate * self.down(F.gelu(self.up(self.norm(x))))


class Odd(nn.Module):
    block: type[Block] = Block

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleDict({f"b{i}": self.block() for i in range(LAYERS)})
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(DIM)) for _ in range(2)])
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied input/output embeddings
        self.frozen = nn.Parameter(torch.randn(DIM), requires_grad=False)
        self.register_buffer("mask", torch.ones(VOCAB, dtype=torch.bool))  # boolean buffer
        # non-contiguous: a transposed view
        self.register_buffer("basis", (torch.randn(DIM, DIM) / DIM**0.5).t())
        self.register_buffer("scratch", torch.zeros(DIM), persistent=False)  # not in state_dict

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> dict:
        x = self.embed(tokens) * self.scales[0] + self.frozen
        for block in self.blocks.values():
            x = block(x)
        x = (x @ self.basis) * self.scales[1] + self.scratch
        logits = self.head(x).masked_fill(~self.mask, -1e4)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"logits": logits, "loss": loss}


def batch(size: int, seed: int) -> tuple[dict, None]:
    """The batch as a dict of the forward's arguments, no separate targets: the loss is the
    model's own."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (size, SEQ), generator=g)
    return {"tokens": tokens, "labels": (tokens + 1) % VOCAB}, None


def workload() -> Workload:
    return Workload(
        name="odd",
        build=Odd,
        batch=batch,
        loss=None,
        description="every kind of parameter and buffer",
        tokens_per_sample=SEQ,
        fsdp_units=(Block,),
        tp_plan={"blocks.*.up": "colwise", "blocks.*.down": "rowwise"},
    )


class Block1D(Block):
    """The same block with a gate of shape (1,): what torch's FSDPs can shard."""

    gate_shape = (1,)


class Odd1D(Odd):
    """The same weights (a gate is made without randomness), the gates 1-D."""

    block = Block1D


def workload_1d_gate() -> Workload:
    """torch's FSDP1 and FSDP2 refuse 0-dim parameters ("Change gate to a 1D tensor with numel
    equal to 1"): the same model with its gates 1-D, for them."""
    return replace(workload(), name="odd_1d", build=Odd1D, fsdp_units=(Block1D,))


def returns_a_dict_batch() -> Workload:
    """The mistake: ``batch`` returns what the model takes, not ``(inputs, targets)``."""
    return Workload(name="odd_dict", build=Odd, loss=None, batch=lambda n, s: batch(n, s)[0])
