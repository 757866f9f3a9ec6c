"""Each op a step runs, as the roofline sees it: its aten op, phase, precision (its dtype),
FLOPs (torch's formulas, ``torch.utils.flop_counter``'s registry, the counter's convention) and
the bytes it moves (its tensor inputs' and outputs' sizes). The planner counts a model's step
so under fake tensors (``bench.plan.op_mix``), and the host's profile a measured step so
(``step_cost.py``): one convention, so that what a profile fits prices what a plan counts.

Views (``t``, ``view``, ``expand``, ...) launch no kernel and move no byte: they are left out.
"""

from __future__ import annotations

import math

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

Record = tuple[str, str, str, float, float]  # an op as run: phase, op, precision, FLOPs, bytes
# the precision a dtype is priced at (float32 is fp32: TF32 is a matmul's mode, not a dtype)
PRECISION_OF = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def _nbytes(tensors: list[torch.Tensor]) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


def _precision(tensors: list[torch.Tensor]) -> str:
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

    def __init__(self) -> None:
        super().__init__(display=False)
        self.phase: str | None = "forward"
        self.records: list[Record] = []

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
        return out
