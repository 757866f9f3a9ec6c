"""A tracking's figures and their arithmetic: a step's peak per rank with its breakdown and
its stages, how trackings combine into an extrapolation, and whether a peak moved between two
of them (``memory.py`` makes them, ``trackings.py`` combines them)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.plan.op_mix import OpMix


@dataclass(frozen=True)
class Tracked:
    """One step of a configuration as tracked: the allocator's peak with its breakdown (no
    allowance) and the FLOPs one rank computes; NaN and ``error`` where tracking failed.
    ``stages``: the peak and breakdown of each stage of the step apart (its forward and
    backward, its optimiser step), the step's being the highest. Extrapolated, each stage is
    moved on its own and the step's peak is the highest of them again: the peaks of a
    stage grow alike with blocks, ranks and micro-batches, but not the two stages alike (the
    stage that peaks can change with depth: docs/benchmarks.md, "Planned memory")."""

    peak_mib: float
    parts_mib: dict[str, float]
    flops: float
    error: str = ""
    how: str = ""  # how the figures were made (tracked in full, or extrapolated from what)
    stages: tuple[tuple[float, dict[str, float]], ...] = ()
    # one micro-batch's ops and the optimiser's step (``op_mix.py``), combined as ``flops``
    ops: OpMix | None = None
    # a pipeline row's stages, what its time is simulated from (``pipeline_memory.PipelineCosts``);
    # None for the others, and through the arithmetic below
    pipeline: object | None = None
    # what activation checkpointing recomputes of ``flops`` (0 with it off), combined as they are
    recompute_flops: float = 0.0

    def plus(self, other: Tracked, times: float) -> Tracked:
        """``self + times * other``, part by part and stage by stage (an extrapolation's
        arithmetic)."""

        def add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
            return {k: v + times * b.get(k, 0.0) for k, v in a.items()}

        error = self.error or other.error
        flops = self.flops + times * other.flops
        again = self.recompute_flops + times * other.recompute_flops
        ops = None if self.ops is None or other.ops is None else self.ops.plus(other.ops, times)
        if self.stages and len(self.stages) == len(other.stages):
            stages = tuple(
                (p + times * q, add(a, b))
                for (p, a), (q, b) in zip(self.stages, other.stages, strict=True)
            )
            peak, parts = max(stages, key=lambda stage: stage[0])
            return Tracked(peak, parts, flops, error, self.how, stages, ops, recompute_flops=again)
        peak = self.peak_mib + times * other.peak_mib
        parts = add(self.parts_mib, other.parts_mib)
        return Tracked(peak, parts, flops, error, self.how, ops=ops, recompute_flops=again)

    def minus(self, other: Tracked) -> Tracked:
        return self.plus(other, -1.0)


def failed(error: str) -> Tracked:
    return Tracked(math.nan, {}, math.nan, error, recompute_flops=math.nan)


def shifted(fewer: Tracked, more: Tracked) -> bool:
    """Whether a stage's peak lies elsewhere in the step with one block more: a part of it
    falls, or, in forward and backward, its temporaries (one op's transient, which a block
    more leaves as it was) change; the optimiser's step holds temporaries that grow with the
    state where it runs foreach (a GPU's). A block adds to every part of a peak that stays
    where it was. With one block, FSDP's FULL_SHARD has no next unit to gather ahead in
    backward: FSDP2's temporaries show it, but FSDP1 holds that unit as parameters, which a
    test cannot take for a move (SHARD_GRAD_OP's parameters grow by a whole block). So a model
    of few blocks is tracked in full, and FSDP1 from two blocks (``memory.track_phases``). A
    peak that leaves one stage for the other is no move: each stage is extrapolated apart
    (docs/benchmarks.md, "Planned memory")."""
    if fewer.error or more.error:
        return False
    slack = 1e-3 * fewer.peak_mib

    def moved(a: dict[str, float], b: dict[str, float], transient: bool) -> bool:
        grew = b.get("temporaries", 0.0) - a.get("temporaries", 0.0)
        fell = any(b.get(k, 0.0) < v - slack for k, v in a.items())
        return fell or (transient and abs(grew) > slack)

    pairs = zip(*_stages(fewer, more), strict=True)
    return any(moved(a, b, transient=i == 0) for i, ((_, a), (_, b)) in enumerate(pairs))


def collinear(a: Tracked, b: Tracked, c: Tracked) -> bool:
    """Whether three trackings of one step with a block more each lie on one line: every part of
    every stage (and each stage's peak) grows by the same from ``b`` to ``c`` as from ``a`` to
    ``b``, and none falls. A peak ``shifted`` calls moved may still grow alike with every
    block (temporaries holding one block's reduced gradients more with every block, which the
    test of two trackings takes for a moving transient: docs/benchmarks.md, "Planned memory").
    Asked only of a peak still moving at ``memory.STEPS`` blocks, which
    would otherwise be tracked in full: three on one line there read that tracking exactly (a
    transient that grows over the first blocks and then stays has stayed by then)."""
    if a.error or b.error or c.error:
        return False
    slack = 1e-3 * a.peak_mib
    for (p, x), (q, y), (r, z) in zip(*_stages(a, b, c), strict=True):
        if abs((r - q) - (q - p)) > slack:
            return False
        for k, v in y.items():
            grew = z.get(k, 0.0) - v
            if grew < -slack or abs(grew - (v - x.get(k, 0.0))) > slack:
                return False
    return True


def _stages(*tracked: Tracked) -> list[tuple]:
    """The trackings' stages, to compare stage by stage; each as one stage (its peak and
    breakdown) where any has none or they have not as many (made-up trackings)."""
    if all(t.stages for t in tracked) and len({len(t.stages) for t in tracked}) == 1:
        return [t.stages for t in tracked]
    return [((t.peak_mib, t.parts_mib),) for t in tracked]
