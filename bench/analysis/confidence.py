"""Claims with their confidence, from a run's samples (DataFrames in, DataFrames out).

``point_intervals``: every point's typical step time (the geometric mean of its round medians)
with a 95 % interval that includes the drift between rounds (``bench.stats.estimates``).
``verdicts``: per group (model and implementation, and a grid's second value), the best value,
the values tied with it, and the default's cost over the best with its interval
(``bench.stats.ties``). ``rounds_disagree``: points whose rounds differ more than the run's other
points' rounds do. ``noise_floor_pct``: the machine's own wander between points.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.runfolder.points import same_value
from bench.stats.estimates import (
    Estimate,
    estimates,
    floor_variance,
    outlying_rounds,
    round_medians,
)
from bench.stats.intervals import CONFIDENCE
from bench.stats.paired import DECIDED, look_confidence, versus_best_paired
from bench.stats.ties import versus_best

INTERVAL_COLUMNS = ["point", "typical_ms", "typical_ms_low", "typical_ms_high", "rounds"]
VERDICT_COLUMNS = [
    "model",
    "impl",
    "value2",
    "best",
    "best_ms",
    "tied",
    "n_values",
    "default",
    "default_ratio",
    "default_low",
    "default_high",
    "default_tied",
    "default_is_best",
    "span_pct",
    "floor_pct",
    "within_floor",
    "method",  # rounds (the points' estimates) or paired (per-cycle ratios, interleaved)
    "cycles",  # paired: the cycles the best was timed in (one decided early left them sooner)
]
# A point's rounds disagree when their spread is this unlikely under the other points' (F test).
DISAGREE_P = 0.01


def run_estimates(
    samples: pd.DataFrame,
    noise: pd.DataFrame | None,
    family: dict[str, str] | None = None,
    *,
    within_run: bool = True,
    pool: str = "",
) -> dict[str, Estimate]:
    """Every point's estimate, its variance from the run's rounds (or, with one round, its
    steps and the noise floor). ``family``: point -> the points that share one variance (a
    model's: a 5 ms step and a 200 ms step do not wander alike on this machine, measured at
    +-20 % and +-5 %); without it, the whole run. ``within_run``, ``pool``: as
    ``bench.stats.estimates.estimates`` (False to compare with another run)."""
    ok = samples[np.isfinite(samples["ms"])] if len(samples) else samples
    floor = noise["ms"].to_numpy() if noise is not None and len(noise) else None
    if family is None or ok.empty:
        return estimates(ok, floor, within_run=within_run, pool=pool)
    out: dict[str, Estimate] = {}
    keys = ok["point"].map(lambda p: family.get(p, ""))
    for key, part in ok.groupby(keys, sort=False):
        out.update(estimates(part, floor, within_run=within_run, pool=f"{pool}{key}"))
    return out


def families(results: pd.DataFrame) -> dict[str, str] | None:
    """point -> its model, where the results say (training runs)."""
    if "model" not in results or "point" not in results:
        return None
    return dict(zip(results["point"], results["model"].astype(str), strict=True))


def point_intervals(est: dict[str, Estimate]) -> pd.DataFrame:
    """Every point's typical time and its 95 % interval (INTERVAL_COLUMNS), from its estimate
    (``run_estimates``)."""
    rows = []
    for point, e in est.items():
        lo, hi = e.interval(CONFIDENCE)
        rows.append([point, e.value, lo, hi, e.rounds])
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


def noise_floor_pct(noise: pd.DataFrame | None) -> float:
    """Standard deviation, in %, of the reference workload's log median between gaps; NaN
    without a noise floor (runs of schema 2.0)."""
    if noise is None or len(noise) < 2:
        return math.nan
    s2, _ = floor_variance(noise["ms"].to_numpy())
    return 100 * math.sqrt(s2) if math.isfinite(s2) else math.nan


def verdicts(
    results: pd.DataFrame,
    samples: pd.DataFrame,
    noise: pd.DataFrame | None,
    defaults: dict[str, object],
    est: dict[str, Estimate] | None = None,
) -> pd.DataFrame:
    """One row per group of ok points (VERDICT_COLUMNS). ``defaults``: {"value": the swept
    axis's default} (from the points record), whose cost over the best is stated. ``est``:
    the points' estimates when the caller has them (``run_estimates`` of the ok points). A
    row whose step times do not time its configuration (``untimed`` says why: float8 emulated
    on a CPU) is in no verdict: shown, never ranked."""
    ok = results[results["status"] == "ok"] if len(results) else results
    if "untimed" in ok:
        untimed = ok["untimed"]
        ok = ok[untimed.isna() | (untimed.astype(str) == "")]
    if ok.empty:
        return pd.DataFrame(columns=VERDICT_COLUMNS)
    if est is None:  # the ok points' own, each model with its variance
        est = run_estimates(samples[samples["point"].isin(ok["point"])], noise, families(ok))
    floor = noise_floor_pct(noise)
    grid = "value2" in ok and ok["value2"].notna().any()
    keys = ["model", "impl", "value2"] if grid else ["model", "impl"]
    rows = []
    for key, g in ok.groupby(keys, sort=False, dropna=False):
        cands = {p: est[p] for p in g["point"] if p in est}
        if not cands:
            continue
        value_of = dict(zip(g["point"], g["value"], strict=True))
        cycles = _cycles(g, samples)
        v = _paired(g, cycles) if cycles else versus_best(cands, CONFIDENCE)
        default = defaults.get("value")
        default_point = next((p for p, val in value_of.items() if same_value(val, default)), None)
        r = v.ratios.get(default_point) if default_point else None
        span = max((x.ratio for x in v.ratios.values()), default=1.0)
        rows.append(
            {
                "model": key[0],
                "impl": key[1],
                "value2": key[2] if grid else None,
                "best": value_of[v.best],
                "best_ms": _typical(v, cands, cycles),
                "tied": [value_of[p] for p in v.tied],
                "n_values": len(cands),
                "default": default if default_point else None,
                "default_ratio": r.ratio if r else (1.0 if default_point == v.best else math.nan),
                "default_low": r.low if r else math.nan,
                "default_high": r.high if r else math.nan,
                "default_tied": default_point in v.tied if default_point else None,
                "default_is_best": default_point == v.best,
                "span_pct": 100 * (span - 1),
                "floor_pct": floor,
                # every difference in the group is smaller than the machine's own wander
                "within_floor": bool(math.isfinite(floor) and 100 * (span - 1) < floor),
                "method": "paired" if cycles else "rounds",
                "cycles": v.cycles if cycles else None,
            }
        )
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def _cycles(group: pd.DataFrame, samples: pd.DataFrame) -> dict[str, list[float]] | None:
    """Each point's step per cycle (its samples in index order) where every point of the
    group was timed interleaved, in one cohort: their sample i share a cycle. None otherwise
    (rounds, or a folder from before interleaving: no ``method``)."""
    if len(group) < 2 or "method" not in group or not (group["method"] == "paired").all():
        return None
    if "cohort" in group and group["cohort"].nunique(dropna=False) > 1:  # resumed: no pairs
        return None
    mine = samples[samples["point"].isin(group["point"])].sort_values("index")
    return {p: mine.loc[mine["point"] == p, "ms"].tolist() for p in group["point"]}


def _paired(group: pd.DataFrame, cycles: dict[str, list[float]]):
    """The paired verdict, each comparison at the confidence of the look it was decided at:
    an interim one where its candidate stopped decided (at its own count of cycles: one that
    left the race early has fewer), else the last (``bench.stats.paired``)."""
    stops = dict(zip(group["point"], group.get("stop", pd.Series(index=group.index)), strict=True))
    confidence = {
        p: look_confidence(len(t), stops.get(p) == DECIDED, CONFIDENCE) for p, t in cycles.items()
    }
    return versus_best_paired(cycles, confidence)


def _typical(v, cands: dict[str, Estimate], cycles) -> float:
    """The best's typical step: the median of its cycles (paired), else its estimate."""
    if cycles:
        return float(np.median(cycles[v.best]))
    return cands[v.best].value


def rounds_disagree(samples: pd.DataFrame, family: dict[str, str] | None = None) -> pd.DataFrame:
    """Per point with two rounds or more: the spread of its round medians (largest over
    smallest, minus 1, in %), the p-value of its rounds against the other points' of its
    ``family`` (F test, ``bench.stats.estimates.outlying_rounds``, as the estimates do) and
    whether they disagree (p < DISAGREE_P)."""
    cols = ["point", "round_spread_pct", "p", "disagree"]
    if samples.empty:
        return pd.DataFrame(columns=cols)
    logs = round_medians(samples)
    keys = logs["point"].map(lambda p: (family or {}).get(p, ""))
    wild: dict[str, float] = {}
    for _, part in logs.groupby(keys, sort=False):
        wild.update(outlying_rounds(part, DISAGREE_P))
    rows = []
    for point, g in logs.groupby("point", sort=False):
        if len(g) < 2:
            continue
        spread = 100 * (math.exp(g["log"].max() - g["log"].min()) - 1)
        rows.append([point, spread, wild.get(point, math.nan), point in wild])
    return pd.DataFrame(rows, columns=cols)
