"""Measured against predicted, for every ok point of training runs (``predict.py``), and where
the model misses, which term the traces say is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from bench.model.comm import CommModel
from bench.model.predict import predict_run
from bench.model.runs import check_compatible, read_collectives_runs, read_training_runs

MISS_PCT = 15.0  # the goal: median absolute step-time error within this


def diagnose(r: pd.Series) -> str:
    """For a point predicted more than MISS_PCT off: the term whose traced value is furthest
    from the model's, in ms (communication as traced vs modelled, or the rest of the step)."""
    err = r["step_error_pct"]
    if not np.isfinite(err) or abs(err) <= MISS_PCT:
        return ""
    comm_gap = r["predicted_comm_ms"] - r["measured_comm_ms"]
    rest_gap = (r["predicted_step_ms"] - r["predicted_exposed_comm_ms"]) - (
        r["measured_step_ms"] - r["measured_exposed_comm_ms"]
    )
    if abs(comm_gap) >= abs(rest_gap):
        return (
            f"communication: traced {r['measured_comm_ms']:.1f} ms, modelled "
            f"{r['predicted_comm_ms']:.1f} ms"
        )
    rest = r["measured_step_ms"] - r["measured_exposed_comm_ms"]
    modelled = r["predicted_step_ms"] - r["predicted_exposed_comm_ms"]
    return f"computation and the rest: measured {rest:.1f} ms, modelled {modelled:.1f} ms"


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
    from bench.model.comm import fit_rows

    meta, df = read_collectives_runs(collectives)
    runs = read_training_runs(training)
    check_compatible(meta, collectives[0], runs)
    comm = fit_rows(
        df,
        backend=meta["backend"],
        host=meta.get("host", ""),
        source=", ".join(map(str, collectives)),
    )
    points = pd.concat([predict_run(d, m, ok, comm) for d, m, ok in runs], ignore_index=True)
    points["diagnosis"] = points.apply(diagnose, axis=1) if len(points) else []
    return comm, points


def median_abs_error(points: pd.DataFrame) -> float:
    err = points["step_error_pct"].abs().dropna()
    return float(err.median()) if len(err) else float("nan")
