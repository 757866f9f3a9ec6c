"""What one traced op costs on a roofline: its FLOPs and the bytes it moves, from the shapes,
types and concrete values ``record_shapes`` recorded (the reader's ``shapes`` column).

FLOPs are torch's own: the formulas of ``torch.utils.flop_counter`` (its ``flop_registry``,
the convention FlopCounterMode counts by), applied to the op's recorded shapes. The trace names
an op by its schema name (``aten::addmm``), which is looked up as an ``aten`` overload packet;
CPU kernels registered under names of their own that compute what a registered op computes
(``_scaled_dot_product_flash_attention_for_cpu``) take that op's formula (``ALIASES``).
Bytes are the sizes of the op's input tensors and of its outputs; the outputs are not in the
trace, so the op is run once per distinct signature on meta tensors (no data, no compute) to
learn them. An output that aliases an input (a view, ``aten::t``) moves nothing, unless the op
writes its input in place (``aten::add_``: read twice, written once).

An attention kernel (``ATTENTION``) also gives the FLOPs of one head's matmul, the size a
matmul curve is read at for it (its FLOPs are many head-sized matmuls, not one of their total),
and the scores its softmax exponentiates; an op that writes an input in place says so
(``in_place``: it allocates no output).

Bad or unknown signatures price as unknown (NaN), never as zero: the waterfall says what it
could not price.
"""

from __future__ import annotations

import ast
import functools
import json
import math
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from bench.roofline.op_count import OP_NAME
from parallel_kernels.facts import TORCH_DTYPE

aten = torch.ops.aten

# Kernels a device registers under a name of its own for what a registered op computes.
ALIASES = {
    "_scaled_dot_product_flash_attention_for_cpu": aten._scaled_dot_product_flash_attention,
    "_scaled_dot_product_flash_attention_for_cpu_backward": (
        aten._scaled_dot_product_flash_attention_backward
    ),
    "mkldnn_convolution": aten.convolution,
}
# Attention kernels: per head, a (q x d) @ (d x kv) and a (q x kv) @ (kv x d) matmul around a
# softmax over the q x kv scores; the index of their query among the inputs.
ATTENTION = {
    "_scaled_dot_product_flash_attention_for_cpu": 0,
    "_scaled_dot_product_flash_attention_for_cpu_backward": 1,
    "_scaled_dot_product_flash_attention": 0,
    "_scaled_dot_product_flash_attention_backward": 1,
    "_scaled_dot_product_efficient_attention": 0,
    "_scaled_dot_product_efficient_attention_backward": 1,
}
# The precision each floating dtype computes in (bench.runfolder.peaks.PRECISIONS' names).
PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# What an op, or a formula, raises for arguments that are not its own.
CALL_ERRORS = (RuntimeError, TypeError, ValueError, IndexError, AssertionError, NotImplementedError)


@dataclass(frozen=True)
class OpCost:
    """An op's price inputs: ``flops`` (0 for an op without a formula; NaN where it has one but
    its shapes could not be read), ``nbytes`` moved (NaN where unknown), the ``precision`` its
    FLOPs run at (None without FLOPs) and whether it is a FLOP op at all (``matmul``: a
    matmul, attention or convolution, known from its name alone, shapes or not); ``elements``
    of its first output (NaN where unknown), what an elementwise function computes per
    element (``Roofline.math_us``)."""

    flops: float
    nbytes: float
    precision: str | None
    matmul: bool
    elements: float = math.nan
    matmul_size: float = math.nan  # FLOPs of one matmul it runs as (NaN: ``flops``, one)
    softmax: float = 0.0  # elements an attention's softmax exponentiates
    in_place: bool = False  # writes an input (``Tensor(a!)``): allocates no output


UNKNOWN = OpCost(math.nan, math.nan, None, False)


def is_op(name: str) -> bool:
    """Whether a trace event's name is an operator's (``aten::mm``, ``c10d::allreduce_``)."""
    return OP_NAME.match(name) is not None


@functools.cache
def formula(name: str):
    """The flop_registry formula of a trace's op name, or None."""
    m = OP_NAME.match(name)
    if m is None or m.group(1) != "aten":
        return None
    packet = ALIASES.get(m.group(2)) or getattr(aten, m.group(2), None)
    return flop_registry.get(packet) if packet is not None else None


@functools.cache
def _packet(name: str):
    m = OP_NAME.match(name)
    if m is None:
        return None
    try:
        return getattr(getattr(torch.ops, m.group(1)), m.group(2))
    except (AttributeError, RuntimeError):
        return None


