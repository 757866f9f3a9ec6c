"""The distribution functions the suite's intervals and tests read, from ``scipy.special``: the
very functions ``scipy.stats``'s distributions evaluate (``t``: ``stdtr``, ``stdtrit``; ``f``:
``fdtrc``; ``norm``: ``ndtr``, ``ndtri``; ``binom``: ``bdtr``, ``bdtrc``, where scipy.stats
calls Boost's binomial and agrees to rounding). Every rank of every launch times its steps
with an interval, and importing scipy.stats costs a process 1.4 CPU-s here against
scipy.special's 0.1: on this machine's test suite, a few minutes. ``tests/test_stats.py``
checks each against scipy.stats.
"""

from __future__ import annotations

import numpy as np


def _special():
    from scipy import special  # on first use: a launcher never makes an interval

    return special


def t_ppf(q: float, df: float) -> float:
    """Student's t quantile: ``scipy.stats.t.ppf(q, df)``."""
    return float(_special().stdtrit(df, q))


def t_sf(x: float, df: float) -> float:
    """Student's t upper tail: ``scipy.stats.t.sf(x, df)``."""
    return float(_special().stdtr(df, -x))


def f_sf(x: float, dfn: float, dfd: float) -> float:
    """The F distribution's upper tail: ``scipy.stats.f.sf(x, dfn, dfd)``."""
    return float(_special().fdtrc(dfn, dfd, x))


def norm_cdf(x: float) -> float:
    """The standard normal distribution function: ``scipy.stats.norm.cdf(x)``."""
    return float(_special().ndtr(x))


def norm_ppf(q: float) -> float:
    """The standard normal quantile: ``scipy.stats.norm.ppf(q)``."""
    return float(_special().ndtri(q))


def half_binomial_cdf(n: int) -> np.ndarray:
    """P(X <= k) for k = 0..n, X ~ Binomial(n, 1/2): ``scipy.stats.binom(n, 0.5).cdf``."""
    return _special().bdtr(np.arange(n + 1), n, 0.5)


def half_binomial_sf(n: int) -> np.ndarray:
    """P(X > k) for k = 0..n, X ~ Binomial(n, 1/2): ``scipy.stats.binom(n, 0.5).sf``."""
    return _special().bdtrc(np.arange(n + 1), n, 0.5)
