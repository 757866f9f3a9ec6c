"""The verification stage, ``--verify K``: the K best configurations a plan for this machine
predicts (and DDP at its defaults), run here in one launch, interleaved: each built once, then
timed one step of each per cycle in a fresh random order (the sweep's cohorts,
``bench/runner/train/cycles.py``), so that what the machine does meanwhile falls on all of
them alike; one launch each would measure each in its own state of the machine
(docs/benchmarks.md, "The calibration"). Measured against predicted: step time and peak memory
side by side in ``verify.csv``, Spearman's rank correlation of the steps, and whether the
measured best is the predicted best or tied with it (the paired comparison of their cycles,
``bench.stats.paired``). The launch is a run folder under ``DIR/verify/``.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

import pandas as pd
from scipy import stats

from bench.plan.calibration import CALIBRATION
from bench.plan.launch import describe, launch_points, role, timing
from bench.plan.request import PlanRequest
from bench.runfolder.points import RunFolderError, read_points
from bench.runfolder.schema import read_results, read_samples
from bench.stats.paired import DECIDED, look_confidence, versus_best_paired

DEFAULT_DDP = {"config": "ddp bucket 25 MB", "precision": "fp32", "activation_checkpointing": "off"}
# The verification's configurations are one verdict's candidates (``racing.py``).
VERDICT_GROUP = "plan verification"
# Each verified configuration's timing budget: its seconds of interleaved cycles.
POINT_SECONDS = 6.0  # --launch-seconds sets another


# What a row says beyond its name: two rows alike in all of these the plan cannot distinguish
# (DDP's bucket sizes where the model's gradients fill one bucket of each: the same schedule,
# step and memory), and timing both would measure only the machine's noise.
DISTINGUISHING = (
    "family",
    "strategy",
    "impl",
    "tp_degree",
    "activation_checkpointing",
    "precision",
    "micro_batch",
    "grad_accum",
    "pp_degree",
    "pp_schedule",
    "pp_microbatches",
    "step_ms",
    "peak_mem_gib",
)


def picks(rows: pd.DataFrame, k: int) -> pd.DataFrame:
    """The first ``k`` fitting, timed rows (the plan's ranking) that differ in what the plan
    predicts (``DISTINGUISHING``: of rows alike, the first is verified for them all, or DDP at
    its defaults where it is one of them), and DDP at its defaults (25 MB buckets, fp32, no
    checkpointing, no accumulation) where it is not among them: the calibration's own point,
    whose two launches give their drift (``launch_drift``). A row this checkout cannot run
    (its ``cannot_run``) is not verified."""
    ok = rows[rows["fits"] & rows["step_ms"].notna()]
    if "cannot_run" in ok:
        ok = ok[ok["cannot_run"].fillna("").astype(str).eq("")]
    default = ok[
        (ok["config"] == DEFAULT_DDP["config"])
        & (ok["precision"] == DEFAULT_DDP["precision"])
        & (ok["activation_checkpointing"] == DEFAULT_DDP["activation_checkpointing"])
        & (ok["grad_accum"] == 1)
    ].index[:1]
    alike = ok[[c for c in DISTINGUISHING if c in ok.columns]].astype(str).apply(tuple, axis=1)
    verified_as = {alike[i]: i for i in default}
    chosen, picked = [], set()
    for i in ok.index:
        if len(chosen) == k:
            break
        if alike[i] not in picked:
            picked.add(alike[i])
            chosen.append(verified_as.get(alike[i], i))
    chosen += [i for i in default if i not in chosen]
    return ok.loc[chosen]


def _run_args(row: pd.Series) -> list[str]:
    """The row's ``bench/run.py`` arguments, as its command gives them."""
    args = shlex.split(row["command"])
    return args[args.index("bench/run.py") + 1 :]


def _launch(chosen: pd.DataFrame, world: int, out: Path, timeout_s: float, seconds: float) -> str:
    """The chosen rows' points (each as its command resolves it) in one launch of ``world``
    ranks here, raced as one cohort whatever their implementations: "" when it ran, else why
    not, in one line."""
    named = [
        (f"v{i:02d}", describe(row), [*_run_args(row), *timing(seconds, traced=1)])
        for i, (_, row) in enumerate(chosen.iterrows(), 1)
    ]
    return launch_points(named, world, out, VERDICT_GROUP, timeout_s)


def _measured(out: Path, n: int, failure: str) -> list[dict]:
    """Each chosen row's step and peak from the launch's results.csv (in order), or its error."""
    results = out / "results.csv"
    if failure or not results.is_file():
        return [{"measured_status": "error", "measured_error": failure or "no results.csv"}] * n
    try:
        df = read_results(out).astype(object).fillna("").drop_duplicates("point", keep="last")
    except RunFolderError as e:
        return [{"measured_status": "error", "measured_error": str(e)}] * n
    by = {role(r["point"]): r for r in df.to_dict("records")}
    num = lambda r, c: float(r[c]) if r.get(c, "") != "" else math.nan  # noqa: E731
    got = []
    for i in range(1, n + 1):
        r = by.get(f"v{i:02d}")
        if r is None:
            got.append({"measured_status": "error", "measured_error": "not measured"})
            continue
        got.append(
            {
                "point": r["point"],
                "measured_status": r["status"],
                "measured_error": r.get("error", ""),
                "measured_step_ms": num(r, "step_ms_median"),
                "measured_step_ms_ci_low": num(r, "step_ms_ci_low"),
                "measured_step_ms_ci_high": num(r, "step_ms_ci_high"),
                "measured_peak_mib": num(r, "peak_mem_mb"),
                "measured_recompute_flops_per_step": num(r, "recompute_flops_per_step"),
                # a pipeline's, each rank's (its stage's), where the run measured them
                **(
                    {"measured_stage_peaks_mib": r["pp_peak_mem_by_rank_mb"]}
                    if r.get("pp_peak_mem_by_rank_mb", "") != ""
                    else {}
                ),
                "stop": r.get("stop", ""),
                "run_dir": str(out),
            }
        )
    return got


def verify(
    rows: pd.DataFrame, request: PlanRequest, out: Path, timeout_s: float = 600.0, progress=print
) -> tuple[pd.DataFrame, dict]:
    """(verify.csv's rows, the summary): the ``request.verify`` picks timed in one launch of
    its world size here, each one's memory measured there on a build of its own (as a point's
    is: the others' do not count)."""
    chosen, world = picks(rows, request.verify), request.world_size
    progress(f"verify: {len(chosen)} configurations, interleaved in one launch of {world} ranks")
    folder = out / "verify"
    seconds = request.launch_seconds or POINT_SECONDS
    measured = _measured(folder, len(chosen), _launch(chosen, world, folder, timeout_s, seconds))
    table = []
    for (_, row), got in zip(chosen.iterrows(), measured, strict=True):
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
                "predicted_recompute_flops_per_step": row.get("recompute_flops_per_step"),
                **_stage_peaks(row),
                **got,
                "command": row["command"],
            }
        )
    df = pd.DataFrame(table)
    got = summary(df, _cycles(folder, df))
    drift = launch_drift(out / CALIBRATION, folder)
    if drift and "point" in df:
        # the model's own error where it was fitted: its prediction against the launch it was
        # fitted to, apart from the drift to this one
        predicted = df.loc[df["point"] == drift["launch_drift_point"], "predicted_step_ms"]
        if len(predicted) == 1:
            drift["calibration_predicted_ms"] = ms = float(predicted.iloc[0])
            drift["calibration_error_pct"] = 100 * (ms / drift["launch_drift_ms"][0] - 1)
    got.update(drift)
    return df, got


