"""Plain models and their synthetic data: the built-in workloads, and the one lookup for every
``--model`` name (``workload``).

Models carry no parallel code: strategies (``strategies.py``) wrap or rewrite them. Each entry of
``MODELS`` is a ``Workload`` (``workload.py``): how to build the model, how to make a deterministic
synthetic batch for it, which loss it trains with and the facts parallelism needs, so the harness
and the tests treat every model alike, the user's own and the zoo's too.
"""

from __future__ import annotations

import itertools
import operator

import torch
import torch.nn.functional as F
from torch import nn

from parallel_kernels.workload import PipelineCut, Workload, in_order, stamp


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


class TokenPositions(nn.Module):
    """The ``Transformer``'s embedding as one module (token ids -> the hidden state): a
    pipeline's first stage runs it before its blocks."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.tok, self.pos = model.tok, model.pos

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


TRANSFORMER_CUT = PipelineCut(
    blocks=operator.attrgetter("blocks"), embed=TokenPositions, head=in_order("ln_f", "head")
)


def _classification_data(
    n: int, seed: int, features: int = 784, classes: int = 10
) -> tuple[torch.Tensor, torch.Tensor]:
    # Labels come from a fixed random linear teacher so that the loss can actually fall.
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    return x, (x @ teacher).argmax(dim=1)


def _token_data(n: int, seed: int, vocab: int = 512, seq: int = 64) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def tp_plan_of(model: nn.Module) -> dict:
    """The built-in models' Megatron plans (``tensor_parallel.builtin_plan``), imported late:
    the TP module imports this one's classes."""
    from parallel_kernels.tensor_parallel import builtin_plan

    return builtin_plan(model)


def _classification_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target)


def _lm_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


ModelSpec = Workload  # the name these entries had before workloads were public


MODELS: dict[str, Workload] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="mlp",
            description="seed MLP 784-256-128-10 (235,146 params)",
            build=MLP,
            batch=_classification_data,
            loss=_classification_loss,
            tp_plan=tp_plan_of,
        ),
        ModelSpec(
            name="wide_mlp",
            description="MLP 784-2048x3-10 (10.0 M params, 40 MB of fp32 gradients)",
            build=wide_mlp,
            batch=_classification_data,
            loss=_classification_loss,
            tp_plan=tp_plan_of,
        ),
        ModelSpec(
            name="transformer",
            description="4-block decoder, dim 256, seq 64, vocab 512 (3.4 M params)",
            build=Transformer,
            batch=_token_data,
            loss=_lm_loss,
            tokens_per_sample=64,
            fsdp_units=(Block,),
            tp_plan=tp_plan_of,
            pipeline=TRANSFORMER_CUT,
        ),
    )
}


def workload(name: str) -> Workload:
    """The workload a ``--model`` name stands for: a built-in model (``mlp``), a zoo model at a
    size (``llama:tiny``), or your own (``path/to/file.py:factory``, ``package.module:factory``).
    A name that resolves to none raises ValueError with one line saying why."""
    if name in MODELS:
        return MODELS[name]
    from parallel_kernels.user_model import resolve  # zoo and user factories, loaded on demand

    return resolve(name, known=tuple(MODELS))


def build_model(name: str, seed: int = 0) -> nn.Module:
    """Build a model with deterministic initial weights (the same on every rank), carrying its
    workload (``model.bench_workload``) for the strategies that need its facts."""
    wl = workload(name)
    torch.manual_seed(seed)
    model = wl.build()
    stamp(model, wl)
    return model


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def grad_bytes(model: nn.Module) -> int:
    """Bytes of all trainable parameters' gradients (what data parallelism must all-reduce)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