def _value(text: str):
    if text == "":
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _argument(dims, type_: str, concrete: str):
    """One recorded argument as a value to call the op with: a meta tensor for a tensor (or a
    list of them), the concrete value for a scalar or list, None for what was not recorded."""
    dtype = TORCH_DTYPE.get(type_)
    if dtype is not None and isinstance(dims, list) and all(isinstance(d, int) for d in dims):
        return torch.empty(dims, dtype=getattr(torch, dtype), device="meta")
    if type_ == "TensorList" and isinstance(dims, list):
        return [torch.empty(d, device="meta") for d in dims if isinstance(d, list)]
    return _value(concrete) if isinstance(concrete, str) else None


def _tensors(value) -> list:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _call(overload, values: list):
    """(args, kwargs, outputs, schema) of ``overload`` called with the recorded ``values`` bound by
    its schema: keyword-only arguments by name, and a value the trace could not spell (None
    for gelu's string ``approximate``) left to the argument's default. None where the values
    do not fit."""
    schema = overload._schema
    if len(schema.arguments) != len(values):
        return None
    args, kwargs = [], {}
    for a, v in zip(schema.arguments, values, strict=True):
        if v is None and a.has_default_value():
            v = a.default_value
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    try:
        return args, kwargs, overload(*args, **kwargs), schema
    except CALL_ERRORS:  # the op's own argument checks: these values are not this overload's
        return None


def _run(packet, values: list):
    """The op called on meta tensors, with the first overload the recorded values fit."""
    for name in packet.overloads():
        if "out" in name.split("_"):  # writes into a given tensor: not what the trace ran
            continue
        called = _call(getattr(packet, name), values)
        if called is not None:
            return called
    return None


def _moved(schema, inputs: list, out) -> float:
    """Bytes read and written: the inputs, and the outputs, but for an output its schema
    marks as an alias of an input that the op does not write (``Tensor(a)``: a view, or
    ``detach``). An op whose every output is such an alias moves nothing; an in-place op's
    output (``Tensor(a!)``) is its input written, and counts."""
    outputs = out if isinstance(out, tuple | list) else (out,)
    moved, aliases = 0, 0
    for r, o in zip(schema.returns, outputs, strict=False):
        alias = r.alias_info is not None and not r.alias_info.is_write
        aliases += alias
        moved += 0 if alias else sum(_nbytes(t) for t in _tensors(o))
    if aliases == len(schema.returns):
        return 0.0
    return float(sum(_nbytes(t) for t in inputs) + moved)


@functools.cache
def cost(name: str, signature: str | None) -> OpCost:
    """The FLOPs and bytes of op ``name`` with the recorded ``signature`` (the reader's
    ``shapes``: ``[dims, types, concrete]``); without a signature, only whether it is a FLOP
    op."""
    f = formula(name)
    packet = _packet(name)
    if signature is None or packet is None:
        return OpCost(math.nan if f else 0.0, math.nan, None, f is not None)
    dims, types, concrete = json.loads(signature)
    concrete = concrete if isinstance(concrete, list) else [""] * len(dims)
    types = types if isinstance(types, list) else [""] * len(dims)
    values = [_argument(d, t, c) for d, t, c in zip(dims, types, concrete, strict=False)]
    with torch.device("meta"):
        called = _run(packet, values)
    inputs = _tensors(values)
    if called is None:
        return OpCost(math.nan if f else 0.0, math.nan, None, f is not None)
    args, kwargs, out, schema = called
    nbytes = _moved(schema, inputs, out)
    outputs = _tensors(out)
    elements = float(outputs[0].numel()) if outputs else math.nan
    in_place = any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)
    if f is None:
        return OpCost(0.0, nbytes, None, False, elements, in_place=in_place)
    try:
        flops = float(f(*args, **kwargs, out_val=out))
    except CALL_ERRORS:  # a formula's assumptions about its arguments did not hold
        flops = math.nan
    dtype = str(inputs[0].dtype).removeprefix("torch.") if inputs else None
    size, softmax = _attention(name, inputs)
    return OpCost(flops, nbytes, PRECISION.get(dtype), True, elements, size, softmax, in_place)


def _attention(name: str, inputs: list) -> tuple[float, float]:
    """(FLOPs of one head's score matmul, elements of all heads' scores) of an attention op
    (``ATTENTION``) on query (batch, heads, q, d) and key (..., kv, d); (NaN, 0) for any
    other op."""
    at = ATTENTION.get(name.partition("::")[2])
    if at is None or len(inputs) < at + 2 or inputs[at].dim() != 4:
        return math.nan, 0.0
    b, h, q, d = inputs[at].shape
    kv = inputs[at + 1].shape[-2]
    return 2.0 * q * kv * d, float(b * h * q * kv)
