"""Reference tensor parallelism after Megatron-LM (Shoeybi et al. 2019, section 3).

A column-parallel linear layer holds a slice of the output features (rows of the weight), a
row-parallel one a slice of the input features (columns). Paired, column then row, they need one
all-reduce forward and one backward for the pair, through Megatron's conjugate operators:

- ``f`` (``CopyToTP``): identity forward, all-reduce of the gradient backward. It sits where a
  replicated activation enters column-parallel layers: each rank computes only its share of that
  activation's gradient.
- ``g`` (``ReduceFromTP``): all-reduce forward, identity backward. It ends a row-parallel layer:
  each rank holds a partial sum of the output.

The naive variant (``NaiveColumnLinear``) is the seed's column layer: it all-gathers its output
in forward so that every layer looks dense from outside. Its backward is made correct here: the
output gradient is replicated, so a rank keeps its own slice, and the input gradient, partial on
every rank, is all-reduced (an ``f`` in front of the layer). It moves more bytes than the pair
and recomputes everything between layers on every rank; the report shows how much.

Parallelism is applied to a plain model by ``apply_plan`` from a plan (``tp_plan``,
``naive_plan``): module name -> ``Placement``. The native implementation (``strategies.py``)
reads the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from parallel_kernels.workload import COLWISE, ROWWISE, expand_plan, workload_of

# The current name of all_gather_into_tensor (torch >= 2.12).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

COPY, NAIVE = "copy", "naive"  # beside the workload's COLWISE and ROWWISE


def _all_reduce(t: torch.Tensor, group) -> None:
    # Blocking: the main thread waits for it. The name says so, for the trace analysis, which
    # counts main-thread time spent waiting on a collective as communication, not compute.
    with record_function("tp:wait_all_reduce"):
        dist.all_reduce(t, group=group)


class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # A copy: autograd may hand the same gradient tensor to another branch (add's backward).
        grad = grad.contiguous().clone()
        _all_reduce(grad, ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        # In place: x is a fresh matmul output that nothing saved for backward.
        ctx.mark_dirty(x)
        _all_reduce(x, group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class GatherFromTP(torch.autograd.Function):
    """The naive layer's output: all-gather the feature slices along the last dimension
    forward; backward keeps this rank's slice of the (replicated) output gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        n = dist.get_world_size(group)
        ctx.rank, ctx.n = dist.get_rank(group), n
        x = x.contiguous()
        out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        with record_function("tp:wait_all_gather"):
            _all_gather(out, x, group=group)
        return torch.cat(out.view(n, *x.shape).unbind(0), dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.chunk(ctx.n, dim=-1)[ctx.rank].contiguous(), None


def _slice(t: torch.Tensor, dim: int, rank: int, n: int) -> torch.Tensor:
    return t.detach().chunk(n, dim=dim)[rank].clone()


class ColumnParallelLinear(nn.Linear):
    """Rows ``rank``/``n`` of a dense layer's weight and bias: output features split across
    ranks, the output left split. ``copy_input`` puts an ``f`` in front; off when the input
    already went through one shared with sibling layers (q, k and v share one)."""

    def __init__(self, dense: nn.Linear, group, *, copy_input: bool = True) -> None:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        super().__init__(
            dense.in_features,
            dense.out_features // n,
            bias=dense.bias is not None,
            device=dense.weight.device,
            dtype=dense.weight.dtype,
        )
        with torch.no_grad():
            self.weight.copy_(_slice(dense.weight, 0, rank, n))
            if self.bias is not None:
                self.bias.copy_(_slice(dense.bias, 0, rank, n))
        self.group, self.copy_input = group, copy_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.copy_input:
            x = CopyToTP.apply(x, self.group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Linear):
    """Columns ``rank``/``n`` of a dense layer's weight: input features split across ranks,
    partial outputs summed by ``g``; the bias, replicated, is added once after the sum."""

    def __init__(self, dense: nn.Linear, group) -> None:
        n, rank = dist.get_world_size(group), dist.get_rank(group)
        super().__init__(
            dense.in_features // n,
            dense.out_features,
            bias=dense.bias is not None,
            device=dense.weight.device,
            dtype=dense.weight.dtype,
        )
        with torch.no_grad():
            self.weight.copy_(_slice(dense.weight, 1, rank, n))
            if self.bias is not None:
                self.bias.copy_(dense.bias.detach())
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ReduceFromTP.apply(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class NaiveColumnLinear(ColumnParallelLinear):
    """The seed's column layer: ``f``, a slice of the output features, then an all-gather so
    that the output is whole on every rank."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GatherFromTP.apply(super().forward(x), self.group)


@dataclass(frozen=True)
class Placement:
    """Where a module sits in a tensor-parallel plan.

    ``style``: ``colwise`` (output features split), ``rowwise`` (input features split, output
    all-reduced), ``copy`` (an ``f`` on the module's output, shared by the column layers that
    read it) or ``naive`` (the seed's column layer, output gathered). ``copy_input``: a column
    layer with its own ``f``. ``input_grad``: False where the input is the training data, which
    needs no gradient, so that ``f`` moves nothing backward.
    """

    style: str
    copy_input: bool = True
    input_grad: bool = True


def tp_plan(model: nn.Module) -> dict[str, Placement]:
    """The model's tensor-parallel plan: its workload's (``Workload.tp_plan``: module-name
    patterns to ``colwise``/``rowwise``, or a function of the model), expanded over the
    model's module names; a workload without one is refused, naming the missing fact. A
    built-in model built outside the registry (tests) gets ``builtin_plan``."""
    wl = workload_of(model)
    if wl is None:
        return builtin_plan(model)
    if wl.tp_plan is None:
        raise ValueError(
            f"tensor parallelism needs a tp_plan, which workload {wl.name} does not give"
        )
    plan = wl.tp_plan(model) if callable(wl.tp_plan) else wl.tp_plan
    return {name: _placement(name, p) for name, p in expand_plan(model, plan).items()}


def _placement(name: str, p) -> Placement:
    if isinstance(p, Placement):
        return p
    if p in (COLWISE, ROWWISE):
        return Placement(p)
    raise ValueError(f"the tensor-parallel plan places {name} {p!r}: not colwise or rowwise")


def builtin_plan(model: nn.Module) -> dict[str, Placement]:
    """The Megatron plan for a built-in model: per transformer block, q, k, v column-parallel
    behind one shared ``f`` on ``ln1`` (heads split across ranks), the output projection
    row-parallel, and fc1/fc2 as a column/row pair; embeddings, norms and the head stay
    replicated. For an MLP, consecutive linear layers pair up column/row; an odd last layer
    stays replicated."""
    blocks = getattr(model, "blocks", None)
    plan: dict[str, Placement] = {}
    if blocks is not None:
        for i in range(len(blocks)):
            p = f"blocks.{i}."
            plan[p + "ln1"] = Placement(COPY)
            for name in ("q", "k", "v"):
                plan[p + name] = Placement(COLWISE, copy_input=False)
            plan[p + "proj"] = Placement(ROWWISE)
            plan[p + "fc1"] = Placement(COLWISE)
            plan[p + "fc2"] = Placement(ROWWISE)
        return plan
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    for k in range(0, len(linears) - 1, 2):
        plan[linears[k]] = Placement(COLWISE, input_grad=k > 0)
        plan[linears[k + 1]] = Placement(ROWWISE)
    return plan


def naive_plan(model: nn.Module, n: int) -> dict[str, Placement]:
    """The seed's variant: every linear layer of the Megatron plan becomes a naive column
    layer, except one whose output features ``n`` does not divide (an MLP's 10-way classifier
    at degree 4), which stays replicated."""
    modules = dict(model.named_modules())
    return {
        name: Placement(NAIVE, input_grad=p.input_grad)
        for name, p in tp_plan(model).items()
        if p.style != COPY and modules[name].out_features % n == 0
    }


TP_LAYERS = ("megatron", "naive")


def plan_for(model: nn.Module, layer: str, n: int) -> dict[str, Placement]:
    """The plan of an implementation's TP layers: Megatron's pairs, or the naive columns."""
    if layer not in TP_LAYERS:
        raise ValueError(f"unknown TP layers {layer!r} (known: {', '.join(TP_LAYERS)})")
    return naive_plan(model, n) if layer == "naive" else tp_plan(model)


def shard_dims(model: nn.Module, plan: dict[str, Placement]) -> dict[str, int]:
    """Parameter name -> the dimension split across TP ranks (absent: replicated)."""
    dims = {}
    for name, place in plan.items():
        if place.style in (COLWISE, NAIVE):
            dims[f"{name}.weight"] = dims[f"{name}.bias"] = 0
        elif place.style == ROWWISE:
            dims[f"{name}.weight"] = 1
    params = dict(model.named_parameters())
    return {k: d for k, d in dims.items() if k in params}


def check_degree(model: nn.Module, plan: dict[str, Placement], n: int) -> None:
    """A TP degree must split every split dimension, and the heads, evenly."""
    if n < 1:
        raise ValueError(f"TP degree must be at least 1, got {n}")
    modules = dict(model.named_modules())
    for name, place in plan.items():
        m = modules[name]
        split, what = (
            (m.in_features, "input")
            if place.style == ROWWISE
            else (getattr(m, "out_features", 0), "output")
        )
        if place.style != COPY and split % n:
            raise ValueError(f"TP degree {n} does not divide {name}'s {split} {what} features")
    for name, m in modules.items():
        heads = getattr(m, "heads", None)
        if heads is not None and heads % n:
            raise ValueError(f"TP degree {n} does not divide the {heads} heads of {name}")
    # An attention module that names its head size (Hugging Face's): every column-parallel
    # projection in it must split into whole heads per rank (grouped-query keys and values too).
    for name, place in plan.items():
        parent = modules.get(name.rpartition(".")[0])
        # (Hugging Face names it head_dim in Llama's attention, attention_head_size in BERT's)
        head_dim = getattr(parent, "head_dim", None) or getattr(parent, "attention_head_size", None)
        out = getattr(modules[name], "out_features", None)
        if place.style == COLWISE and isinstance(head_dim, int) and out and (out // head_dim) % n:
            raise ValueError(f"TP degree {n} does not divide the {out // head_dim} heads of {name}")


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def _copy_output(group):
    def hook(_module, _args, output):
        return CopyToTP.apply(output, group)

    return hook


_LAYERS = {
    COLWISE: lambda dense, group, place: ColumnParallelLinear(
        dense, group, copy_input=place.copy_input
    ),
    ROWWISE: lambda dense, group, place: RowParallelLinear(dense, group),
    NAIVE: lambda dense, group, place: NaiveColumnLinear(dense, group),
}


def apply_plan(model: nn.Module, plan: dict[str, Placement], group) -> nn.Module:
    """Rewrite ``model`` in place: each planned linear layer becomes its parallel version
    holding this rank's slice of the dense weights; each ``copy`` point gets its ``f``."""
    check_degree(model, plan, dist.get_world_size(group))
    modules = dict(model.named_modules())
    for name, place in plan.items():
        if place.style == COPY:
            modules[name].register_forward_hook(_copy_output(group))
        else:
            _set_module(model, name, _LAYERS[place.style](modules[name], group, place))
    return model


def comm_calls(
    model: nn.Module, plan: dict[str, Placement], tokens: int, n: int
) -> list[tuple[str, str, float]]:
    """The TP collectives of one training step, in forward order: (collective, phase,
    elements) with phase ``forward`` or ``backward``, for ``tokens`` activation rows (batch x
    sequence) of the plain ``model``, each counted by its input as the traces record it.

    Megatron plan: one all-reduce of tokens x out per row-parallel layer forward (``g``) and one
    of tokens x in per ``f`` backward, a shared ``f`` counted once: for hidden size h an MLP
    block moves b*s*h forward and b*s*h backward (Shoeybi et al. 2019, section 3). Naive plan:
    per layer an all-gather of its output slice (tokens x out / n) forward and an all-reduce of
    tokens x in backward. An ``f`` whose input is the data moves nothing.
    """
    if n == 1:
        return []
    modules = dict(model.named_modules())
    calls: list[tuple[str, str, float]] = []
    for name, place in plan.items():
        m = modules[name]
        if place.style == ROWWISE:
            calls.append(("all_reduce", "forward", tokens * m.out_features))
        elif place.style == COPY:
            calls.append(("all_reduce", "backward", tokens * m.normalized_shape[0]))
        elif place.copy_input and place.input_grad:
            calls.append(("all_reduce", "backward", tokens * m.in_features))
        if place.style == NAIVE:
            calls.append(("all_gather", "forward", tokens * m.out_features / n))
    return calls


def comm_elements(
    model: nn.Module, plan: dict[str, Placement], tokens: int, n: int
) -> dict[str, float]:
    """Elements one rank hands to TP collectives per training step, by collective (the sums of
    ``comm_calls``)."""
    if n == 1:
        return {}
    out = {"all_reduce": 0.0, "all_gather": 0.0}
    for collective, _, elements in comm_calls(model, plan, tokens, n):
        out[collective] += elements
    return out


def local_param_count(model: nn.Module, dims: dict[str, int], n: int) -> int:
    """Parameters one TP rank holds: split ones count 1/n."""
    return sum(
        p.numel() // n if name in dims else p.numel() for name, p in model.named_parameters()
    )
