"""Run-to-run comparison: is the new run faster, slower, or tied with the baseline?

Each point present, ok, in both runs is estimated in each run as the run estimates its own
points (``bench.stats.estimates``: the spread of its rounds' medians, or with one round its
steps' interval plus the noise floor), but without setting whole rounds aside, since rounds of
two runs are not paired. The ratio new / old gets a Student-t interval
(Welch-Satterthwaite degrees of freedom); the points' intervals share one 95 % confidence
(Bonferroni over the points compared). A point is faster or slower only when its whole
interval is below or above 1; otherwise the runs are tied on it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.analysis.confidence import run_estimates
from bench.stats.estimates import ratio
from bench.stats.intervals import CONFIDENCE
from bench.stats.ties import adjusted

COMPARE_COLUMNS = [
    "point",
    "impl",
    "label",
    "new_ms",
    "old_ms",
    "ratio",
    "low",
    "high",
    "p_value",
    "verdict",
    "regression",
    "rounds_new",
    "rounds_old",
]
TIED = "tied"


def compare(
    new: pd.DataFrame,
    new_samples: pd.DataFrame,
    old: pd.DataFrame,
    old_samples: pd.DataFrame,
    *,
    new_noise: pd.DataFrame | None = None,
    old_noise: pd.DataFrame | None = None,
    confidence: float = CONFIDENCE,
) -> pd.DataFrame:
    """One row per point present, ok, in both runs (COMPARE_COLUMNS); ratio = new / old of
    the typical step (or collective) time, below 1 is faster."""
    ok_old = set(old.loc[old["status"] == "ok", "point"]) if len(old) else set()
    ok_new = new[new["status"] == "ok"] if len(new) else new
    both = [p for p in ok_new["point"] if p in ok_old] if len(ok_new) else []
    a = run_estimates(
        new_samples[new_samples["point"].isin(both)], new_noise, within_run=False, pool="new"
    )
    b = run_estimates(
        old_samples[old_samples["point"].isin(both)], old_noise, within_run=False, pool="old"
    )
    both = [p for p in both if p in a and p in b]
    each = adjusted(confidence, len(both))
    rows = []
    for r in ok_new.itertuples(index=False):
        if r.point not in both:
            continue
        x = ratio(a[r.point], b[r.point], each)
        verdict = TIED
        if x.separable:
            verdict = "faster" if x.high < 1 else "slower"
        label = getattr(r, "model", None) or getattr(r, "collective", "")
        rows.append(
            {
                "point": r.point,
                "impl": r.impl,
                "label": label,
                "new_ms": a[r.point].value,
                "old_ms": b[r.point].value,
                "ratio": x.ratio,
                "low": x.low,
                "high": x.high,
                "p_value": x.p if math.isfinite(x.p) else np.nan,
                "verdict": verdict,
                "regression": verdict == "slower",
                "rounds_new": a[r.point].rounds,
                "rounds_old": b[r.point].rounds,
            }
        )
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)
