"""The report's "Where MFU goes": each point's traced step from the device's peak down to the
achieved MFU, one stacked bar per point and a table of the parts in ms and % of the step.

Read from results.csv's ``wf_*`` columns (the MFU waterfall of the point's traced steps,
bench/runner/measure/waterfall_columns.py; docs/analysis.md "The MFU waterfall"), never from
the traces: the section is as offline as the rest of the page. The ``ideal`` part (the step's
FLOPs at the peak of the roofline in ``wf_profile``) is the achieved MFU's share; every other
part is time the step lost to it. Where the waterfall could not price the matmuls (no shapes,
no profile) their time is one unsplit part, and the section says which points and why; a point
without the columns (a folder before schema 2.15, a waterfall that failed) has no bar, and the
section says so.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from bench.report.charts import Part, png, point_label, stacked_by_model
from bench.report.tables import html_table

# (column, label, colour) of each part, in the bar's order: the achieved share first, then the
# losses. ``wf_matmul_ms`` is drawn only where the split into ideal and loss is not priced.
PARTS = (
    ("wf_ideal_ms", "ideal: FLOPs at the peak (the achieved MFU)", "#2e7d32"),
    ("wf_matmul_loss_ms", "matmul/attention/conv below the peak", "#4a7fb5"),
    ("wf_matmul_ms", "matmul/attention/conv, not priced", "#a9c4e0"),
    ("wf_memory_bound_ms", "memory-bound ops", "#9d7cc1"),
    ("wf_recompute_ms", "recomputation", "#f2c14e"),
    ("wf_optimizer_ms", "optimizer step", "#8cc084"),
    ("wf_exposed_comm_ms", "exposed communication", "#e07b53"),
    ("wf_idle_ms", "idle", "#c8c8c8"),
    ("wf_other_ms", "other (outside any op)", "#6b6b6b"),
)
COLUMNS = [col for col, _, _ in PARTS]


def waterfall_parts(g: pd.DataFrame) -> pd.DataFrame:
    """The bar's parts in ms, one column per ``PARTS`` column, which add up to the traced
    step: the unsplit matmul time only where ideal is not priced, every other empty cell 0."""
    parts = pd.DataFrame({col: g[col] for col in COLUMNS}, index=g.index)
    priced = parts["wf_ideal_ms"].notna()
    parts["wf_matmul_ms"] = parts["wf_matmul_ms"].where(~priced, 0.0)
    return parts.fillna(0.0).astype(float)


def has_waterfall(df: pd.DataFrame) -> pd.Series:
    """Which rows have a waterfall: any part measured."""
    present = [c for c in COLUMNS if c in df]
    if not present:
        return pd.Series(False, index=df.index)
    return df[present].notna().any(axis=1)


def waterfall_figure(ok: pd.DataFrame) -> str:
    """A stacked horizontal bar per point, ideal first, each labelled with its MFU; one panel
    per model, each on its own scale."""

    def parts(g: pd.DataFrame) -> list[Part]:
        ms = waterfall_parts(g)
        return [(label, ms[col], color) for col, label, color in PARTS]

    def mfu(g: pd.DataFrame) -> list[str]:
        return ["MFU not priced" if np.isnan(v) else f"MFU {v:.1f} %" for v in _mfu_pct(g)]

    xlabel = "ms per traced step (mean over steps and ranks)"
    return png(
        stacked_by_model(ok, parts, xlabel, mfu),
        "Where MFU goes: each point's traced step, from its FLOPs at the device's peak (the "
        "achieved MFU's share) through what it lost to the peak: matmuls below it, memory-bound "
        "ops, recomputation, the optimizer, exposed communication, idle and other time, stacked.",
    )


def _mfu_pct(g: pd.DataFrame) -> pd.Series:
    """The waterfall's MFU: ideal over the traced step (the parts' sum), NaN where unpriced."""
    step = waterfall_parts(g).sum(axis=1)
    return 100 * g["wf_ideal_ms"] / step.where(step > 0)


def waterfall_table(ok: pd.DataFrame) -> pd.DataFrame:
    """Per point: the traced step, each part as "ms (% of the step)", empty where not
    measured or not priced, and the MFU."""
    parts = waterfall_parts(ok)
    step = parts.sum(axis=1)
    out = pd.DataFrame({"point": [point_label(r) for r in ok.itertuples()]}, index=ok.index)
    out["step ms"] = step
    for col, label, _ in PARTS:
        shown = ok[col].where(ok["wf_ideal_ms"].isna()) if col == "wf_matmul_ms" else ok[col]
        out[label] = [
            "" if pd.isna(ms) else f"{ms:.2f} ({100 * ms / s:.1f} %)"
            for ms, s in zip(shown, step, strict=True)
        ]
    out["MFU %"] = _mfu_pct(ok)
    return out


def waterfall_sections(ok: pd.DataFrame) -> list[str]:
    """The section: the figure and the table of the points that have a waterfall, and which
    points have empty cells and why; one line where no point has one."""
    parts = ["<h2>Where MFU goes</h2>"]
    drawn = has_waterfall(ok)
    if not drawn.any():
        why = (
            "its results.csv has no wf_* columns (a run folder before schema 2.15)"
            if not any(c in ok for c in COLUMNS)
            else "every point's wf_* cells are empty"
        )
        return [*parts, f"<p class='note'>No MFU waterfall: {html.escape(why)}.</p>"]
    ok = ok.assign(**{c: ok.get(c, np.nan) for c in (*COLUMNS, "wf_profile", "wf_unpriced")})
    g = ok[drawn]
    caption = (
        "The MFU waterfall of each point's traced steps (ms per step, % of the step; mean over "
        "the steps and ranks): the parts add up to the step" + _profiles(g)
    )
    table = waterfall_table(g)
    parts += [waterfall_figure(g), html_table(table, list(table.columns), caption)]
    empty = _empty_note(ok, drawn)
    return parts + ([f"<p class='note'>{html.escape(empty)}</p>"] if empty else [])


def _profiles(g: pd.DataFrame) -> str:
    used = [p for p in dict.fromkeys(g["wf_profile"].dropna()) if str(p)]
    return f"; priced on {', '.join(map(str, used))}" if used else "; no roofline"


def _empty_note(ok: pd.DataFrame, drawn: pd.Series) -> str:
    """Which points have empty cells: no waterfall at all, or matmuls not priced, and why."""
    notes = []
    missing = ok[~drawn]
    if len(missing):
        labels = ", ".join(point_label(r) for r in missing.itertuples())
        notes.append(f"No waterfall (empty wf_* cells) for {labels}.")
    unpriced = ok[drawn & ok["wf_ideal_ms"].isna()]
    for why, rows in unpriced.groupby(unpriced["wf_unpriced"].fillna(""), sort=False):
        labels = ", ".join(point_label(r) for r in rows.itertuples())
        reason = f": {why}" if why else ""
        notes.append(f"Matmuls not split into ideal and loss (empty cells) for {labels}{reason}.")
    return " ".join(notes)