def _stage_peaks(row: pd.Series) -> dict:
    """A pipeline row's tracked stages' peaks ("0:9.7;1:12.4", MiB), beside the measured."""
    peaks = row.get("stage_peaks_mib")
    return {"predicted_stage_peaks_mib": peaks} if isinstance(peaks, str) and peaks else {}


def launch_drift(calibration: Path, verification: Path) -> dict:
    """The calibration's own configuration measured again by the verification: the point of
    the calibration launch (``calibration.calibration_points``) whose model,
    strategy, implementation, knobs, batch and ranks a verified point has, and its step in each
    launch. Its change is the two launches' drift, which every row's error holds, not the
    model's (docs/benchmarks.md, "The calibration"): ``launch_drift_pct``, empty where no
    verified point is it (a plan given ``--compute``, or narrowed away from DDP at its
    defaults)."""
    try:
        there = read_points(calibration)
        here = read_points(verification)
        steps = {folder: read_results(folder) for folder in (calibration, verification)}
    except (RunFolderError, OSError):
        return {}

    def same(p) -> tuple:
        knobs = sorted(p.knobs.items())
        return (p.model, p.strategy, p.impl, knobs, p.batch_per_replica, p.world_size)

    def step(folder: Path, point: str) -> float:
        df = steps[folder]
        rows = df[(df["point"] == point) & (df["status"] == "ok")]
        return float(rows["step_ms_median"].iloc[-1]) if not rows.empty else math.nan

    for p in there.values():
        match = [q for q in here.values() if same(q) == same(p)]
        if not match:
            continue
        before, after = step(calibration, p.id), step(verification, match[0].id)
        if before > 0 and after > 0:
            return {
                "launch_drift_pct": 100 * (after / before - 1),
                "launch_drift_ms": [before, after],
                "launch_drift_point": match[0].id,
            }
    return {}


