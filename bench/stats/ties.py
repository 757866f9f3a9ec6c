"""Which candidates are tied with the best, and what the others cost over it.

The best is the candidate with the lowest estimate. Every other one is compared with it by the
interval of its ratio to the best; the k - 1 comparisons share one 95 % confidence through
Bonferroni's correction (each interval at 1 - 0.05 / (k - 1)), which is conservative against
the selection of the best from the data (Hsu, Multiple Comparisons, 1996, ch. 4: comparisons
with the best). A candidate whose interval reaches 1 is tied with the best: the data cannot
separate them, and saying so is the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.stats.estimates import Estimate, Ratio, ratio
from bench.stats.intervals import CONFIDENCE


@dataclass(frozen=True)
class Verdict:
    best: str
    tied: list[str]  # the best and every candidate not separable from it
    ratios: dict[str, Ratio]  # candidate -> its ratio to the best (the best: absent)
    confidence: float  # each interval's, after the correction


def adjusted(confidence: float, comparisons: int) -> float:
    """Bonferroni: the confidence of each of ``comparisons`` intervals for a joint one."""
    return 1 - (1 - confidence) / max(1, comparisons)


def versus_best(candidates: dict[str, Estimate], confidence: float = CONFIDENCE) -> Verdict:
    """The best of ``candidates`` (name -> estimate), the names tied with it, each ratio."""
    if not candidates:
        raise ValueError("no candidates to compare")
    best = min(candidates, key=lambda k: candidates[k].log)
    each = adjusted(confidence, len(candidates) - 1)
    ratios = {k: ratio(e, candidates[best], each) for k, e in candidates.items() if k != best}
    tied = [best] + [k for k, r in ratios.items() if not r.separable]
    return Verdict(best=best, tied=tied, ratios=ratios, confidence=each)
