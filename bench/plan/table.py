"""The plan on the console: the target, the ranked rows, the recommendation and what is tied
with it, and the verification's comparison (``outputs.py`` prints them)."""

from __future__ import annotations

import math
import time

import pandas as pd

from bench.plan.calibration import Target
from bench.plan.launch import describe
from bench.plan.request import PlanRequest

CONSOLE = {  # plan.csv column -> console heading
    "rank": "#",
    "config": "configuration",
    "activation_checkpointing": "ckpt",
    "precision": "prec",
    "compile": "compile",
    "micro_batch": "micro",
    "grad_accum": "accum",
    "peak_mem_gib": "peak GiB",
    "fits": "fits",
    "step_ms": "step ms",
    "matmul_ms": "matmul ms",
    "memory_bound_ms": "mem-bound ms",
    "exposed_comm_ms": "exposed comm ms",
    "samples_per_s": "samples/s",
    "mfu_pct": "MFU %",
}


def header(request: PlanRequest, target: Target, n: int) -> str:
    topo = target.topology
    return "\n".join(
        [
            f"plan: {request.model} on {request.world_size} x {target.device.name} "
            f"({target.device.memory_gib:g} GiB each, {request.gpus_per_node} per node), "
            f"global batch {request.global_batch}: {n} configurations",
            f"  links: {topo.about}",
            *(
                f"  computation {p}: "
                + ("op by op, " if r.pricing else f"{r.tflops:.3g} TFLOP/s, ")
                + r.source
                for p, r in target.rates.items()
            ),
            f"  memory: tracked under fake tensors + {target.allowance_gib:g} GiB allowance",
        ]
    )


def progress_printer(every_s: float = 10.0):
    """A progress callback that prints a line at most every ``every_s`` seconds."""
    last = [time.perf_counter()]

    def progress(i: int, n: int, c) -> None:
        now = time.perf_counter()
        if now - last[0] >= every_s:
            last[0] = now
            print(f"  {i}/{n} builds tracked ({c.label})", flush=True)

    return progress


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return "-" if math.isnan(v) else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def tied(rows: pd.DataFrame, tie_pct: float) -> pd.DataFrame:
    """The fitting rows whose predicted step is within ``tie_pct`` of the best's."""
    ok = rows[rows["fits"] & rows["step_ms"].notna()] if "step_ms" in rows else rows.iloc[:0]
    if ok.empty:
        return ok
    best = ok["step_ms"].min()
    return ok[ok["step_ms"] <= best * (1 + tie_pct / 100)]


QUIET = {"compile": "off"}  # a column shown only where some row holds another value


def render(rows: pd.DataFrame, top: int, tie_pct: float) -> str:
    cols = [c for c in CONSOLE if c in rows and not (rows[c] == QUIET.get(c, object())).all()]
    shown = rows.head(top)[cols].rename(columns=CONSOLE)
    lines = [shown.to_string(index=False, formatters={c: _fmt for c in shown.columns})]
    near = tied(rows, tie_pct)
    if near.empty:
        lines.append("no configuration is predicted to fit and run")
    else:
        best = near.iloc[0]
        lines.append(
            f"recommended: {describe(best)}: {best['step_ms']:.1f} ms per step, "
            f"{best['peak_mem_gib']:.2f} GiB peak per rank"
        )
        others = len(near) - 1
        lines.append(
            f"  tied with it (within {tie_pct:g} %, the prediction's error): {others} other "
            f"configuration{'' if others == 1 else 's'}"
        )
        lines.append(f"  its command: {best['command']}")
    over = int((~rows["fits"] & rows["error"].eq("")).sum())
    failed = rows[rows["error"].ne("")]
    lines.append(f"{over} configurations do not fit (predicted peak + allowance over the device)")
    if not failed.empty:
        lines.append(f"{len(failed)} configurations have no prediction, by reason:")
        lines += [f"  {line}" for line in failures(failed)]
    return "\n".join(lines)


def failures(failed: pd.DataFrame, width: int = 160) -> list[str]:
    """One line per reason, most configurations first: how many, the layouts they are of, and
    the reason (cut at ``width`` characters; plan.csv holds it whole): a plan at scale has few
    reasons over many rows."""
    lines = []
    for error, rows in sorted(failed.groupby("error", sort=False), key=lambda g: -len(g[1])):
        why = error if len(error) <= width else error[: width - 3].rsplit(" ", 1)[0] + " ..."
        labels = ", ".join(dict.fromkeys(rows["config"]))
        lines.append(f"{len(rows)} x {labels}: {why}")
    return lines


VERIFY = {
    "name": "configuration",
    "predicted_step_ms": "predicted ms",
    "measured_step_ms": "measured ms",
    "step_error_pct": "error %",
    "predicted_peak_mib": "predicted MiB",
    "measured_peak_mib": "measured MiB",
    "peak_error_pct": "mem error %",
    "ratio_to_best": "x best",  # its step over the measured best's, paired per cycle
    "measured_status": "status",
}


def render_verify(df: pd.DataFrame, summary: dict) -> str:
    cols = [c for c in VERIFY if c in df]
    shown = df[cols].rename(columns=VERIFY)
    lines = [shown.to_string(index=False, formatters={c: _fmt for c in shown.columns})]
    if summary.get("verified"):
        lines.append(
            f"step time: median absolute error {summary['step_median_abs_error_pct']:.1f} %; "
            f"peak memory: largest error {summary['peak_max_abs_error_pct']:.1f} %"
        )
        if "spearman_rho" in summary:
            lines.append(
                f"Spearman's rho of predicted and measured steps {summary['spearman_rho']:.2f} "
                f"(p {summary['spearman_p']:.2g})"
            )
        if "spearman_undefined" in summary:
            lines.append(
                "Spearman's rho of predicted and measured steps: undefined "
                f"({summary['spearman_undefined']}: a tie, no order to correlate)"
            )
        verdict = (
            "is it, or tied with it" if summary["predicted_best_is_best_or_tied"] else "is not"
        )
        how = (
            f"paired over {summary['cycles']} interleaved cycles, 95 %"
            if summary.get("method") == "paired"
            else "95 % intervals"
        )
        lines.append(
            f"measured best: {summary['measured_best']}; the predicted best "
            f"({summary['predicted_best']}) {verdict} ({how})"
        )
    if "launch_drift_pct" in summary:
        before, after = summary["launch_drift_ms"]
        fitted = ""
        if "calibration_error_pct" in summary:
            fitted = (
                f" against {summary['calibration_predicted_ms']:.1f} predicted "
                f"({summary['calibration_error_pct']:+.1f} %: the model's own error where it "
                "was fitted)"
            )
        lines.append(
            f"the calibration's own configuration ({summary['launch_drift_point']}): "
            f"{before:.1f} ms in the calibration's launch{fitted}, {after:.1f} ms in this one "
            f"({summary['launch_drift_pct']:+.1f} %: the machine's drift between the two "
            "launches, in every row's error)"
        )
    if summary.get("failed"):
        lines.append(f"{summary['failed']} configurations failed to run: see verify.csv")
    return "\n".join(lines)
