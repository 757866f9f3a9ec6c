"""A point's typical time with its uncertainty, and the ratio of two points with its interval.

Measured on the 2-core CPU machine this suite is developed on: its speed wanders by 4-8 % over
seconds, so consecutive steps share a drift that their own interval cannot see (two visits of
the same configuration differed by 7-11 %, four times their step-to-step interval). A point's
uncertainty therefore comes from repeated *visits* (rounds), not from its steps alone:

- a point's estimate is the mean over its rounds of the log of each round's median (the
  geometric mean of the round medians);
- with two rounds or more, its variance is s² / R, where s² is the residual variance of the
  additive model log m[point, round] = point + round + error over the points measured in every
  round: a randomised complete block design, the rounds being the blocks (Montgomery, Design and
  Analysis of Experiments, 8th ed., section 4.1), so that a whole round running slower costs no
  precision. A point whose rounds disagree with that variance (``outlying_rounds``) is left out
  of it and keeps its own. Comparing two runs cannot set the rounds' effects aside, so there s²
  adds the variance of the rounds' effects themselves (their mean squares less the residual's
  share, the method of moments of a two-way random-effects model; degrees of freedom by
  Welch-Satterthwaite, which are few with few rounds: ``within_run=False``);
- with one round, the variance is the step-to-step one of its median (``intervals.log_se``)
  plus the machine's noise floor: the variance between the medians of a fixed reference
  workload timed between points.

Intervals of ratios use Student's t with the estimates' degrees of freedom (Welch-Satterthwaite
when two estimates come from different variance estimates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bench.stats.distributions import f_sf, t_ppf, t_sf
from bench.stats.intervals import CONFIDENCE, log_se
from bench.stats.signed_rank import hodges_lehmann, signed_rank_p


@dataclass(frozen=True)
class Estimate:
    """log: the log of the typical time (ms); var: its variance; df: the degrees of freedom of
    that variance (inf: known); rounds: visits it pools; pool: which variance estimate it
    shares with other estimates (those with the same pool are not independent)."""

    log: float
    var: float
    df: float
    rounds: int
    pool: str = ""

    @property
    def value(self) -> float:
        return math.exp(self.log)

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        if not (math.isfinite(self.var) and self.df > 0):
            return math.nan, math.nan
        half = t_ppf(0.5 + confidence / 2, self.df) * math.sqrt(self.var)
        return math.exp(self.log - half), math.exp(self.log + half)


@dataclass(frozen=True)
class Ratio:
    """a / b of two estimates: the ratio, its interval and the two-sided p-value of 'equal'."""

    ratio: float
    low: float
    high: float
    p: float
    confidence: float

    @property
    def separable(self) -> bool:
        """The interval excludes 1: a is faster or slower than b at this confidence."""
        return self.low > 1 or self.high < 1


def round_medians(samples: pd.DataFrame) -> pd.DataFrame:
    """Columns point, round, log: the log of each visit's median time."""
    g = samples.groupby(["point", "round"], sort=False)["ms"].median()
    out = g.reset_index()
    out["log"] = np.log(out["ms"])
    return out[["point", "round", "log"]]


def _complete(logs: pd.DataFrame) -> pd.DataFrame:
    """log medians as a point x round table, of the points measured in every round."""
    return logs.pivot_table(index="point", columns="round", values="log").dropna()


def _residuals(x: np.ndarray) -> np.ndarray:
    """What is left of a point x round table once each point's and each round's effect are
    taken out (the additive two-way fit)."""
    return x - x.mean(axis=1, keepdims=True) - x.mean(axis=0, keepdims=True) + x.mean()


def _table_variance(x: np.ndarray) -> tuple[float, float]:
    """(s², df) of a point x round table: see ``block_variance``."""
    p, r = x.shape
    if r < 2 or p < 1:
        return math.nan, 0.0
    if p == 1:  # one point: nothing to block against, the spread of its rounds
        return float(np.var(x, ddof=1)), float(r - 1)
    df = (p - 1) * (r - 1)
    return float((_residuals(x) ** 2).sum() / df), float(df)


def block_variance(logs: pd.DataFrame) -> tuple[float, float]:
    """(s², df): residual variance of point + round on the points measured in every round."""
    return _table_variance(_complete(logs).to_numpy())


def outlying_rounds(logs: pd.DataFrame, p_value: float = 0.01) -> dict[str, float]:
    """Points whose rounds disagree: point -> the p-value of its residuals' variance against
    the other points' pooled one (F test on the block model's residuals), for those below
    ``p_value``. One wild visit (measured here: a round 40 % slower than the point's others,
    once in 30 visits) would otherwise widen every point's interval; such a point keeps its
    own spread instead (``estimates``)."""
    wide = _complete(logs)
    p, r = wide.shape
    if p < 3 or r < 2:
        return {}
    x = wide.to_numpy()
    resid = _residuals(x)
    out = {}
    for i, point in enumerate(wide.index):
        others, _ = _table_variance(np.delete(x, i, axis=0))
        if not others > 0:
            continue
        own = float((resid[i] ** 2).sum()) / (r - 1)
        prob = f_sf(own / others, r - 1, (p - 2) * (r - 1))
        if prob < p_value:
            out[str(point)] = prob
    return out


