"""The interval of a median, distribution-free.

A step time's distribution is skewed and has outliers, so no shape is assumed: the interval is
made of two order statistics of the sample, chosen with the binomial distribution of how many
samples fall below the true median (the sign test inverted; Conover, Practical Nonparametric
Statistics, 3rd ed., section 3.2). ``scipy.stats.quantile_test`` computes it. It covers the
median of the distribution the samples were drawn from, with at least the confidence asked,
when the samples are independent draws; drift between samples is what rounds are for
(``estimates.py``).
"""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95


def scipy_stats():
    """scipy.stats, imported on first use: its import costs 0.7 CPU-s here, which a launcher,
    a replay's ranks or a reader that never makes an interval need not pay."""
    import scipy.stats

    return scipy.stats


def median_interval(samples, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """(low, high) of the median's interval; NaNs when the sample is too small to have one
    (fewer than 6 samples at 95 %)."""
    x = np.asarray(samples, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return math.nan, math.nan
    test = scipy_stats().quantile_test(x, q=float(np.median(x)), p=0.5)
    ci = test.confidence_interval(confidence)
    return float(ci.low), float(ci.high)


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
    z = scipy_stats().norm.ppf(0.5 + confidence / 2)
    return (math.log(hi) - math.log(lo)) / (2 * z)
