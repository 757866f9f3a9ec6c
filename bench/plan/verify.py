"""``--verify K``: the K best configurations a plan for this machine predicts (and DDP at its
defaults), each run here by ``bench/run.py`` (its row's own command, one launch each, a run
folder each under ``DIR/verify/``), measured against predicted: step time and peak memory
side by side in ``verify.csv``, Spearman's rank correlation of the steps, and whether the
measured best is the predicted best or tied with it (their measured 95 % intervals overlap).
"""

from __future__ import annotations

import math
import shlex
import subprocess
from pathlib import Path

import pandas as pd
from scipy import stats

from bench.plan.launch import describe, run_bench

DEFAULT_DDP = {"config": "ddp bucket 25 MB", "precision": "fp32", "activation_checkpointing": "off"}
# Each verified point's timing budget: the harness stops earlier once its median is known to 2 %.
BUDGET = ["--max-point-s", "6", "--rounds", "1", "--warmup-steps", "3", "--profile-steps", "1"]


def picks(rows: pd.DataFrame, k: int) -> pd.DataFrame:
    """The first ``k`` fitting, timed rows (the plan's ranking) and DDP at its defaults (25 MB
    buckets, fp32, no checkpointing, no accumulation) where it is not among them."""
    ok = rows[rows["fits"] & rows["step_ms"].notna()]
    chosen = ok.head(k)
    default = ok[
        (ok["config"] == DEFAULT_DDP["config"])
        & (ok["precision"] == DEFAULT_DDP["precision"])
        & (ok["activation_checkpointing"] == DEFAULT_DDP["activation_checkpointing"])
        & (ok["grad_accum"] == 1)
    ]
    if not default.empty and default.index[0] not in chosen.index:
        chosen = pd.concat([chosen, default.head(1)])
    return chosen


def _command(row: pd.Series, world: int, out: Path) -> list[str]:
    """The row's ``bench/run.py`` arguments, launched here on ``world`` ranks, into ``out``."""
    args = shlex.split(row["command"])
    args = args[args.index("bench/run.py") + 1 :]
    return [
        *args,
        "--nproc-per-node",
        str(world),
        "--out",
        str(out),
        "--no-report",
        "--interleave",
        "off",
        *BUDGET,
    ]


def run_one(row: pd.Series, world: int, out: Path, timeout_s: float) -> dict:
    """The configuration measured: its results row's step and peak, or its error."""
    try:
        failure = run_bench(_command(row, world, out), timeout_s)
    except subprocess.TimeoutExpired:
        return {"measured_status": "error", "measured_error": f"timed out after {timeout_s:g} s"}
    results = out / "results.csv"
    if failure or not results.is_file():
        return {"measured_status": "error", "measured_error": failure or "no results.csv"}
    r = pd.read_csv(results, keep_default_na=False).iloc[0]
    num = lambda c: float(r[c]) if c in r and r[c] != "" else math.nan  # noqa: E731
    return {
        "measured_status": r["status"],
        "measured_error": r.get("error", ""),
        "measured_step_ms": num("step_ms_median"),
        "measured_step_ms_ci_low": num("step_ms_ci_low"),
        "measured_step_ms_ci_high": num("step_ms_ci_high"),
        "measured_peak_mib": num("peak_mem_mb"),
        "run_dir": str(out),
    }


def verify(
    rows: pd.DataFrame, k: int, world: int, out: Path, timeout_s: float = 600.0, progress=print
) -> tuple[pd.DataFrame, dict]:
    """(verify.csv's rows, the summary): each pick run and compared."""
    chosen = picks(rows, k)
    table = []
    for i, (_, row) in enumerate(chosen.iterrows()):
        progress(f"verify {i + 1}/{len(chosen)}: {describe(row)}")
        got = run_one(row, world, out / "verify" / f"{i + 1:02d}", timeout_s)
        table.append(
            {
                "rank": row["rank"],
                "config": row["config"],
                "name": describe(row),
                "activation_checkpointing": row["activation_checkpointing"],
                "precision": row["precision"],
                "micro_batch": row["micro_batch"],
                "grad_accum": row["grad_accum"],
                "predicted_step_ms": row["step_ms"],
                "predicted_peak_mib": 1024 * row["peak_mem_gib"],
                **got,
                "command": row["command"],
            }
        )
    df = pd.DataFrame(table)
    return df, summary(df)


def summary(df: pd.DataFrame) -> dict:
    """Errors of the predictions, Spearman's rho of the steps and whether the measured best
    is the predicted best or tied with it."""
    ok = df[df["measured_status"] == "ok"].copy() if "measured_status" in df else df.iloc[:0]
    out: dict = {"verified": len(ok), "failed": len(df) - len(ok)}
    if ok.empty:
        return out
    ok["step_error_pct"] = 100 * (ok["predicted_step_ms"] / ok["measured_step_ms"] - 1)
    ok["peak_error_pct"] = 100 * (ok["predicted_peak_mib"] / ok["measured_peak_mib"] - 1)
    df.loc[ok.index, "step_error_pct"] = ok["step_error_pct"]
    df.loc[ok.index, "peak_error_pct"] = ok["peak_error_pct"]
    out["step_median_abs_error_pct"] = float(ok["step_error_pct"].abs().median())
    out["peak_max_abs_error_pct"] = float(ok["peak_error_pct"].abs().max())
    if len(ok) >= 3:
        rho, p = stats.spearmanr(ok["predicted_step_ms"], ok["measured_step_ms"])
        out["spearman_rho"], out["spearman_p"] = float(rho), float(p)
    best = ok.loc[ok["measured_step_ms"].idxmin()]
    predicted = ok.loc[ok["predicted_step_ms"].idxmin()]
    overlap = (
        predicted["measured_step_ms_ci_low"] <= best["measured_step_ms_ci_high"]
        and best["measured_step_ms_ci_low"] <= predicted["measured_step_ms_ci_high"]
    )
    out["measured_best"] = best["name"]
    out["predicted_best"] = predicted["name"]
    out["predicted_best_is_best_or_tied"] = bool(best.name == predicted.name or overlap)
    return out
