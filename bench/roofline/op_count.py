"""Each op a step runs, as the roofline sees it: its aten op, phase, precision (its dtype),
FLOPs (torch's formulas, ``torch.utils.flop_counter``'s registry, the counter's convention) and
the bytes it moves (its tensor inputs' and outputs' sizes). The planner counts a model's step
so under fake tensors (``bench.plan.op_mix``), and the host's profile a measured step so
(``step_cost.py``): one convention, so that what a profile fits prices what a plan counts.

Views (``t``, ``view``, ``expand``, ...) launch no kernel and move no byte: they are left out.
A matmul of float8 operands (torchao's ``Float8TrainingTensor``, which holds its float8 data as
``_data`` under a high-precision dtype) is an ``fp8`` op moving a byte an element of them.

With ``flow``, the counter also keeps where each op's tensors come from (``Flow``: the values it
reads and writes, a value being what an op last wrote into a storage), and the compiled region
it ran in (``region``, set from outside): what ``bench.plan.fusion`` fuses chains of.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

# A trace's op names: a namespace, two colons, the op (aten::mm, c10d::allreduce_), not
# autograd's nodes or the annotations around them.
OP_NAME = re.compile(r"^(\w+)::(\w+)$")

Record = tuple[str, str, str, float, float]  # an op as run: phase, op, precision, FLOPs, bytes
# the precision a dtype is priced at (float32 is fp32: TF32 is a matmul's mode, not a dtype)
PRECISION_OF = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


@dataclass(frozen=True)
class Flow:
    """Where a record's tensors come from: the region it ran in (None: not compiled), the values
    it reads and writes as (value id, bytes); a value id is an int, the same for every read of
    what one op wrote into a storage (or of a storage no counted op wrote: a parameter, an
    input)."""

    region: object
    reads: tuple[tuple[int, float], ...]
    writes: tuple[tuple[int, float], ...]


def _float8(t: torch.Tensor) -> torch.Tensor | None:
    """The float8 data a tensor holds (itself, or torchao's wrapper's ``_data``), or None."""
    data = getattr(t, "_data", t)
    return data if isinstance(data, torch.Tensor) and data.dtype in FLOAT8 else None


def _nbytes(tensors: list[torch.Tensor]) -> float:
    total = 0
    for t in tensors:
        data = _float8(t)
        total += t.numel() * (t.element_size() if data is None else data.element_size())
    return float(total)


def _precision(tensors: list[torch.Tensor]) -> str:
    if any(_float8(t) is not None for t in tensors):
        return "fp8"
    for t in tensors:
        if t.is_floating_point():
            return PRECISION_OF.get(t.dtype, "fp32")
    return "fp32"  # integer and boolean ops have no FLOPs: their precision prices nothing


def _views(outs: list[torch.Tensor], ins: list[torch.Tensor]) -> bool:
    """Whether every output is another tensor on an input's storage: a view (an in-place op
    returns its input itself, and moves bytes)."""
    storages = {t.untyped_storage()._cdata for t in ins}
    same = {id(t) for t in ins}
    return all(id(t) not in same and t.untyped_storage()._cdata in storages for t in outs)


class OpCounter(FlopCounterMode):
    """torch's ``FlopCounterMode`` (its total the step's FLOPs, as counted before), which also
    keeps each op it runs as a ``Record`` of the phase set in ``phase`` (None: not kept)."""

    def __init__(self, flow: bool = False) -> None:
        super().__init__(display=False)
        self.phase: str | None = "forward"
        self.records: list[Record] = []
        self.flow = flow
        self.region: object = None  # the compiled region ops run in now (``bench.plan.fusion``)
        self.flows: list[Flow] = []  # with ``flow``: each record's
        self._values: dict[int, int] = {}  # storage -> the value id last written into it
        self._kept: list = []  # the storages seen, kept so that no other takes their address
        self._ids = itertools.count()

    def _count_flops(self, func_packet, out, args, kwargs):
        before = self.get_total_flops()
        out = super()._count_flops(func_packet, out, args, kwargs)
        if self.phase is None:
            return out
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not outs or _views(outs, ins):
            return out  # metadata (a device, a scalar) or a view: no kernel, no bytes
        flops = float(self.get_total_flops() - before)
        nbytes = _nbytes(ins) + _nbytes(outs)
        if math.isfinite(nbytes):
            self.records.append(
                (self.phase, str(func_packet), _precision(outs + ins), flops, nbytes)
            )
            if self.flow:
                reads = tuple((self._value(t), _nbytes([t])) for t in ins)
                writes = tuple((self._value(t, written=True), _nbytes([t])) for t in outs)
                self.flows.append(Flow(self.region, reads, writes))
        return out

    def _value(self, t: torch.Tensor, written: bool = False) -> int:
        """The value id of what ``t``'s storage holds; ``written``: a new one, this op's."""
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self._values:
            self._kept.append(storage)
        if written or key not in self._values:
            self._values[key] = next(self._ids)
        return self._values[key]
