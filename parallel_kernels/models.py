"""Plain models and their synthetic data.

Models carry no parallel code: strategies (``strategies.py``) wrap or rewrite them. Each entry of
``MODELS`` says how to build the model, how to make a deterministic synthetic dataset for it and
which loss it trains with, so the harness and the tests treat every model alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


class MLP(nn.Module):
    """The seed's MLP: 784-256-128-10 with ReLU, 235,146 parameters (under 1 MB of fp32)."""

    def __init__(self, sizes: tuple[int, ...] = (784, 256, 128, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(d_in, d_out))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def wide_mlp() -> MLP:
    """784-2048-2048-2048-10: about 10.0 M parameters, 40 MB of fp32 gradients.

    Big enough that the bucket size changes how many all-reduces a step issues and how much of
    backward they can hide behind, yet a step still takes well under a second on one CPU core.
    """
    return MLP((784, 2048, 2048, 2048, 10))


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then a 4x MLP.

    Queries, keys and values are separate layers and the forward reads the number of heads from
    the tensors (``head_dim`` is fixed), so that a tensor-parallel rewrite can split the heads
    across ranks by splitting the rows of q, k and v, without the block knowing (as torchtitan's
    plain models do)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.ln1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.ln1(x)
        q, k, v = (
            lin(h).view(b, s, -1, self.head_dim).transpose(1, 2) for lin in (self.q, self.k, self.v)
        )
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    """A small decoder-only language model (token + position embedding, blocks, LM head)."""

    def __init__(
        self, *, vocab: int = 512, dim: int = 256, heads: int = 4, layers: int = 4, seq: int = 64
    ) -> None:
        super().__init__()
        self.seq = seq
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _classification_data(
    n: int, seed: int, features: int = 784, classes: int = 10
) -> TensorDataset:
    # Labels come from a fixed random linear teacher so that the loss can actually fall.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def _token_data(n: int, seed: int, vocab: int = 512, seq: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def _classification_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target)


def _lm_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    description: str
    build: Callable[[], nn.Module]
    dataset: Callable[[int, int], TensorDataset]  # (samples, seed) -> dataset
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    # Activation rows per sample (the sequence length of a language model, else 1): tensor
    # parallelism moves batch x tokens_per_sample x hidden elements per collective.
    tokens_per_sample: int = 1


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="mlp",
            description="seed MLP 784-256-128-10 (235,146 params)",
            build=MLP,
            dataset=_classification_data,
            loss=_classification_loss,
        ),
        ModelSpec(
            name="wide_mlp",
            description="MLP 784-2048x3-10 (10.0 M params, 40 MB of fp32 gradients)",
            build=wide_mlp,
            dataset=_classification_data,
            loss=_classification_loss,
        ),
        ModelSpec(
            name="transformer",
            description="4-block decoder, dim 256, seq 64, vocab 512 (3.4 M params)",
            build=Transformer,
            dataset=_token_data,
            loss=_lm_loss,
            tokens_per_sample=64,
        ),
    )
}


def build_model(name: str, seed: int = 0) -> nn.Module:
    """Build a model with deterministic initial weights (the same on every rank)."""
    torch.manual_seed(seed)
    return MODELS[name].build()


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def grad_bytes(model: nn.Module) -> int:
    """Bytes of all trainable parameters' gradients (what data parallelism must all-reduce)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
