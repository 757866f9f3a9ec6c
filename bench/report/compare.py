"""Run-to-run comparison on samples: is the new run faster, slower, or not different?

Each point's timed samples (samples.csv) of the new run are tested against the same point's
samples of the baseline with the Mann-Whitney U test (two-sided, normal approximation with tie
and continuity corrections; Mann and Whitney 1947), which needs no assumption about the shape
of the timing distribution and is robust to the outliers timing always has. A change is called
only when it is significant (p < ``alpha``) and at least ``min_change`` in size.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

COMPARE_COLUMNS = [
    "point", "impl", "label", "new_ms", "old_ms", "ratio", "p_value", "verdict", "regression",
    "n_new", "n_old",
]  # fmt: skip


def _ranks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average ranks (1-based) of ``x`` and the sizes of its groups of ties."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    boundaries = np.flatnonzero(np.diff(sorted_x)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(x)]])
    avg = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(avg, ends - starts)
    return ranks, ends - starts


def mann_whitney_u(a, b) -> tuple[float, float]:
    """(U of ``a``, two-sided p-value)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return math.nan, math.nan
    ranks, ties = _ranks(np.concatenate([a, b]))
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    n = n1 + n2
    mean = n1 * n2 / 2
    tie_term = (ties**3 - ties).sum() / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12 * ((n + 1) - tie_term)
    if var <= 0:  # every sample equal: no evidence of any difference
        return float(u1), 1.0
    z = (abs(u1 - mean) - 0.5) / math.sqrt(var)
    p = math.erfc(max(z, 0.0) / math.sqrt(2))  # 2 * (1 - Phi(z))
    return float(u1), min(1.0, p)


def compare(
    new: pd.DataFrame,
    new_samples: pd.DataFrame,
    old: pd.DataFrame,
    old_samples: pd.DataFrame,
    *,
    alpha: float = 0.05,
    min_change: float = 0.02,
) -> pd.DataFrame:
    """One row per point present, ok, in both runs (COMPARE_COLUMNS); ratio = new / old of the
    median sample, below 1 is faster."""
    rows = []
    ok_old = old[old["status"] == "ok"].set_index("point")
    new_by = dict(tuple(new_samples.groupby("point")["ms"])) if len(new_samples) else {}
    old_by = dict(tuple(old_samples.groupby("point")["ms"])) if len(old_samples) else {}
    for r in new[new["status"] == "ok"].itertuples(index=False):
        if r.point not in ok_old.index or r.point not in new_by or r.point not in old_by:
            continue
        a, b = new_by[r.point].to_numpy(), old_by[r.point].to_numpy()
        new_ms, old_ms = float(np.median(a)), float(np.median(b))
        ratio = new_ms / old_ms if old_ms > 0 else math.nan
        _, p = mann_whitney_u(a, b)
        verdict = "no significant change"
        if p < alpha and abs(ratio - 1) >= min_change:
            verdict = "faster" if ratio < 1 else "slower"
        label = getattr(r, "model", None) or getattr(r, "collective", "")
        rows.append({
            "point": r.point, "impl": r.impl, "label": label, "new_ms": new_ms,
            "old_ms": old_ms, "ratio": ratio, "p_value": p, "verdict": verdict,
            "regression": verdict == "slower", "n_new": len(a), "n_old": len(b),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=COMPARE_COLUMNS)
