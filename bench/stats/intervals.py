"""The interval of a median, distribution-free.

A step time's distribution is skewed and has outliers, so no shape is assumed: the interval is
made of two order statistics of the sample, chosen with the binomial distribution of how many
samples fall below the true median (the sign test inverted; Conover, Practical Nonparametric
Statistics, 3rd ed., section 3.2): ``scipy.stats.quantile_test``'s interval, its binomial
read through ``distributions.py`` (a rank can afford scipy.special; tests/test_stats.py checks
the two agree). It covers the median of the distribution the samples were drawn from, with at
least the confidence asked, when the samples are independent draws; drift between samples is
what rounds are for (``estimates.py``).
"""

from __future__ import annotations

import math

import numpy as np

from bench.stats.distributions import half_binomial_cdf, half_binomial_sf, norm_ppf

CONFIDENCE = 0.95


def median_interval(samples, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(low, high) of the median's interval; NaNs when the sample is too small to have one
    (fewer than 6 samples at 95 %)."""
    x = np.sort(np.asarray(samples, dtype=float))
    x = x[np.isfinite(x)]
    n = len(x)
    if n < 2:
        return math.nan, math.nan
    # quantile_test's two-sided interval at p = 1/2: the order statistics (0-based) at
    # binom.ppf(tail) - 1 and binom.isf(tail); ppf is the first k with P(X <= k) >= tail, isf
    # the first with P(X > k) <= tail, X ~ Binomial(n, 1/2).
    tail = (1 - confidence) / 2
    low = int(np.argmax(half_binomial_cdf(n) >= tail)) - 1
    high = int(np.argmax(half_binomial_sf(n) <= tail))
    return (
        float(x[low]) if low >= 0 else math.nan,
        float(x[high]) if high < n else math.nan,
    )


def half_width_pct(samples, confidence: float = CONFIDENCE) -> float:
    """The larger distance from the median to an end of its interval, in % of the median;
    infinite while the sample is too small to have an interval."""
    x = np.asarray(samples, dtype=float)
    lo, hi = median_interval(x, confidence)
    return relative_half_width(float(np.median(x)) if len(x) else math.nan, lo, hi)


def relative_half_width(median: float, low: float, high: float) -> float:
    """The larger distance from ``median`` to an end of its interval, in % of it; infinite
    without an interval."""
    if not (math.isfinite(low) and math.isfinite(high)) or not median > 0:
        return math.inf
    return 100.0 * max(median - low, high - median) / median


def log_se(samples, confidence: float = CONFIDENCE) -> float:
    """Standard error of the log of the median, read off its interval (the interval's width in
    logs over twice the normal quantile); infinite without an interval."""
    lo, hi = median_interval(samples, confidence)
    if not (math.isfinite(lo) and math.isfinite(hi)) or not lo > 0:
        return math.inf
    return (math.log(hi) - math.log(lo)) / (2 * norm_ppf(0.5 + confidence / 2))
