"""Comparisons with the best from interleaved cycles, and when they are decided.

Candidates timed in cycles (one step of each per cycle, in a fresh random order: ``bench/runner/
train/cycles.py``) are compared pair by pair: a candidate's per-cycle ratio to the best's
step of the same cycle, whose centre (Hodges-Lehmann's) and distribution-free interval (the
signed-rank test's) ``estimates.paired_cycles_ratio`` gives. Drift and a neighbour's load
fall on both steps of a cycle alike and cancel in the ratio (the randomised multiple
interleaved trials of Abedi and Brecht, ICPE 2017; "duet" benchmarking, Bulej et al., ICPE
2020). The best is the candidate with the lowest paired estimate; the k - 1 comparisons with it
share one confidence through Bonferroni's correction, as ``ties.versus_best`` does for rounds.

A comparison is decided when its interval excludes 1 (faster or slower, at the confidence) or
lies inside the tie band (equal to within ``band_pct``, a tie, whether or not it excludes 1):
a candidate whose comparison is decided leaves the cycles, and they stop when every comparison
is (``racing.py`` in the runner). Each comparison is stated at the confidence of the look it
was decided at.

Looking at the cycles as they come and stopping at the first interval that excludes 1 would
claim far more than 5 % of false differences (an A/A pair here was "separated" at 1.157
[1.002, 1.240] after 17 cycles). So the runner looks only at cycles 8, 16, 32, ... (group
sequential testing, Jennison and Turnbull, *Group Sequential Methods*, 2000), and the error
is spent by Bonferroni's union bound: the interim look j spends alpha / 2^(j+2) (1/4, 1/8,
... of it: never more than half in all), the last look, where the budget ends, the other
half. A verdict reached at an interim look is stated at that look's confidence; one at the
budget's end at 1 - alpha / 2 (97.5 % for 95 %): the price of being able to stop early.

Why the signed-rank interval and not the sign test's interval of the median ratio: on this
machine's recorded cycles (a ``make sweep``: 45 pairs of candidates per model) the log ratios
are near normal (kurtosis -0.3 to 0.6), where the sign test's intervals were 16-25 % wider
than Student's t, and Hodges-Lehmann's are within 5 % of t's while assuming only symmetry,
which the two exchangeable steps of a cycle give.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bench.stats.estimates import Ratio, paired_cycles_ratio
from bench.stats.intervals import CONFIDENCE
from bench.stats.signed_rank import hodges_lehmann
from bench.stats.ties import adjusted

# Two candidates whose ratio's interval lies within +-TIE_BAND_PCT % are called equal: a
# difference that small is not worth a decision (``--tie-band-pct``).
TIE_BAND_PCT = 3.0
DECIDED = "decided"  # results.csv's ``stop`` of cycles that ended at an interim look
FIRST_LOOK = 8  # the first interim look, in cycles; then each at twice the last


def interim_look(n: int) -> int | None:
    """Which interim look cycle ``n`` is (0 at FIRST_LOOK, 1 at twice it, ...), or None."""
    j, at = 0, FIRST_LOOK
    while at < n:
        j, at = j + 1, at * 2
    return j if at == n else None


def look_confidence(n: int, early: bool, confidence: float = CONFIDENCE) -> float:
    """The confidence of the verdicts at cycle ``n``: an interim look's (``early``: the cycles
    stopped there, decided) or the last look's, where the budget ended."""
    alpha = 1 - confidence
    j = interim_look(n) if early else None
    return 1 - (alpha / 2 ** (j + 2) if j is not None else alpha / 2)


def _best(ids: list[str], times: dict[str, np.ndarray]) -> str:
    """The candidate of ``ids`` (cycled alike) with the lowest paired estimate: each one's
    per-cycle log ratio to the one with the lowest median, its Hodges-Lehmann centre. Lowest
    medians and lowest paired ratios differ when a cycle's drift is large; the verdict is
    paired, so its best is too."""
    if not len(times[ids[0]]):
        return ids[0]
    anchor = min(ids, key=lambda k: float(np.median(times[k])))

    def centre(k: str) -> float:
        if k == anchor:
            return 0.0
        return hodges_lehmann(np.log(times[k]) - np.log(times[anchor]), CONFIDENCE)[0]

    return min(ids, key=centre)


@dataclass(frozen=True)
class PairedVerdict:
    best: str
    tied: list[str]  # the best and every candidate whose interval reaches 1 or lies in the band
    ratios: dict[str, Ratio]  # candidate -> its per-cycle ratio to the best (the best: absent)
    confidence: float  # each interval's after the correction (the lowest, where they differ)
    undecided: list[str]  # candidates whose interval neither excludes 1 nor lies in the band
    cycles: int  # the cycles the best was timed in (the longest any candidate cycled)


def in_band(r: Ratio, band_pct: float = TIE_BAND_PCT) -> bool:
    """Whether ``r``'s whole interval lies within +-``band_pct`` %: equal, to within a
    difference not worth a decision, even where the interval excludes 1 (an A/A pair here read
    1.014 [1.001, 1.026] over 600 cycles: a real difference between two builds of one
    configuration, 1.4 %, and a tie by the band's measure)."""
    if not (math.isfinite(r.low) and math.isfinite(r.high)):
        return False
    band = 1 + band_pct / 100
    return r.low >= 1 / band and r.high <= band


def decided(r: Ratio, band_pct: float = TIE_BAND_PCT) -> bool:
    """Whether ``r`` answers its question: its interval excludes 1, or lies in the tie band
    (an interval of NaN does neither: too few cycles for one)."""
    return r.separable or in_band(r, band_pct)


def versus_best_paired(
    cycles: dict[str, list[float] | np.ndarray],
    confidence: float | dict[str, float] = CONFIDENCE,
    band_pct: float = TIE_BAND_PCT,
    comparisons: int | None = None,
) -> PairedVerdict:
    """The best of ``cycles`` (candidate -> its step time in each cycle, cycle i of every
    candidate timed together), the candidates tied with it and each one's ratio to it.

    Candidates may have cycled for different lengths (one whose comparison was decided left
    the cycles: ``bench/runner/train/racing.py``): the best is the lowest (``_best``) among
    those that cycled longest, and each other candidate is paired with it over the cycles they
    share (its first ones). ``confidence``: every comparison's, or each candidate's (the
    confidence of the look its comparison was decided at), before Bonferroni's correction
    over ``comparisons`` (default: the other candidates)."""
    if not cycles:
        raise ValueError("no candidates to compare")
    times = {k: np.asarray(t, dtype=float) for k, t in cycles.items()}
    longest = max(len(t) for t in times.values())
    best = _best([k for k, t in times.items() if len(t) == longest], times)
    k_others = len(times) - 1 if comparisons is None else comparisons
    per = confidence if isinstance(confidence, dict) else dict.fromkeys(times, confidence)
    ratios = {}
    for k, t in times.items():
        if k != best:
            n = min(len(t), longest)
            ratios[k] = paired_cycles_ratio(t[:n], times[best][:n], adjusted(per[k], k_others))
    tied = [best] + [k for k, r in ratios.items() if not r.separable or in_band(r, band_pct)]
    undecided = [k for k, r in ratios.items() if not decided(r, band_pct)]
    each = min((r.confidence for r in ratios.values()), default=adjusted(per[best], k_others))
    return PairedVerdict(best, tied, ratios, each, undecided, longest)