def _cycles(folder: Path, df: pd.DataFrame) -> dict[str, list[float]]:
    """Each measured configuration's step per cycle (its samples in order: sample i of each
    shares cycle i), by its ``name``; empty where the launch left no samples."""
    if not (folder / "samples.csv").is_file() or "point" not in df:
        return {}
    try:
        samples = read_samples(folder).sort_values("index")
    except RunFolderError:
        return {}
    ok = df[df["measured_status"] == "ok"]
    return {
        r["name"]: samples.loc[samples["point"] == r["point"], "ms"].tolist()
        for _, r in ok.iterrows()
    }


def summary(df: pd.DataFrame, cycles: dict[str, list[float]] | None = None) -> dict:
    """Errors of the predictions, Spearman's rho of the steps and whether the measured best
    is the predicted best or tied with it: by the paired comparison of their ``cycles`` (name
    -> step per cycle) where every measured row has them, else by their intervals' overlap."""
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
        # A rank correlation needs an order on both sides: three DDP bucket sizes the cost
        # model prices alike (llama:tiny at 2 ranks) have none, and scipy returns NaN with a
        # warning on the console.
        equal = [c for c in ("predicted", "measured") if ok[f"{c}_step_ms"].nunique() < 2]
        if equal:
            out["spearman_undefined"] = f"the {equal[0]} steps are all equal"
        else:
            rho, p = stats.spearmanr(ok["predicted_step_ms"], ok["measured_step_ms"])
            out["spearman_rho"], out["spearman_p"] = float(rho), float(p)
    predicted = ok.loc[ok["predicted_step_ms"].idxmin()]
    out["predicted_best"] = predicted["name"]
    names = list(ok["name"])
    if len(ok) >= 2 and cycles and all(len(cycles.get(n, ())) >= 2 for n in names):
        v = _paired(ok, {n: cycles[n] for n in names})
        out["measured_best"], out["method"], out["cycles"] = v.best, "paired", v.cycles
        out["measured_tied"] = list(v.tied)
        out["predicted_best_is_best_or_tied"] = predicted["name"] in v.tied
        for i, r in ok.iterrows():
            ratio = v.ratios.get(r["name"])
            if ratio is not None:  # its step over the measured best's, per cycle, 95 %
                cols = ["ratio_to_best", "ratio_low", "ratio_high"]
                df.loc[i, cols] = [ratio.ratio, ratio.low, ratio.high]
        return out
    best = ok.loc[ok["measured_step_ms"].idxmin()]
    overlap = (
        predicted["measured_step_ms_ci_low"] <= best["measured_step_ms_ci_high"]
        and best["measured_step_ms_ci_low"] <= predicted["measured_step_ms_ci_high"]
    )
    out["measured_best"], out["method"] = best["name"], "intervals"
    out["predicted_best_is_best_or_tied"] = bool(best.name == predicted.name or overlap)
    return out


def _paired(ok: pd.DataFrame, cycles: dict[str, list[float]]):
    """The paired verdict over the configurations' cycles, each comparison at the confidence
    of the look its candidate left the cycles at (decided early) or of the last."""
    stops = dict(zip(ok["name"], ok.get("stop", pd.Series("", index=ok.index)), strict=True))
    confidence = {n: look_confidence(len(t), stops.get(n) == DECIDED) for n, t in cycles.items()}
    v = versus_best_paired(cycles, confidence)
    if not any(r.high < 1 for r in v.ratios.values()):
        return v
    # One that left the cycles early is faster than the best of those that cycled longest. The
    # verification's configurations race as one group (``VERDICT_GROUP``), where one leaves
    # only decided against the best of its look; a folder written before they did raced each
    # implementation's apart, where a configuration of another could leave once its own group
    # was decided. Compared over the cycles every one of them ran (each the first ones), at
    # the last look's confidence.
    shared = min(len(t) for t in cycles.values())
    return versus_best_paired(
        {n: t[:shared] for n, t in cycles.items()}, look_confidence(shared, False)
    )
