"""The critical path in the report: each point's path communication share (a column of the
points' table) and the path drawn on the step timelines (``timeline_section``).

Read from the run folder's traces (``traces/<point>/``) with ``bench.analysis.critical_path``;
a point whose path cannot be made (ranks whose calls differ, no profiler step) has no figure,
and the rest of the report stands.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from bench.analysis.critical_path import folder_paths, path_bars, trace_paths
from bench.analysis.critical_what_if import best_changes
from bench.runfolder.schema import Run


def path_comm_pct(run: Run, points: pd.Series) -> pd.Series:
    """Per point: the median over its profiled steps of the communication on the critical path
    (communication after the last member arrived), % of the path; NaN where none is made."""
    out = []
    for point in points:
        try:
            paths, _ = folder_paths(run.path / "traces" / str(point))
            out.append(float(np.median([sp.summary["comm_share_pct"] for sp in paths])))
        except Exception:  # noqa: BLE001  (a trace we misread costs a figure, not the report)
            out.append(math.nan)
    return pd.Series(out, index=points.index)


def with_path_shares(run: Run, df: pd.DataFrame) -> pd.DataFrame:
    """The points' table with ``path_comm_pct`` for the points that ran."""
    ok = df["status"] == "ok" if "status" in df else pd.Series(False, index=df.index)
    if "point" in df and ok.any():
        df = df.copy()
        df.loc[ok, "path_comm_pct"] = path_comm_pct(run, df.loc[ok, "point"])
    return df


def with_path(timeline: pd.DataFrame, traces: list) -> pd.DataFrame:
    """The step timeline with its step's critical path as bars of lane ``path`` (unchanged
    where no path is made)."""
    if timeline.empty or "origin_us" not in timeline.attrs:
        return timeline
    try:
        (sp,) = trace_paths(traces, [int(timeline["step"].iloc[0])])
    except Exception:  # noqa: BLE001  (a trace we misread costs a figure, not the report)
        return timeline
    out = pd.concat([timeline, path_bars(sp, timeline.attrs["origin_us"])], ignore_index=True)
    out.attrs = {**timeline.attrs, "critical_path": _path_line(sp)}
    return out


def _path_line(sp) -> str:
    """One line: the path's length and split, and the three changes that would save most."""
    s = sp.summary
    length = s["length_us"]
    parts = ", ".join(
        f"{c} {100 * v / length:.0f} %"
        for c, v in sorted(s["categories_us"].items(), key=lambda kv: -kv[1])
        if v >= 0.01 * length
    )
    best = best_changes(sp.graph)
    saves = "; ".join(
        f"{r.what_if} {r.saves_us / 1e3:.2f} ms ({r.saves_pct:.0f} %)"
        for r in best.itertuples()
        if r.saves_us > 0
    )
    line = (
        f"Critical path of step {s['step']}: {length / 1e3:.2f} ms, {parts}; the work of rank "
        f"{s['setting_rank']} sets it."
    )
    return line + (f" Would save the most: {saves}." if saves else "")
