"""Measured against predicted, for every ok point of training runs (``predict.py``), and where
the model misses, which term the traces say is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench.model.comm import CommModel, fit_rows
from bench.model.predict import predict_run
from bench.model.runs import check_compatible, read_collectives_runs, read_training_runs

MISS_PCT = 15.0  # the goal: median absolute step-time error within this
# What a reader compares, per point (the command line's table and the report's).
POINT_COLUMNS = [
    "point",
    "measured_step_ms",
    "measured_window_ms",
    "predicted_step_ms",
    "step_error_pct",
    "measured_exposed_comm_ms",
    "predicted_exposed_comm_ms",
    "measured_overlap_pct",
    "predicted_overlap_pct",
    "compute_source",
    "note",
    "diagnosis",
]


def diagnose(r: pd.Series) -> str:
    """For a point predicted more than MISS_PCT off, the term the traces disagree with most,
    in ms per step: the collectives' cost (traced transfer, each call once its last rank had
    joined, against the fitted cost), waiting for the slowest rank (which the model has only as
    the per-step maximum of the ranks' computation), or the computation and the rest."""
    err = r["step_error_pct"]
    if not np.isfinite(err) or abs(err) <= MISS_PCT:
        return ""
    gaps = {
        "collectives": r["traced_transfer_ms"] - r["predicted_comm_ms"],
        "waiting for the slowest rank": r["traced_wait_ms"],
        "computation and the rest": (r["measured_step_ms"] - r["measured_exposed_comm_ms"])
        - (r["predicted_step_ms"] - r["predicted_exposed_comm_ms"]),
    }
    gaps = {k: v for k, v in gaps.items() if np.isfinite(v)}
    if not gaps:
        return ""
    term = max(gaps, key=lambda k: abs(gaps[k]))
    if term == "collectives":
        return (
            f"collectives: traced {r['traced_transfer_ms']:.1f} ms per step, fitted "
            f"{r['predicted_comm_ms']:.1f} ms"
        )
    if term == "waiting for the slowest rank":
        return f"waiting for the slowest rank: {r['traced_wait_ms']:.1f} ms per step"
    return f"computation and the rest: {gaps[term]:+.1f} ms per step against the model"


def bucket_choices(points: pd.DataFrame) -> pd.DataFrame:
    """Per bucket_cap_mb sweep, model and implementation: the measured best bucket size, the
    predicted best, and whether the predicted one is within the measured spread of the best
    (its p10..p90 step times overlap the best's)."""
    rows = []
    b = points[(points["sweep"] == "bucket_cap_mb") & points["predicted_step_ms"].notna()]
    for (run, model, impl), g in b.groupby(["run", "model", "impl"]):
        best = g.loc[g["measured_step_ms"].idxmin()]
        pick = g.loc[g["predicted_step_ms"].idxmin()]
        rows.append(
            {
                "run": run,
                "model": model,
                "impl": impl,
                "measured_best": best["value"],
                "predicted_best": pick["value"],
                "within_spread": bool(
                    pick["value"] == best["value"]
                    or pick["measured_step_ms_p10"] <= best["measured_step_ms_p90"]
                ),
            }
        )
    return pd.DataFrame(rows)


def validate(collectives: list[Path], training: list[Path]) -> tuple[CommModel, pd.DataFrame]:
    meta, df = read_collectives_runs(collectives)
    runs = read_training_runs(training)
    check_compatible(meta, collectives[0], runs)
    comm = fit_rows(
        df,
        backend=meta["backend"],
        host=meta.get("host", ""),
        source=", ".join(map(str, collectives)),
    )
    rows = [predict_run(r.path, r.meta, r.ok, comm, r.points) for r in runs]
    points = pd.concat(rows, ignore_index=True)
    points["diagnosis"] = points.apply(diagnose, axis=1) if len(points) else []
    return comm, points


def median_abs_error(points: pd.DataFrame, column: str = "step_error_pct") -> float:
    err = points[column].abs().dropna()
    return float(err.median()) if len(err) else float("nan")
