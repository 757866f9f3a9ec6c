"""A step's ops priced on a device's roofline (``bench.roofline.profile``): each op at
``Roofline.op_us`` (the longer of its FLOPs at the matmul efficiency its size reaches and its
bytes at the bandwidth its size reaches), as an op inside a training step costs
(``Roofline.in_step``: a factor on those efficiencies, a fixed cost per op), summed by what
bounds it: compute (the matmuls, convolutions and attention), memory (elementwise ops,
normalisation, copies), and the ops' fixed costs. That split is the plan's predicted
waterfall: why a configuration is slow before it runs.

A measured computation of the model calibrates the profile rather than replacing it: one
factor on its efficiencies (``Pricing.scale``, ``fit_scale``), fitted so that the priced
step is the measured one; the fixed costs stay as the profile states them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench.plan.op_mix import OpMix
from bench.roofline.profile import Roofline


@dataclass(frozen=True)
class Pricing:
    """The roofline a plan prices its ops on, its efficiencies times ``scale``."""

    roofline: Roofline
    scale: float = 1.0  # 1: as the profile states; else fitted to a measured computation
    source: str = ""

    def about(self) -> dict:
        """plan.json's account of it."""
        return {"scale": self.scale, "source": self.source, "profile": self.roofline.as_json()}


@dataclass(frozen=True)
class Priced:
    """Milliseconds of a mix of ops by what bounds them."""

    matmul_ms: float = 0.0  # compute-bound ops, beyond their launch
    memory_ms: float = 0.0  # memory-bound ops, beyond their launch
    fixed_ms: float = 0.0  # every op's fixed cost (its launch; on a CPU, its cost in a step)

    @property
    def total_ms(self) -> float:
        return self.matmul_ms + self.memory_ms + self.fixed_ms

    def plus(self, other: Priced, times: float = 1.0) -> Priced:
        return Priced(
            self.matmul_ms + times * other.matmul_ms,
            self.memory_ms + times * other.memory_ms,
            self.fixed_ms + times * other.fixed_ms,
        )


def priced(mix: OpMix, pricing: Pricing) -> Priced:
    """``mix`` on ``pricing``'s roofline, its ops inside a step: each op class's time, times
    its count, by bound."""
    roof = pricing.roofline
    step = roof.in_step()
    matmul = memory = launches = 0.0
    for k, n in mix.counts.items():
        us, bound = roof.body_us(k.flops, k.nbytes, k.precision)
        body = n * us / (pricing.scale * step.efficiency)
        if bound == "compute":
            matmul += body
        else:
            memory += body
        launches += n * step.op_us
    return Priced(matmul / 1e3, memory / 1e3, launches / 1e3)


def fit_scale(mix: OpMix, measured_ms: float, roofline: Roofline) -> float:
    """The factor on ``roofline``'s efficiencies that prices ``mix`` at ``measured_ms``, its
    launches at their stated cost. Where those launches alone leave the ops less than a tenth
    of the measured time, the ops are given that tenth: a profile whose launches read longer
    than the step is wrong for this machine, and the factor then says so by its size."""
    at_profile = priced(mix, Pricing(roofline))
    body = at_profile.matmul_ms + at_profile.memory_ms
    left = max(measured_ms - at_profile.fixed_ms, 0.1 * measured_ms)
    if not (body > 0 and left > 0 and math.isfinite(left)):
        raise ValueError(f"no ops to fit the roofline to {measured_ms:.3g} ms of computation")
    return body / left


def fit_with_micro(
    one: OpMix, many: OpMix, accum: int, measured_ms: float, delta_ms: float, roofline: Roofline
) -> tuple[float, float]:
    """(the factor on ``roofline``'s efficiencies, a cost per micro-batch in ms) that price
    ``one`` (a step of one micro-batch) at ``measured_ms`` and ``many`` (the same samples in
    ``accum`` micro-batches) at ``delta_ms`` more: what a micro-batch costs beyond its ops
    (the modules' Python, autograd's engine, a wrapper's hooks), which a profile's launch of a
    bare op does not hold. Where the two leave no positive pair, the factor alone
    (``fit_scale``) and no such cost."""
    p1, pa = (priced(mix, Pricing(roofline)) for mix in (one, many))
    e1, ea = p1.matmul_ms + p1.memory_ms, pa.matmul_ms + pa.memory_ms
    # e1 x + c = t1 - launches of one; (ea - e1) x + (accum - 1) c = delta - launches' difference
    r1 = measured_ms - p1.fixed_ms
    r2 = delta_ms - (pa.fixed_ms - p1.fixed_ms)
    det = e1 * (accum - 1) - (ea - e1)
    if accum > 1 and det > 0:
        x = (r1 * (accum - 1) - r2) / det
        c = r1 - e1 * x
        if x > 0 and c >= 0:
            return 1 / x, c
    return fit_scale(one, measured_ms, roofline), 0.0