def cross_run_variance(logs: pd.DataFrame) -> tuple[float, float]:
    """(s², df) of one visit for comparisons with another run: the residual variance plus the
    variance of the rounds' effects, which another run does not share."""
    wide = _complete(logs)
    p, r = wide.shape
    s2e, dfe = _table_variance(wide.to_numpy())
    if p < 2 or r < 2 or dfe <= 0:
        return s2e, dfe
    effects = wide.to_numpy().mean(axis=0)
    s2r = max(0.0, float(np.var(effects, ddof=1)) - s2e / p)
    total = s2e + s2r
    if total <= 0:
        return 0.0, dfe
    # Welch-Satterthwaite over the two mean squares: the round effects count with r - 1
    df = total**2 / (s2e**2 / dfe + (s2r**2 / (r - 1) if s2r > 0 else 0.0))
    return total, float(df)


def floor_variance(floor_ms) -> tuple[float, float]:
    """(s², df) of the log medians of the reference workload timed between points."""
    x = np.asarray(floor_ms, dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    if len(x) < 2:
        return math.nan, 0.0
    return float(np.var(np.log(x), ddof=1)), float(len(x) - 1)


def estimates(
    samples: pd.DataFrame,
    floor_ms=None,
    *,
    within_run: bool = True,
    pool: str = "",
) -> dict[str, Estimate]:
    """Every point's estimate from its samples (columns point, round, ms), as the module says.
    ``floor_ms``: the reference workload's median per gap (one-round runs)."""
    if samples.empty:
        return {}
    logs = round_medians(samples)
    multi = logs.groupby("point")["round"].nunique().max() >= 2
    out: dict[str, Estimate] = {}
    if multi:
        wild = outlying_rounds(logs) if within_run else {}
        pooled = logs[~logs["point"].isin(wild)]
        s2, df = block_variance(pooled) if within_run else cross_run_variance(logs)
        for point, g in logs.groupby("point", sort=False):
            if point in wild:  # its own spread, not the others'
                own = float(np.var(g["log"], ddof=1))
                out[point] = Estimate(
                    float(g["log"].mean()), own / len(g), len(g) - 1.0, len(g), f"{pool}:{point}"
                )
                continue
            var = s2 / len(g) if df > 0 else math.inf
            out[point] = Estimate(float(g["log"].mean()), var, df, len(g), pool)
        return out
    f2, fdf = floor_variance(floor_ms) if floor_ms is not None else (math.nan, 0.0)
    for point, g in samples.groupby("point", sort=False):
        se = log_se(g["ms"])
        if fdf > 0 and math.isfinite(se):
            var, df = se**2 + f2, fdf
        else:  # no floor: the step-to-step interval alone (it cannot see drift)
            var, df = se**2, math.inf
        out[point] = Estimate(float(np.log(np.median(g["ms"]))), var, df, 1, pool)
    return out


def _df(a: Estimate, b: Estimate) -> float:
    if a.pool == b.pool and a.df == b.df:  # one variance estimate: its own df
        return a.df
    terms = [e.var**2 / e.df for e in (a, b) if math.isfinite(e.df) and e.df > 0]
    if not terms:
        return math.inf
    return (a.var + b.var) ** 2 / sum(terms)  # Welch-Satterthwaite


def ratio(a: Estimate, b: Estimate, confidence: float = CONFIDENCE) -> Ratio:
    """a / b with its interval (Student's t on the difference of logs)."""
    d, var = a.log - b.log, a.var + b.var
    r = math.exp(d)
    if not math.isfinite(var):
        return Ratio(r, math.nan, math.nan, math.nan, confidence)
    if var == 0:
        return Ratio(r, r, r, 1.0 if d == 0 else 0.0, confidence)
    df, se = _df(a, b), math.sqrt(var)
    half = t_ppf(0.5 + confidence / 2, df) * se
    p = 2 * t_sf(abs(d) / se, df)
    return Ratio(r, math.exp(d - half), math.exp(d + half), p, confidence)


def paired_ratio(a, b, confidence: float = CONFIDENCE) -> Ratio:
    """a / b from rounds that measured both (a[i] with b[i], interleaved): Student's t on the
    per-round log ratios, so what drifts between rounds cancels."""
    d = np.log(np.asarray(a, dtype=float)) - np.log(np.asarray(b, dtype=float))
    n = len(d)
    if n < 2:
        r = float(np.exp(d.mean())) if n else math.nan
        return Ratio(r, math.nan, math.nan, math.nan, confidence)
    est = Estimate(float(d.mean()), float(np.var(d, ddof=1) / n), float(n - 1), n)
    return ratio(est, Estimate(0.0, 0.0, math.inf, n), confidence)


def paired_cycles_ratio(a, b, confidence: float = CONFIDENCE) -> Ratio:
    """a / b from cycles that timed both close together (a[i] beside b[i]): the Hodges-Lehmann
    estimate of the per-cycle log ratios (the median of their Walsh averages) with the
    signed-rank interval and p-value (``signed_rank.py``), exponentiated. Drift and a
    neighbour's load hit both sides of a cycle alike and cancel in its ratio; the two steps of
    a cycle are exchangeable under "no difference", so the log ratio is symmetric, which is all
    the interval assumes; an odd cycle moves it by its rank, not by its size. Fewer cycles than
    the confidence needs (6 at 95 %) give no interval (NaN)."""
    d = np.log(np.asarray(a, dtype=float)) - np.log(np.asarray(b, dtype=float))
    d = d[np.isfinite(d)]
    if len(d) == 0:
        return Ratio(math.nan, math.nan, math.nan, math.nan, confidence)
    centre, low, high = hodges_lehmann(d, confidence)
    return Ratio(math.exp(centre), math.exp(low), math.exp(high), signed_rank_p(d), confidence)
