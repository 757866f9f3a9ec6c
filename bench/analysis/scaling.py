"""Scaling efficiency of a world-size sweep (DataFrame -> DataFrame).

For each model, implementation, strategy and scaling mode, the point at the smallest world size
k0 (normally 1 rank) is the base. Throughput is samples per second over all replicas, so one
formula serves both modes: speedup = throughput(k) / throughput(k0), ideal = k / k0,
efficiency = speedup / ideal. Weak scaling (fixed per-replica batch) is ideal when the step time
stays flat; strong scaling (fixed global batch) when it falls as 1/k.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

KEYS = ["model", "impl", "strategy", "scaling"]
COLUMNS = ["ideal_speedup", "speedup", "efficiency_pct"]


def scaling_efficiency(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with ``ideal_speedup``, ``speedup`` and ``efficiency_pct`` for its ok rows (NaN
    elsewhere, and where a series has no ok base point)."""
    out = df.copy()
    for c in COLUMNS:
        out[c] = np.nan
    if "scaling" not in out or out.empty:
        return out
    ok = out[(out["status"] == "ok") & out["scaling"].notna()]
    for _, g in ok.groupby(KEYS, sort=False, dropna=False):
        base = g.loc[g["world_size"].idxmin()]
        ideal = g["world_size"] / base["world_size"]
        speedup = g["samples_per_s"] / base["samples_per_s"]
        out.loc[g.index, "ideal_speedup"] = ideal
        out.loc[g.index, "speedup"] = speedup
        out.loc[g.index, "efficiency_pct"] = 100 * speedup / ideal
    return out
