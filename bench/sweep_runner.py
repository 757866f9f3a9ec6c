"""Run a training sweep on every rank: set up the run folder, loop over points, write, report."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist

from bench.distenv import DistEnv, fail, init_distributed, rank0_print
from bench.harness import HarnessConfig, run_point
from bench.results import (
    TRAINING_COLUMNS,
    TRAINING_EXTRA_COLUMNS,
    ResultsWriter,
    default_run_dir,
    done_points,
    git_commit,
    has_results,
    utc_now,
    write_meta,
)
from bench.sweeps import Point

REPO = Path(__file__).resolve().parents[1]


def _prepare_run_dir(args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """Rank 0 only: pick the folder, refuse to overwrite finished results."""
    run_dir = args.out if args.out is not None else default_run_dir(Path("results"), args.sweep)
    finished = has_results(run_dir)
    if finished and not args.resume:
        return None, (
            f"{run_dir} already holds results: pass --resume to continue it, or "
            f"choose another --out"
        )
    if args.resume and not finished:
        return None, f"--resume: {run_dir} holds no results.csv to continue"
    try:
        (run_dir / "traces").mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return None, f"cannot create {run_dir}: {e.strerror}"
    return run_dir, None


def _meta(args, argv, env: DistEnv, run_dir: Path, started: str) -> dict:
    return {
        "run_id": run_dir.name,
        "sweep": args.sweep,
        "argv": argv,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "backend": env.backend,
        "device": env.device.type,
        "device_name": torch.cuda.get_device_name(env.device)
        if env.device.type == "cuda"
        else platform.processor() or platform.machine(),
        "world_size": env.world_size,
        "nodes": env.nnodes,
        "ranks_per_node": env.local_world_size,
        "host": env.host,
        "git_commit": git_commit(REPO),
        "start_time": started,
        "end_time": None,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def _summary_table(df: pd.DataFrame) -> str:
    """The points, with the fastest value per model and implementation starred."""
    ok = df[df["status"] == "ok"].copy()
    df = df.copy()
    df["best"] = ""
    if not ok.empty:
        best = ok.loc[ok.groupby(["model", "impl"])["step_ms_median"].idxmin()]
        df.loc[best.index, "best"] = "*"
    df["comm_MB"] = df["comm_bytes_per_step"] / 1e6
    cols = [
        "model",
        "value",
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
    ]
    return df[[c for c in cols if c in df]].to_string(index=False, float_format="{:.2f}".format)


def run_sweep(args: argparse.Namespace, points: list[Point], argv: list[str]) -> int:
    env = init_distributed(backend=args.backend, timeout_s=max(300.0, args.point_timeout))
    decision: list = [None]
    if env.is_main:
        decision = [_prepare_run_dir(args)]
    dist.broadcast_object_list(decision, group_src=0)
    run_dir, error = decision[0]
    if error:
        dist.destroy_process_group()
        fail(error)

    cfg = HarnessConfig(
        batch_size=args.batch_size,
        warmup_steps=args.warmup_steps,
        steps=args.steps,
        profile_active=args.profile_steps,
        point_timeout_s=args.point_timeout,
    )
    started = utc_now()
    writer = None
    skip: set[str] = set()
    if env.is_main:
        meta = _meta(args, argv, env, run_dir, started)
        write_meta(run_dir / "meta.json", meta)
        writer = ResultsWriter(run_dir / "results.csv", TRAINING_COLUMNS + TRAINING_EXTRA_COLUMNS)
        skip = done_points(run_dir / "results.csv") if args.resume else set()
    skip_list = [skip]
    dist.broadcast_object_list(skip_list, group_src=0)
    skip = skip_list[0]

    rank0_print(
        f"sweep {args.sweep}: {len(points)} points, world size {env.world_size}, "
        f"{env.backend} on {env.device.type}, results in {run_dir}"
    )
    for i, point in enumerate(points, 1):
        label = f"[{i}/{len(points)}] {point.id}"
        if point.id in skip:
            rank0_print(f"{label}: already done, skipped (--resume)")
            continue
        t0 = time.perf_counter()
        row = run_point(
            point,
            env,
            cfg,
            run_dir / "traces" / point.id,
            progress=lambda msg, label=label: rank0_print(f"{label}: {msg}"),
        )
        if env.is_main:
            writer.append(row)
            if row["status"] == "ok":
                rank0_print(
                    f"{label}: ok, step {row['step_ms_median']:.1f} ms median, overlap "
                    f"{row['overlap_pct']:.0f} % ({time.perf_counter() - t0:.1f} s)"
                )
            else:
                rank0_print(f"{label}: error: {row['error']}")

    report_path = None
    if env.is_main:
        meta["end_time"] = utc_now()
        write_meta(run_dir / "meta.json", meta)
        df = pd.read_csv(run_dir / "results.csv")
        print("\n" + _summary_table(df) + "\n(* fastest per model and implementation)", flush=True)
        if not args.no_report:
            from bench.report import write_report

            try:
                report_path = write_report(run_dir, args.reports_dir)
            except Exception as e:
                print(f"report not written: {type(e).__name__}: {e}", file=sys.stderr)
        print(
            f"results: {run_dir}" + (f"  report: {report_path}" if report_path else ""), flush=True
        )
    dist.destroy_process_group()
    return 0
