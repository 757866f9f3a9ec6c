"""The centre of paired differences and its interval: Wilcoxon's signed-rank test inverted.

For differences d_1..d_n that are symmetric about a centre theta (the log of a per-cycle ratio
of two candidates: under "no difference" the two steps of a cycle are exchangeable, so their
log ratio is symmetric about 0; a real difference shifts it), the Hodges-Lehmann estimate of
theta is the median of the n(n+1)/2 Walsh averages (d_i + d_j) / 2, i <= j, and the interval
is two of those averages, the order statistics k and M + 1 - k (1-based), k the largest with
P(W+ <= k - 1) <= alpha / 2 under W+'s null distribution (Hollander, Wolfe and Chicken,
*Nonparametric Statistical Methods*, 3rd ed., section 3.2). Distribution-free, like the sign
test's interval of a median, but far more efficient: 95.5 % of Student's t where the data are
normal (the sign test: 64 %), and never below 86.4 % of it for any symmetric shape (Hodges and
Lehmann, 1956). On this machine's recorded cycles, whose log ratios are near normal, the sign
test's intervals were 16-25 % wider than t's.

W+'s null distribution is exact (the counts of the subsets of 1..n with each rank sum, by
recursion over n) up to ``EXACT_N`` differences, and the normal approximation with its
continuity correction above, as ``scipy.stats.wilcoxon`` does (it has the test, not the
interval: ``tests/test_stats.py`` checks these p-values against it, and the interval's ends
against where its test stops rejecting).

The Walsh averages are never formed: there are n(n+1)/2 of them, GiBs for a run of 40,000
steps. With d sorted, row i's averages (d_i + d_j) / 2, j >= i, ascend with j, so the
averages below a value are counted row by row in O(n log n) time and O(n) memory: each row's
boundary found by a search of d for 2t - d_i, confirmed on the rounded averages beside it, and
bisected on them where rounding moved it, so that the count is exact. Each wanted order
statistic is selected by pivoting on the weighted median of the rows' middle candidates, which
drops at least a quarter of the candidates left (Johnson and Mitchell, 1978; Monahan, 1984),
until 2n or fewer are left to partition: O(n log^2 n) time and O(n) memory in all, and the
very averages, bit for bit, that forming and partitioning them all would give.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from bench.stats.distributions import norm_cdf, norm_ppf

EXACT_N = 200  # exact null distribution up to here (an array of n(n+1)/2 + 1 floats)


@lru_cache(maxsize=64)
def _exact_cdf(n: int) -> np.ndarray:
    """P(W+ <= w) for w = 0..n(n+1)/2: each rank i in or out of the sum with probability 1/2."""
    p = np.zeros(n * (n + 1) // 2 + 1)
    p[0] = 1.0
    top = 0
    for i in range(1, n + 1):
        top += i
        p[i : top + 1] = (p[i : top + 1] + p[: top + 1 - i]) / 2  # with rank i
        p[:i] /= 2  # sums below i cannot hold it
    cdf = np.cumsum(p)
    return np.minimum(cdf, 1.0)


def rank_sum_cdf(w: float, n: int) -> float:
    """P(W+ <= w) under the null, n differences (no zeros, no ties)."""
    if w < 0:
        return 0.0
    total = n * (n + 1) // 2
    if w >= total:
        return 1.0
    if n <= EXACT_N:
        return float(_exact_cdf(n)[math.floor(w)])
    mean, sd = total / 2, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return norm_cdf((math.floor(w) + 0.5 - mean) / sd)


def _lower_index(n: int, alpha: float) -> int:
    """k (1-based): the largest k with P(W+ <= k - 1) <= alpha / 2; 0 when none has."""
    total = n * (n + 1) // 2
    if n <= EXACT_N:
        return int(np.searchsorted(_exact_cdf(n), alpha / 2, side="right"))
    mean, sd = total / 2, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    k = math.floor(mean + norm_ppf(alpha / 2) * sd + 0.5) + 1  # then nudged to the rule
    while k > 0 and rank_sum_cdf(k - 1, n) > alpha / 2:
        k -= 1
    while rank_sum_cdf(k, n) <= alpha / 2:
        k += 1
    return k


def _past(w: np.ndarray, t: float, side: str) -> np.ndarray:
    """Whether each average lies past t: above it (side "right") or at or above it ("left")."""
    return w > t if side == "right" else w >= t


def _bisect(
    d: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, t: float, side: str
) -> np.ndarray:
    """Per row i of sorted ``d``, the first column j in [lo, hi) whose average (d_i + d_j) / 2
    is past t, hi where none is (each row's averages ascend with j): one bisection over all
    the rows at once."""
    lo, hi = lo.copy(), hi.copy()
    di = d[rows]
    open_ = np.flatnonzero(lo < hi)
    while open_.size:
        mid = (lo[open_] + hi[open_]) // 2
        past = _past((di[open_] + d[mid]) / 2, t, side)
        hi[open_[past]] = mid[past]
        lo[open_[~past]] = mid[~past] + 1
        open_ = open_[lo[open_] < hi[open_]]
    return lo


def _search(
    d: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, t: float, side: str
) -> np.ndarray:
    """``_bisect``'s columns, np.searchsorted's sides: guessed where exact arithmetic would put
    them (d_j against 2t - d_i), kept where the rounded averages on either side confirm them,
    and bisected in the rows where rounding moved them."""
    di = d[rows]
    with np.errstate(all="ignore"):  # an overflowing guess is only a wrong guess
        guess = np.clip(np.searchsorted(d, 2 * t - di, side), lo, hi)
    last = len(d) - 1
    before = (guess == lo) | ~_past((di + d[np.maximum(guess - 1, 0)]) / 2, t, side)
    after = (guess == hi) | _past((di + d[np.minimum(guess, last)]) / 2, t, side)
    wrong = np.flatnonzero(~(before & after))
    guess[wrong] = _bisect(d, rows[wrong], lo[wrong], hi[wrong], t, side)
    return guess


def _pivot(d: np.ndarray, rows: np.ndarray, lo: np.ndarray, size: np.ndarray) -> float:
    """The weighted median of the rows' middle candidates, weighted by their candidates: at
    least a quarter of all the candidates lie on each side of it, ties included."""
    middles = (d[rows] + d[lo + (size - 1) // 2]) / 2
    order = np.argsort(middles, kind="stable")
    weight = np.cumsum(size[order])
    return float(middles[order[np.searchsorted(weight, weight[-1] / 2)]])


def _partition_rest(
    d: np.ndarray, rows: np.ndarray, lo: np.ndarray, size: np.ndarray, r: int
) -> float:
    """The r-th smallest (0-based) of the candidates left, formed and partitioned."""
    row = np.repeat(rows, size)
    col = np.repeat(lo - (np.cumsum(size) - size), size) + np.arange(len(row))
    return float(np.partition((d[row] + d[col]) / 2, r)[r])


def _walsh_select(d: np.ndarray, r: int) -> float:
    """The r-th smallest (0-based) of sorted ``d``'s Walsh averages (d_i + d_j) / 2, i <= j,
    in O(n) memory: row i's candidates are its columns lo[i]..hi[i] - 1, those left of them
    below the answer, those right of them above it."""
    n = len(d)
    rows = np.arange(n)
    lo, hi = rows.copy(), np.full(n, n)
    while True:
        live = np.flatnonzero(lo < hi)
        size = hi[live] - lo[live]
        below = int((lo - rows).sum())
        if size.sum() <= 2 * n:
            return _partition_rest(d, live, lo[live], size, r - below)
        pivot = _pivot(d, live, lo[live], size)
        under = _search(d, live, lo[live], hi[live], pivot, "left")
        upto = _search(d, live, under, hi[live], pivot, "right")
        n_under = below + int((under - lo[live]).sum())
        n_upto = n_under + int((upto - under).sum())
        if r < n_under:
            hi[live] = under
        elif r >= n_upto:
            lo[live] = upto
        else:
            return pivot


def hodges_lehmann(d, confidence: float) -> tuple[float, float, float]:
    """(estimate, low, high) of the centre of ``d``'s symmetric distribution; NaN ends where
    ``d`` is too short for the confidence (fewer than 6 differences at 95 %)."""
    d = np.asarray(d, dtype=float)
    d = np.sort(d[np.isfinite(d)])
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan
    m = n * (n + 1) // 2
    k = _lower_index(n, 1 - confidence)
    low_middle = _walsh_select(d, (m - 1) // 2)
    high_middle = low_middle if m % 2 else _walsh_select(d, m // 2)
    centre = (low_middle + high_middle) / 2
    if k < 1:
        return centre, math.nan, math.nan
    return centre, _walsh_select(d, k - 1), _walsh_select(d, m - k)


def signed_rank_p(d) -> float:
    """The two-sided p-value of Wilcoxon's signed-rank test that ``d`` is centred on 0 (zeros
    dropped, as Wilcoxon's; tied ranks averaged, and then the normal approximation, whose
    variance ties reduce)."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d) & (d != 0)]
    n = len(d)
    if n == 0:
        return 1.0
    a = np.abs(d)
    order = np.argsort(a, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1)
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    if (counts > 1).any():  # average the tied ranks
        sums = np.bincount(inverse, weights=ranks)
        ranks = (sums / counts)[inverse]
    w = float(ranks[d > 0].sum())
    total = n * (n + 1) / 2
    if n <= EXACT_N and not (counts > 1).any():
        low = rank_sum_cdf(w, n)
        high = rank_sum_cdf(total - w, n)  # P(W+ >= w), by W+'s symmetry: no cancellation
        return float(min(1.0, 2 * min(low, high)))
    mean = total / 2
    var = n * (n + 1) * (2 * n + 1) / 24 - float((counts**3 - counts).sum()) / 48
    z = (abs(w - mean) - 0.5) / math.sqrt(var)
    return float(min(1.0, 2 * (1 - norm_cdf(max(z, 0.0)))))
