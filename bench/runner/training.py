"""Run a training sweep on every rank: loop over the points, write each row as it finishes."""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd

from bench.analysis.scaling import scaling_efficiency
from bench.runfolder import columns
from bench.runfolder.points import PointRecord
from bench.runner.context import finish_run, start_run
from bench.runner.distenv import rank0_print
from bench.runner.harness import HarnessConfig, LostRanksError, point_columns, run_point


def _summary_table(df: pd.DataFrame) -> str:
    """The points, with the fastest value per model and implementation starred."""
    df = scaling_efficiency(df)
    ok = df[df["status"] == "ok"].copy()
    df["best"] = ""
    if not ok.empty:
        best = ok.loc[ok.groupby(["model", "impl"])["step_ms_median"].idxmin()]
        df.loc[best.index, "best"] = "*"
    df["comm_MB"] = df["comm_bytes_per_step"] / 1e6
    cols = [
        "model",
        "value",
        "scaling",
        "impl",
        "status",
        "best",
        "step_ms_median",
        "step_ms_min",
        "step_ms_max",
        "samples_per_s",
        "comm_calls_per_step",
        "comm_MB",
        "overlap_pct",
        "exposed_comm_ms",
        "peak_mem_mb",
        "efficiency_pct",
    ]
    df = df.dropna(axis=1, how="all")  # e.g. scaling columns outside world-size sweeps
    return df[[c for c in cols if c in df]].to_string(index=False, float_format="{:.2f}".format)


def lost_ranks(ctx, point: PointRecord, e: LostRanksError) -> None:
    """A rank or node is gone: record the point as failed, say so, and end this rank now
    (its process group cannot be torn down cleanly without the lost peers)."""
    if ctx.env.is_main:
        ctx.write({**point_columns(point), "status": "error", "error": str(e)})
    print(f"error: {e}", file=sys.stderr, flush=True)
    os._exit(1)


def run_sweep(args: argparse.Namespace, points: list[PointRecord], argv: list[str]) -> int:
    ctx = start_run(args, argv, columns.written(columns.TRAINING), points=points)
    env = ctx.env
    cfg = HarnessConfig(point_timeout_s=args.point_timeout, clip_grad_norm=args.clip_grad_norm)
    rank0_print(
        f"sweep {args.sweep}: {len(points)} points, world size {env.world_size}, "
        f"{env.backend} on {env.device.type}, results in {ctx.run_dir}"
    )
    for i, point in enumerate(points, 1):
        label = f"[{i}/{len(points)}] {point.id}"
        if point.id in ctx.skip:
            rank0_print(f"{label}: already done, skipped (--resume)")
            continue
        t0 = time.perf_counter()
        try:
            row = run_point(
                point,
                env,
                cfg,
                ctx.run_dir / "traces" / point.id,
                progress=lambda msg, label=label: rank0_print(f"{label}: {msg}"),
            )
        except LostRanksError as e:
            lost_ranks(ctx, point, e)
        ctx.write(row)
        if row["status"] == "ok":
            rank0_print(
                f"{label}: ok, step {row['step_ms_median']:.1f} ms median, overlap "
                f"{row['overlap_pct']:.0f} % ({time.perf_counter() - t0:.1f} s)"
            )
        else:
            rank0_print(f"{label}: error: {row['error']}")
    return finish_run(
        ctx, lambda df: _summary_table(df) + "\n(* fastest per model and implementation)"
    )
