"""TensorBoard scalars of a sweep, written next to its traces so the sweep itself can be browsed.

``traces/sweep_scalars/`` holds one event file: for every point, the headline metrics tagged
``<metric>/<model or collective>/<impl>``, with the swept value as the x axis (TensorBoard's
integer step; bucket sizes in KiB, message sizes in bytes). The profiler plugin ignores this
folder (no traces in it) and the scalars dashboard shows it as the run ``sweep_scalars``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from bench.runfolder.placement import cost_rows

TRAINING_METRICS = [
    "step_ms_median",
    "samples_per_s",
    "compute_comm_ratio",
    "overlap_pct",
    "exposed_comm_ms",
    "peak_mem_mb",
    "comm_bytes_per_step",
]
COLLECTIVE_METRICS = ["busbw_GBps", "algbw_GBps", "time_us"]
# How the swept value becomes TensorBoard's integer x axis.
X_AXIS = {"bucket_cap_mb": ("bucket size, KiB", lambda v: round(float(v) * 1024))}


def write_sweep_scalars(run_dir: Path, sweep: str, df: pd.DataFrame) -> Path:
    from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

    out = Path(run_dir) / "traces" / "sweep_scalars"
    ok = df[df["status"] == "ok"]
    collective = "collective" in df.columns
    if collective:  # one placement per size: each collective's cost rows
        ok = ok[cost_rows(ok)]
        label, to_x, metrics, series = "message size, bytes", int, COLLECTIVE_METRICS, "collective"
        x_col = "size_bytes"
    else:
        metrics, series, x_col = TRAINING_METRICS, "model", "value"
        if pd.api.types.is_numeric_dtype(df["value"]):
            label, to_x = X_AXIS.get(sweep, ("swept value", lambda v: round(float(v))))
        else:  # named values (sharding strategies): their position in the sweep
            names = list(dict.fromkeys(df["value"]))
            label = "position of the value in " + ", ".join(
                f"{i}: {n}" for i, n in enumerate(names)
            )
            to_x = names.index
    with SummaryWriter(str(out)) as w:
        w.add_text("sweep", f"Sweep `{sweep}`: the x axis (step) of every scalar is the {label}.")
        for row in ok.itertuples(index=False):
            r = row._asdict()
            for metric in metrics:
                v = r.get(metric)
                if v is None or (isinstance(v, float) and math.isnan(v)):
                    continue
                w.add_scalar(f"{metric}/{r[series]}/{r['impl']}", float(v), to_x(r[x_col]))
    return out
