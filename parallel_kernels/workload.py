"""``Workload``: everything the suite needs to benchmark a model, yours included.

A workload says how to build the plain module (called after ``torch.manual_seed``, so every
rank builds the same weights), how to make a deterministic synthetic batch of any size, and the
loss; optionally the facts parallelism needs, which the suite cannot guess for a model it has
never met: which module classes are the units FSDP wraps (and activation checkpointing
recomputes), a tensor-parallel plan, and the FLOPs of one sample when you know them better than
the counter. Where a strategy needs a fact the workload does not give, the point is an error row
that names it. Pass one to any sweep with ``--model path/to/file.py:factory`` or
``--model package.module:factory``, ``factory()`` returning a ``Workload``
(``examples/custom_model.py``).

Inputs and targets may be a tensor, a tuple of tensors or a dict of them (a dict is passed as
keyword arguments: ``model(**inputs)``), each with the batch as its first dimension. A model
that returns its own loss (a dict with ``"loss"``, a Hugging Face ``ModelOutput``) needs no
``loss``: leave it None, and the targets may be None too.
"""

from __future__ import annotations

import fnmatch
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

COLWISE, ROWWISE = "colwise", "rowwise"  # the placements a tp_plan names


@dataclass(frozen=True, kw_only=True)
class PipelineCut:
    """How a pipeline cuts the model into stages, each a module taking one tensor and returning
    one (``parallel_kernels/pipeline_stages.py``): the parts are functions of the built model
    returning its own modules (never new parameters), so that a stage shares the plain
    model's weights. The first stage runs ``embed`` (the model's input tensor -> the hidden
    state) before its blocks, the last ``head`` (the hidden state -> the output the loss
    takes) after them; every stage calls each of its blocks as ``block(hidden,
    **block_inputs(hidden))``."""

    # the model's repeated blocks, in order (``operator.attrgetter("model.layers")``)
    blocks: Callable[[nn.Module], nn.ModuleList]
    # the first stage's part before its blocks: the model's input tensor -> the hidden state
    embed: Callable[[nn.Module], nn.Module]
    # the last stage's part after its blocks: the hidden state -> the loss's input (logits)
    head: Callable[[nn.Module], nn.Module]
    # what a block takes besides the hidden state (rotary positions, an attention mask), made
    # on every stage from the hidden state alone: a module, hidden state -> keyword arguments;
    # None: a block takes the hidden state alone
    block_inputs: Callable[[nn.Module], nn.Module] | None = None
    # a batch's (inputs, targets) -> (the first stage's one tensor, the targets the last stage's
    # loss takes); None: the inputs are that tensor and the targets are the loss's
    split_batch: Callable[[Any, Any], tuple[torch.Tensor, Any]] | None = None
    # (the last stage's output, its targets) -> the loss; None: the workload's own loss
    loss: Callable[[torch.Tensor, Any], torch.Tensor] | None = None


def _in_order(paths: tuple[str, ...], model: nn.Module) -> nn.Module:
    parts = [operator.attrgetter(p)(model) for p in paths]
    return parts[0] if len(parts) == 1 else nn.Sequential(*parts)


