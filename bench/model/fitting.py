"""Fitting a collective's alpha and beta: least squares on relative residuals, sizes far off
set aside, bootstrap intervals, and the fit's quality on its own scale (``comm.py`` applies it).

The fit minimises relative residuals (sizes span four orders of magnitude; plain least squares
would ignore every small message) with alpha, beta >= 0. Its quality is reported on that scale:
R^2 of log time (``r2_log``; a relative residual r is log(1 + r) ~ r in log time), since R^2 of
absolute times is all but the largest sizes': it reads 0.9999 over a fit up to 80 % off at the
four smallest sizes (tests/test_model.py), log time's 0.90; and the residual of every size,
those set aside as outliers named beside the fit.

alpha and beta get 95 % intervals by bootstrap (Efron and Tibshirani, "An Introduction to the
Bootstrap", 1993, ch. 13, percentile intervals): each size's timed iterations (samples.csv) are
resampled on their own, their median taken (the statistic of ``time_us``), and the whole fit,
outlier rule included, made again. scipy.stats.bootstrap draws the resamples (``paired=False``:
one sample per size); the percentile method rather than BCa, whose jackknife acceleration is
unreliable for a statistic with a median and a clamp at zero in it. The refitted (alpha, beta)
pairs are kept, so that a predicted time's interval comes from the same pairs (alpha and beta
are correlated: their ends taken together would overstate it).
"""

from __future__ import annotations

import math

import numpy as np

OUTLIER_FACTOR = 4.0  # a size this many times further off than the median one is set aside


CONFIDENCE = 0.95
RESAMPLES = 1000
SEED = 0  # fixed: the same run always gives the same intervals
TAILS_PCT = (50.0 * (1 - CONFIDENCE), 50.0 * (1 + CONFIDENCE))


def nonneg_lstsq(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min |X c - y| with c >= 0: scipy's Lawson-Hanson NNLS, on columns scaled to unit norm
    (alpha's and beta's columns differ by some nine orders of magnitude)."""
    norm = np.linalg.norm(X, axis=0)
    norm[norm == 0] = 1.0
    from scipy import optimize  # on first use: a replay's ranks import this module, never fit

    c, _ = optimize.nnls(X / norm, y)
    return c / norm


def fit_relative(X: np.ndarray, t: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, beta), and which sizes were kept: a first fit, then again without the sizes
    whose relative residual exceeds ``OUTLIER_FACTOR`` times the median one (at most a
    quarter of them)."""
    keep = np.ones(len(t), dtype=bool)
    coef = nonneg_lstsq(X / t[:, None], np.ones_like(t))
    rel = np.abs(X @ coef / t - 1.0)
    limit = OUTLIER_FACTOR * max(float(np.median(rel)), 0.01)
    worst = np.argsort(-rel)[: len(t) // 4]
    keep[worst[rel[worst] > limit]] = False
    if not keep.all() and len(np.unique(s[keep])) >= 2:
        coef = nonneg_lstsq(X[keep] / t[keep, None], np.ones(int(keep.sum())))
    return coef, keep


def refit_intervals(
    X: np.ndarray, t: np.ndarray, s: np.ndarray, samples: list
) -> np.ndarray | None:
    """(RESAMPLES, 2): alpha and beta refitted to each resample of the sizes' iterations, or
    None when no size has two. A size's resampled time is ``time_us`` scaled by its resample's
    median over its samples' median: the samples' spread, whatever statistic the run reports;
    sizes with fewer than two samples keep their time."""
    held = [i for i, x in enumerate(samples) if np.size(x) >= 2]  # None and NaN: size 1
    if not held:
        return None
    data = [np.asarray(samples[i], dtype=float) for i in held]
    scale = t[held] / np.array([np.median(x) for x in data])

    def refit(*resampled, axis=-1):
        medians = np.stack([np.median(r, axis=axis) for r in resampled], axis=-1)
        batch = medians.shape[:-1]
        times = np.tile(t, (int(np.prod(batch)), 1))
        times[:, held] = medians.reshape(-1, len(held)) * scale
        coefs = np.array([fit_relative(X, row, s)[0] for row in times])
        return coefs.T.reshape(2, *batch)

    from scipy import stats  # on first use, as above

    res = stats.bootstrap(
        data,
        refit,
        n_resamples=RESAMPLES,
        vectorized=True,
        paired=False,
        confidence_level=CONFIDENCE,
        method="percentile",
        random_state=np.random.default_rng(SEED),
    )
    return res.bootstrap_distribution.T


def interval(values: np.ndarray | None, estimate: float = math.nan) -> tuple[float, float]:
    """The percentile interval of ``values``, widened to hold ``estimate`` where it falls
    outside: with an outlier rule and a clamp at zero in the fit, the resamples' distribution
    can be skewed enough that its 95 % misses the full sample's own fit (beta 1.16 against
    [1.29, ...] once in a test run), and an interval that excludes its estimate is no answer."""
    if values is None:
        return math.nan, math.nan
    low, high = np.percentile(values, TAILS_PCT)
    if math.isfinite(estimate):
        low, high = min(low, estimate), max(high, estimate)
    return float(low), float(high)


def r2_log(t: np.ndarray, pred: np.ndarray) -> float:
    """R^2 of log time: the share of log time's variance about its mean that the fit explains."""
    if np.any(pred <= 0):
        return math.nan
    lt, lp = np.log(t), np.log(pred)
    ss_tot = float(np.sum((lt - lt.mean()) ** 2))
    return 1.0 - float(np.sum((lt - lp) ** 2)) / ss_tot if ss_tot > 0 else math.nan
