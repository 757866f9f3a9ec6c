"""A Kineto event as the analysis decodes it (only the fields it reads), and the facts of a
collective call taken from its arguments: the bytes it moves and what the call was."""

from __future__ import annotations

import json

import msgspec
import numpy as np

from parallel_kernels.facts import DTYPE_BYTES


# gc=False: decoded JSON holds no cycles (msgspec docs: Structs, Disabling Garbage Collection)
class Args(msgspec.Struct, gc=False):
    """The event arguments the analysis reads; every other key is skipped while decoding."""

    correlation: int | str | None = -1
    stream: int | str | None = -1
    in_nelems: int | float | None = msgspec.field(default=None, name="In msg nelems")
    dtype: str | None = None
    # record_shapes' arguments, kept as their JSON text: most events only need them as the
    # key of their signature (``shape_key``); the few that need the values decode them
    input_dims: msgspec.Raw = msgspec.field(default=None, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=None, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=None, name="Concrete Inputs")
    seq: int | None = msgspec.field(default=None, name="Sequence number")
    total_allocated: float | None = msgspec.field(default=None, name="Total Allocated")
    nbytes: float | None = msgspec.field(default=None, name="Bytes")
    # record_param_comms' metadata (torch/csrc/profiler/util.cpp, saveNcclMeta)
    out_nelems: int | float | None = msgspec.field(default=None, name="Out msg nelems")
    coll_name: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: str | list | None = msgspec.field(default=None, name="Process Group Ranks")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    rank_start: int | None = msgspec.field(default=None, name="Global rank start")
    rank_stride: int | None = msgspec.field(default=None, name="Global rank stride")


class Event(msgspec.Struct, gc=False):
    ph: str | None = None
    name: str | int | None = ""
    cat: str | None = ""
    ts: float | None = 0.0
    dur: float | None = 0.0
    pid: int | str | None = ""
    tid: int | str | None = ""
    args: Args | None = None


def _decoded(raw: msgspec.Raw | None) -> list | None:
    if raw is None:
        return None
    value = msgspec.json.decode(raw)
    return value if isinstance(value, list) else None


def shape_key(a: Args) -> bytes | None:
    """An op's recorded signature as one key: its input shapes, types and concrete values as
    JSON text (``[dims, types, concrete]``); None where the trace recorded no shapes."""
    if a.input_dims is None:
        return None
    concrete = bytes(a.concrete) if a.concrete is not None else b"null"
    types = bytes(a.input_type) if a.input_type is not None else b"null"
    return b"[" + bytes(a.input_dims) + b"," + types + b"," + concrete + b"]"


def num(v) -> float:
    return float(v) if isinstance(v, int | float) else np.nan


def payload_bytes(a: Args) -> float:
    """Bytes a collective moves: NCCL metadata (``In msg nelems`` x dtype), else the product of
    the input shapes x dtype (gloo spans, ``c10d::`` ops with ``record_shapes``)."""
    if a.in_nelems is not None:
        return float(a.in_nelems) * DTYPE_BYTES.get(str(a.dtype), np.nan)
    dims, types = _decoded(a.input_dims), _decoded(a.input_type)
    if not dims or not types:
        return np.nan
    total = 0.0
    for d, t in zip(dims, types, strict=False):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            total += float(np.prod(d)) * DTYPE_BYTES.get(t, np.nan)
    return total


def _elements(dims) -> float:
    """Elements of one argument's shape: a tensor's (a list of ints), or a list of tensors' (or
    of lists of them) summed; NaN where it holds no tensor."""
    if not isinstance(dims, list) or not dims:
        return np.nan
    if all(isinstance(x, int) for x in dims):
        return float(np.prod(dims))
    parts = [_elements(d) for d in dims]
    known = [p for p in parts if p == p]
    return float(sum(known)) if known else np.nan


def argument_elements(a: Args) -> tuple:
    """call_facts' tuple for an op that issues a collective (``c10d::_allgather_base_``): its
    first two arguments' elements, which of them the backend's own span lists depends on the
    op (an all-gather's input is the second), and nothing else."""
    dims = [*(_decoded(a.input_dims) or ()), None, None]
    return (_elements(dims[0]), _elements(dims[1]), None, None, None)


def call_facts(a: Args) -> tuple:
    """(input elements, output elements, collective name, dtype as spelled, process group as
    JSON) of a call: record_param_comms' metadata, else its input shapes summed as
    ``payload_bytes`` sums them, the first one's type the dtype."""
    dims_types = zip(_decoded(a.input_dims) or (), _decoded(a.input_type) or (), strict=False)
    shaped = [
        (float(np.prod(d)), t)
        for d, t in dims_types
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d)
    ]
    count = sum(n for n, _ in shaped) if shaped else np.nan
    dtype = shaped[0][1] if shaped and a.dtype is None else a.dtype
    group = {
        "name": a.pg_name,
        "ranks": a.pg_ranks,
        "size": a.group_size,
        "start": a.rank_start,
        "stride": a.rank_stride,
    }
    label = json.dumps({k: v for k, v in group.items() if v is not None})
    return (
        float(a.in_nelems) if a.in_nelems is not None else count,
        num(a.out_nelems),
        a.coll_name,
        dtype,
        None if label == "{}" else label,
    )