def in_order(*paths: str) -> Callable[[nn.Module], nn.Module]:
    """A ``PipelineCut`` part: the model's modules at these dotted paths, run one after the
    other (``in_order("model.norm", "lm_head")``); a partial, so workloads stay picklable."""
    return functools.partial(_in_order, paths)


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    build: Callable[[], nn.Module]
    # (batch size, seed) -> (inputs, targets): deterministic for a seed
    batch: Callable[[int, int], tuple[Any, Any]]
    # (model output, targets) -> scalar loss; None: the output carries its own loss
    loss: Callable[[Any, Any], torch.Tensor] | None = None
    description: str = ""
    # Activation rows per sample (a language model's sequence length, else 1): tensor
    # parallelism moves batch x tokens_per_sample x hidden elements per collective.
    tokens_per_sample: int = 1
    # The module classes FSDP makes its units (each one flat parameter / one fully_shard call;
    # a transformer's blocks, a ResNet's bottlenecks); empty: each Linear layer.
    fsdp_units: tuple[type[nn.Module], ...] = ()
    # The module classes activation checkpointing recomputes; None: the FSDP units.
    checkpoint_units: tuple[type[nn.Module], ...] | None = None
    # Tensor parallelism: module name (fnmatch pattern, e.g. "model.layers.*.mlp.up_proj") ->
    # "colwise" or "rowwise" (Megatron's pairs: a colwise layer's output feeds a rowwise one),
    # or a function of the plain model giving the plan; None: no tensor parallelism.
    tp_plan: Mapping[str, Any] | Callable[[nn.Module], Mapping[str, Any]] | None = None
    # Model FLOPs of one sample, forward plus backward, a multiply-add counted as 2 FLOPs (the
    # counter's convention and PaLM's: ResNet-50 is 24.3e9 per 224 x 224 image, not the 4.1e9
    # multiply-adds of its forward pass that papers quote); None: counted. MFU uses this figure,
    # and warns where it is more than 3x away from the counter's.
    flops_per_sample: float | None = None
    # Pipeline parallelism: where the repeated blocks are and what runs before and after them
    # (``PipelineCut``); None: the model cannot be split into stages.
    pipeline: PipelineCut | None = None

    def dataset(self, n: int, seed: int) -> Dataset:
        """``n`` samples made by ``batch(n, seed)``, indexed one at a time (for a sampler): a
        ``TensorDataset`` when inputs and targets are tensors."""
        inputs, targets = self.batch(n, seed)
        if torch.is_tensor(inputs) and torch.is_tensor(targets):
            return TensorDataset(inputs, targets)
        return SampleDataset(inputs, targets)

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        if isinstance(inputs, Mapping):
            return model(**inputs)
        if isinstance(inputs, tuple | list):
            return model(*inputs)
        return model(inputs)

    def compute_loss(self, output: Any, targets: Any) -> torch.Tensor:
        if self.loss is not None:
            return self.loss(output, targets)
        own = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if own is None:
            raise ValueError(
                f"workload {self.name} gives no loss and its model's output carries none "
                f"(a dict with 'loss', or an object with .loss)"
            )
        return own

    @property
    def block_types(self) -> tuple[type[nn.Module], ...]:
        """The classes activation checkpointing recomputes."""
        return self.fsdp_units if self.checkpoint_units is None else self.checkpoint_units


def stamp(model: nn.Module, wl: Workload) -> nn.Module:
    """Attach the workload to its built module: FSDP's units, activation checkpointing and the
    TP plan read their facts from it (``workload_of``), whichever wrapper applies them."""
    object.__setattr__(model, "bench_workload", wl)
    return model


def workload_of(model: nn.Module) -> Workload | None:
    """The workload a module was built from (None: built outside the registry, as some tests
    build the built-in classes directly)."""
    return getattr(model, "bench_workload", None)


def modules_of_types(model: nn.Module, types: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """The submodules of these classes, outermost only (a unit inside a unit is the outer one's),
    in module order."""
    found: list[nn.Module] = []
    inside: set[int] = set()
    for m in model.modules():
        if id(m) in inside:
            continue
        if m is not model and isinstance(m, types):
            found.append(m)
            inside.update(id(x) for x in m.modules())
    return found


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, what checkpointing, compile and float8 apply to: its
    workload's ``block_types``, outermost first, else a ``blocks`` attribute of the model; none
    where it has neither."""
    wl = workload_of(model)
    if wl is not None and wl.block_types:
        return modules_of_types(model, wl.block_types)
    return list(getattr(model, "blocks", None) or [])


def block_list(model: nn.Module) -> nn.ModuleList | None:
    """The longest ``ModuleList`` of the model's blocks (its workload's FSDP units, each the
    same class): a transformer's layers. None where the model has no such list."""
    wl = workload_of(model)
    types = wl.fsdp_units if wl is not None else ()
    lists = [
        m
        for m in model.modules()
        if isinstance(m, nn.ModuleList)
        and len(m) > 0
        and types
        and all(isinstance(b, types) and type(b) is type(m[0]) for b in m)
    ]
    return max(lists, key=len, default=None)


