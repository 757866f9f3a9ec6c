"""The report's cost-model section: measured against predicted per point, and what the model
predicts at larger scales, with its assumptions next to the tables (``bench/model``)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from bench.model.comm import FitError
from bench.model.validate import (
    MISS_PCT,
    POINT_COLUMNS,
    bucket_choices,
    median_abs_error,
    validate,
)
from bench.model.whatif import link_costs, load_compute, predict_scales, recommend
from bench.report.tables import html_table

WHATIF_WORLDS = (8, 64, 1024)
# This machine's fitted collectives, and a cluster's fabric with the same computation.
WHATIF_LINKS = (None, "ib_ndr")
WHATIF_COLUMNS = [
    "world_size",
    "family",
    "recommended",
    "step_ms",
    "step_ms_low",
    "step_ms_high",
    "default",
    "default_step_ms",
    "margin_ms",
    "margin_ms_low",
    "margin_ms_high",
    "best_at_both_ends",
    "margin_pct",
    "state_mb_per_rank",
]


def model_sections(run_dir: Path, collectives: list[Path]) -> list[str]:
    parts = ["<h2>Cost model: predicted before measured</h2>"]
    try:
        comm, points = validate(collectives, [run_dir])
    except (FitError, ValueError, OSError) as e:
        return [*parts, f"<p class='err'>No prediction: {html.escape(str(e))}</p>"]
    fits = comm.table()
    mae = median_abs_error(points)
    src = ", ".join(html.escape(str(c)) for c in collectives)
    parts.append(
        f"<p>Collectives fitted from {src} (alpha-beta per collective, on relative residuals; "
        f"R<sup>2</sup> of log time {fits['r2_log'].min():.3f} to {fits['r2_log'].max():.3f}); "
        f"{_outliers(fits)}each point's computation read from "
        f"its traces (pooled over a bucket sweep's points). Median absolute step-time error "
        f"<strong>{mae:.1f} %</strong> (goal {MISS_PCT:g} %) against the timed steps, "
        f"{median_abs_error(points, 'window_error_pct'):.1f} % against the profiled ones "
        f"(measured_window_ms: no barrier between steps). A diagnosis names the term the "
        f"traces disagree with most where a point misses. <code>python -m bench.model validate "
        f"--collectives {src} {html.escape(str(run_dir))}</code></p>"
    )
    parts.append(html_table(points, POINT_COLUMNS, "Measured vs predicted, per point"))
    choices = bucket_choices(points)
    if len(choices):
        parts.append(
            html_table(choices, list(choices.columns), "Best bucket size: measured vs predicted")
        )
    parts.append(
        html_table(
            fits,
            list(fits.columns),
            "Collective fits (alpha in us, beta in ns per byte, each with its 95 % bootstrap "
            "interval; the worst residual of the sizes fitted, and the sizes set aside)",
        )
    )
    parts += _whatif(run_dir, collectives, html_table)
    return parts


def _outliers(fits) -> str:
    """The sizes set aside from the fits and the residuals there, in the text: left out of
    max_abs_residual_pct, a misfit of the model at some sizes would pass for a hiccup."""
    out = fits[fits["outliers"] > 0]
    if out.empty:
        return "no size set aside as an outlier; "
    named = "; ".join(
        f"{r.impl} {r.collective} ({r.ranks} ranks): {r.outlier_residuals}"
        for r in out.itertuples()
    )
    return f"sizes set aside as outliers, with the fit's residual there: {html.escape(named)}; "


def _whatif(run_dir: Path, collectives: list[Path], html_table) -> list[str]:
    parts = ["<h3>What if: larger worlds</h3>"]
    try:
        prof, point, run_meta = load_compute(collectives, run_dir)
    except (FitError, ValueError) as e:
        return [*parts, f"<p>No what-if: {html.escape(str(e))}</p>"]
    for link in WHATIF_LINKS:
        costs, about, share = link_costs(link, collectives, run_meta)
        try:  # the collectives run may lack one the choices need (FSDP's reduce-scatter)
            table = predict_scales(
                prof, point=point, comm=costs, world_sizes=list(WHATIF_WORLDS), share=share
            )
        except FitError as e:
            parts.append(f"<p>No what-if ({html.escape(about)}): {html.escape(str(e))}</p>")
            continue
        eff = table.groupby("world_size")["scaling_efficiency_pct"].max()
        parts += [
            f"<p>{html.escape(about)}; computation of {html.escape(point.model)} at "
            f"{point.batch_per_replica} samples "
            f"per rank, {prof.total_ms:.1f} ms per step ({html.escape(prof.source)}), as measured "
            f"here; weak scaling; computation and communication each at speed {share:g} while "
            f"both run. {_ranges(costs)} Best scaling efficiency: "
            + ", ".join(f"{n} ranks {e:.0f} %" for n, e in eff.items() if np.isfinite(e))
            + ".</p>",
            html_table(
                recommend(table),
                WHATIF_COLUMNS,
                f"Recommended bucket size and sharding, margin over defaults "
                f"({link or 'this machine'})",
            ),
        ]
    parts.append(
        "<p>Other links and a faster device: <code>python -m bench.model whatif "
        "--link nvlink4|ib_hdr|... --speedup X</code>.</p>"
    )
    return parts


def _ranges(costs) -> str:
    if costs.interval_ends() is None:
        return "No range: these costs have no measured interval."
    return (
        "The _low and _high columns: every collective at the low or high end of its 95 % "
        "interval; best_at_both_ends: the recommendation is the fastest at either end too."
    )
