"""What changed between two points' traces, per collective and per top-level operator: calls
per step, time per step and bytes per step, A against B. HolisticTraceAnalysis's trace diff
(``hta/trace_diff.py``) compares two traces' kernels by name and count; this one compares what
a training step is made of on the host (the operators the step called directly: forward,
each backward function, the optimizer) and, on GPU traces, its kernels, next to its collective
calls with their bytes.

Figures are per rank and profiled step, averaged over the ranks and steps both traces hold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.analysis.trace import Trace, common_steps, host_steps, nesting_depth, prepared
from parallel_kernels.facts import op_name

DIFF_COLUMNS = [
    "kind",
    "name",
    "count_a",
    "count_b",
    "count_change",
    "time_ms_a",
    "time_ms_b",
    "time_ms_change",
    "bytes_a",
    "bytes_b",
    "bytes_change",
]


def _top_level(ev: pd.DataFrame) -> pd.DataFrame:
    """The host events each ``ProfilerStep#N`` contains directly (depth 1 on its thread)."""
    steps = ev[host_steps(ev)]
    if steps.empty:
        return ev.iloc[0:0]
    tid = steps["tid"].iloc[0]
    main = ev[(ev["tid"] == tid) & (ev["stream"] < 0) & (ev["step"] >= 0)]
    main = main.sort_values(["ts", "dur"], ascending=[True, False])
    ts = main["ts"].to_numpy(dtype=float)
    depth = nesting_depth(ts, ts + main["dur"].to_numpy(dtype=float))
    return main[(depth == 1) & ~host_steps(main)]  # the steps themselves are depth 0


def _parts(trace: Trace, steps: list[int]) -> pd.DataFrame:
    """One row per (kind, name) of one trace: calls, time (us) and bytes, summed over
    ``steps``."""
    ev = prepared(trace)
    ev = ev[ev["step"].isin(steps)]
    comm = ev[ev["kind"] == "comm"].assign(kind_="collective")
    comm["name_"] = comm["name"].astype(str).map(op_name)
    ops = _top_level(ev).assign(kind_="operator")
    ops["name_"] = ops["name"].astype(str)
    frames = [comm, ops]
    if trace.is_gpu:
        kernels = ev[(ev["stream"] >= 0) & (ev["kind"] != "comm")].assign(kind_="kernel")
        kernels["name_"] = kernels["name"].astype(str)
        frames.append(kernels)
    both = pd.concat(frames)
    if both.empty:
        return pd.DataFrame(columns=["kind", "name", "count", "time_us", "bytes"])
    g = both.groupby(["kind_", "name_"], observed=True)
    out = pd.DataFrame(
        {"count": g.size(), "time_us": g["dur"].sum(), "bytes": g["nbytes"].sum(min_count=1)}
    )
    return out.rename_axis(["kind", "name"]).reset_index()


def _per_step(traces: list[Trace]) -> pd.DataFrame:
    steps = common_steps(traces)
    if not steps:
        return pd.DataFrame(columns=["kind", "name", "count", "time_ms", "bytes"])
    parts = pd.concat([_parts(t, steps) for t in traces])
    per = len(steps) * len(traces)  # rank-steps
    g = parts.groupby(["kind", "name"])
    return pd.DataFrame(
        {
            "count": g["count"].sum() / per,
            "time_ms": g["time_us"].sum() / per / 1e3,
            "bytes": g["bytes"].sum(min_count=1) / per,
        }
    ).reset_index()


def trace_diff(a: list[Trace], b: list[Trace]) -> pd.DataFrame:
    """A row per collective, operator (and GPU kernel) name in either point (DIFF_COLUMNS):
    per rank and step in A and in B, and B - A; collectives first, then by the size of the
    time's change."""
    pa, pb = _per_step(a), _per_step(b)
    both = pa.merge(pb, on=["kind", "name"], how="outer", suffixes=("_a", "_b"))
    for col in ("count", "time_ms"):
        both[[f"{col}_a", f"{col}_b"]] = both[[f"{col}_a", f"{col}_b"]].fillna(0.0)
    both["count_change"] = both["count_b"] - both["count_a"]
    both["time_ms_change"] = both["time_ms_b"] - both["time_ms_a"]
    both["bytes_change"] = both["bytes_b"].fillna(0) - both["bytes_a"].fillna(0)
    both.loc[both["bytes_a"].isna() & both["bytes_b"].isna(), "bytes_change"] = np.nan
    order = {"collective": 0, "kernel": 1, "operator": 2}
    both = both.assign(_k=both["kind"].map(order), _t=-both["time_ms_change"].abs())
    return both.sort_values(["_k", "_t"])[DIFF_COLUMNS].reset_index(drop=True)