def keep_blocks(model: nn.Module, k: int) -> int:
    """Keep only the first ``k`` of the model's repeated blocks (``block_list``); the number it
    had. The planner tracks a model of one and of two blocks and extrapolates to all of them
    (bench/plan/memory.py): blocks of one class cost alike."""
    blocks = block_list(model)
    if blocks is None:
        raise ValueError("the model has no list of repeated blocks to shorten")
    n = len(blocks)
    if not 1 <= k <= n:
        raise ValueError(f"cannot keep {k} of the model's {n} blocks")
    del blocks[k:]
    return n


def _index(data: Any, i: int) -> Any:
    if data is None:
        return None
    if isinstance(data, Mapping):
        return {k: _index(v, i) for k, v in data.items()}
    if isinstance(data, tuple | list):
        return type(data)(_index(v, i) for v in data)
    return data[i]


def _length(data: Any) -> int | None:
    if data is None:
        return None
    if isinstance(data, Mapping):
        data = next(iter(data.values()))
    elif isinstance(data, tuple | list):
        data = data[0]
    return len(data)


class SampleDataset(Dataset):
    """A batch of inputs and targets (tensors, tuples or dicts of them) read one sample at a
    time; PyTorch's default collate puts batches back into the same structure."""

    def __init__(self, inputs: Any, targets: Any) -> None:
        self.inputs, self.targets = inputs, targets
        self.n = _length(inputs)
        if self.n is None or _length(targets) not in (None, self.n):
            raise ValueError("a workload's batch must hold inputs and targets of one length")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        # None is no sample for a DataLoader: a missing target becomes an empty tensor
        target = _index(self.targets, i)
        return _index(self.inputs, i), torch.empty(0) if target is None else target


def tensor_bytes(data: Any, device: torch.device | None = None) -> int:
    """Bytes of the tensors in ``data`` (tensors, or tuples, lists and dicts of them), each
    storage once; ``device``: only those on its kind (cpu, cuda)."""
    sizes: dict[int, int] = {}  # storage -> its bytes, each storage once

    def walk(x: Any) -> None:
        if isinstance(x, Mapping):
            for v in x.values():
                walk(v)
        elif isinstance(x, tuple | list):
            for v in x:
                walk(v)
        elif torch.is_tensor(x) and (device is None or x.device.type == device.type):
            storage = x.untyped_storage()
            sizes[storage.data_ptr() or id(storage)] = storage.nbytes()

    walk(data)
    return sum(sizes.values())


def to_device(data: Any, device: torch.device) -> Any:
    """Tensors, or tuples and dicts of them, moved to ``device`` (a pinned batch without
    waiting)."""
    if isinstance(data, Mapping):
        return {k: to_device(v, device) for k, v in data.items()}
    if isinstance(data, tuple | list):
        return type(data)(to_device(v, device) for v in data)
    return data.to(device, non_blocking=True) if torch.is_tensor(data) else data


def expand_plan(model: nn.Module, plan: Mapping[str, Any]) -> dict[str, Any]:
    """A plan's patterns matched against the model's module names, in module order; a pattern
    that matches no module is refused by name (a typo would otherwise train unsharded)."""
    names = [n for n, _ in model.named_modules() if n]
    out: dict[str, Any] = {}
    for pattern, placement in plan.items():
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise ValueError(
                f"the tensor-parallel plan names {pattern!r}, a module the model does not have"
            )
        for n in hits:
            out[n] = placement
    return {n: out[n] for n in names if n in out}
