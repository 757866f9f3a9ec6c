"""What a run's MFU figures are against, in one line for the report and the console."""

from __future__ import annotations

import pandas as pd

from bench.runfolder import peaks


def mfu_note(df: pd.DataFrame) -> str:
    """What the rows' ``mfu_pct`` is against: each peak the run used and its figure (the
    median over the rows using it), and the peaks a row's rate exceeded (no ``mfu_pct`` there:
    such a peak cannot be right); empty for a run folder without these columns."""
    if "peak_source" not in df or df["peak_source"].isna().all():
        return ""
    rows = df.dropna(subset=["peak_source"])
    wrong = rows["peak_source"].astype(str).str.startswith(peaks.IMPOSSIBLE)
    note = ""
    if (~wrong).any():
        note = "; mfu_pct: model FLOPs utilisation against " + _peaks_used(rows[~wrong])
    if wrong.any():
        unprefixed = rows[wrong].assign(
            peak_source=rows.loc[wrong, "peak_source"].str.removeprefix(peaks.IMPOSSIBLE)
        )
        note += (
            "; no mfu_pct where the model computed faster than its peak, which cannot be "
            "right: " + _peaks_used(unprefixed)
        )
    return note


def _peaks_used(rows: pd.DataFrame) -> str:
    used = rows.groupby("peak_source", sort=False)["peak_tflops"].median()
    return ", ".join(f"{source} = {tflops:.3g} TFLOP/s" for source, tflops in used.items())
