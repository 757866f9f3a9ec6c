"""A step's ops as the planner counts them under fake tensors (``bench.roofline.op_count``:
each op's phase, aten op, precision, FLOPs and bytes; views left out).

The time stage prices them on the target's roofline (``op_prices.py``). What it needs of an op
is those three figures, so a step is kept as a compact mix: how many ops of each class
(phase, op, precision, FLOPs, bytes), whatever their order. Mixes add and scale (``plus``)
as the memory stage's extrapolations do its figures (blocks, worlds, micro-batches): an
extrapolated mix prices as the same combination of its parts' prices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bench.roofline.op_count import Record

PHASES = ("forward", "backward", "optimiser")
COMPUTE = ("forward", "backward")  # a micro-batch's phases; the optimiser's is once a step


@dataclass(frozen=True)
class OpClass:
    """Ops alike for the roofline: one phase, one aten op, one precision, one size."""

    phase: str
    op: str
    precision: str
    flops: float
    nbytes: float


@dataclass(frozen=True)
class OpMix:
    """How many ops of each class a step (or a micro-batch) runs; counts may be fractional or
    negative inside an extrapolation's arithmetic."""

    counts: Mapping[OpClass, float] = field(default_factory=dict)

    def plus(self, other: OpMix, times: float) -> OpMix:
        """``self + times * other``, class by class."""
        out = dict(self.counts)
        for k, n in other.counts.items():
            out[k] = out.get(k, 0.0) + times * n
        return OpMix({k: n for k, n in out.items() if n != 0.0})

    def of(self, phases: Iterable[str]) -> OpMix:
        keep = set(phases)
        return OpMix({k: n for k, n in self.counts.items() if k.phase in keep})

    def shared(self, share: float, phases: Iterable[str]) -> OpMix:
        """Each op of ``phases`` at ``share`` of its FLOPs and bytes, the rest as they are: a
        rank's share of ops it splits with others (a TP rank's, a sharded optimiser's)."""
        keep = set(phases)
        out: dict[OpClass, float] = {}
        for k, n in self.counts.items():
            if k.phase in keep:
                k = OpClass(k.phase, k.op, k.precision, k.flops * share, k.nbytes * share)
            out[k] = out.get(k, 0.0) + n
        return OpMix(out)

    def flops(self) -> float:
        return sum(k.flops * n for k, n in self.counts.items())

    def ops(self) -> float:
        return sum(self.counts.values())


def mix_of(records: Iterable[Record]) -> OpMix:
    counts: dict[OpClass, float] = {}
    for r in records:
        k = OpClass(*r)
        counts[k] = counts.get(k, 0.0) + 1.0
    return OpMix(counts)


def along_batch(lo: tuple[Record, ...], hi: tuple[Record, ...], steps: float) -> OpMix | None:
    """The mix ``steps`` times as far from ``lo`` as ``hi`` is (the ops run at one micro-batch
    and at one sample more), op by op: an op's FLOPs and bytes are affine in the batch
    (weights fixed, activations in proportion). None where the two runs did not run the same
    ops in the same order (a reshape that copies at two samples and not at one)."""
    if len(lo) != len(hi) or any(a[:3] != b[:3] for a, b in zip(lo, hi, strict=True)):
        return None
    return mix_of(
        (*a[:3], a[3] + steps * (b[3] - a[3]), a[4] + steps * (b[4] - a[4]))
        for a, b in zip(lo, hi, strict=True)
    )
