"""Synthetic run folders for report tests: the files a sweep writes, with chosen timings."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from bench.runfolder import columns
from bench.runfolder.columns import NOISE_COLUMNS
from bench.runfolder.folder import ResultsWriter, SamplesWriter, write_meta
from bench.runfolder.points import POINTS_FILE, write_points
from bench.runfolder.schema import SCHEMA_VERSION
from bench.runner.configure.resolve import PointRequest, resolve_point
from parallel_kernels.knobs import KNOBS


def make_training_run(
    run_dir: Path,
    points: dict[tuple[str, float, str], float],
    *,
    seed: int = 0,
    failed: dict[tuple[str, float, str], str] | None = None,
    steps: int = 20,
    rounds: int = 3,
    visit_sd: float = 0.01,
    floor_sd: float = 0.01,
    sweep: str = "bucket_cap_mb",
    strategy: str = "ddp",
    comm: dict[tuple[str, float, str], tuple[float, float]] | None = None,
) -> Path:
    """A training run (bucket_cap_mb unless ``sweep`` says otherwise): ``points`` maps (model,
    value, impl) to a median step time (ms); each point gets ``rounds`` visits of ``steps``
    samples with 3 % noise, each visit off by ``visit_sd`` (drift), and each round as a whole
    by 0.5 %; noise.csv holds a reference workload's 2.0 ms with ``floor_sd`` noise between
    visits.
    ``comm``: (measured, analytical) bytes per step of some points (default 4e7 both)."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True)
    write_meta(
        run_dir / "meta.json",
        {
            "schema_version": SCHEMA_VERSION,
            "kind": "training",
            "tradeoff": False,
            "run_id": run_dir.name,
            "sweep": sweep,
            "argv": ["--sweep", sweep],
            "torch_version": "2.13.0",
            "backend": "gloo",
            "device": "cpu",
            "device_name": "x86_64",
            "world_size": 2,
            "nodes": 1,
            "host": "h",
            "git_commit": "abc",
            "start_time": "2026-01-01T00:00:00Z",
            "end_time": "2026-01-01T00:01:00Z",
            "config": {"target_ci_pct": 2.0, "max_steps": 60, "max_point_s": 8.0, "rounds": rounds},
        },
    )
    noise = ResultsWriter(run_dir / "noise.csv", NOISE_COLUMNS)
    writer = ResultsWriter(run_dir / "results.csv", columns.written(columns.TRAINING))
    samples = SamplesWriter(run_dir / "samples.csv")
    records = [
        resolve_point(
            PointRequest(
                sweep=sweep,
                values={sweep: value},
                model=model,
                strategy=strategy,
                impl=impl,
                world_size=2,
                knobs={sweep: value},
                swept_defaults={sweep: KNOBS[sweep].default},
            )
        )
        for (model, value, impl) in [*points, *(failed or {})]
    ]
    write_points(run_dir / POINTS_FILE, records)
    round_effect = 1 + 0.005 * rng.standard_normal(rounds)
    pooled: dict[str, list[float]] = {}
    for r in range(rounds):
        for (model, value, impl), ms in points.items():
            point = f"{model}-{sweep}={value:g}-{impl}"
            floor = 2.0 * (1 + floor_sd * rng.standard_normal(5))
            noise.append(
                {
                    "gap": len(pooled) + r * len(points),
                    "round": r + 1,
                    "after": "",
                    "ms": float(np.median(floor)),
                    "ms_min": float(floor.min()),
                    "ms_max": float(floor.max()),
                    "n": 5,
                }
            )
            drift = round_effect[r] * (1 + visit_sd * rng.standard_normal())
            t = ms * drift * (1 + 0.03 * rng.standard_normal(steps))
            all_t = np.array(pooled.setdefault(point, []) + list(t))
            pooled[point] = list(all_t)
            measured, expected = (comm or {}).get((model, value, impl), (4e7, 4e7))
            compute = 0.7 * ms if impl == "native" else 0.85 * ms
            writer.append(
                {
                    "sweep": sweep,
                    "value": value,
                    "impl": impl,
                    "strategy": strategy,
                    "world_size": 2,
                    "status": "ok",
                    "error": "",
                    "step_ms_median": float(np.median(all_t)),
                    "step_ms_min": float(all_t.min()),
                    "step_ms_max": float(all_t.max()),
                    "samples_per_s": 128 / (ms / 1e3),
                    "window_ms": ms,
                    "compute_ms": compute,
                    "comm_ms": 0.3 * ms,
                    "overlap_ms": 0.1 * ms,
                    "exposed_comm_ms": 0.2 * ms,
                    "idle_ms": ms - compute - 0.2 * ms,
                    "overlap_pct": 33.3,
                    "compute_comm_ratio": 2.5,
                    "peak_mem_mb": 100.0,
                    "comm_bytes_per_step": measured,
                    "comm_calls_per_step": 2,
                    "comm_bytes_expected": expected,
                    "model": model,
                    "point": point,
                    "backend": "gloo",
                    "device": "cpu",
                    "round": r + 1,
                    "rounds": r + 1,
                    "steps": len(all_t),
                    "stop": "max_steps",
                }
            )
            samples.append_samples(point, r + 1, list(t))
    for (model, value, impl), error in (failed or {}).items():
        writer.append(
            {
                "sweep": "bucket_cap_mb",
                "value": value,
                "impl": impl,
                "model": model,
                "status": "error",
                "error": error,
                "world_size": 2,
                "point": f"{model}-bucket_cap_mb={value:g}-{impl}",
            }
        )
    return run_dir


# A fixture's MFU waterfall (results.csv's wf_* columns): each part's share of the row's
# window_ms; ideal + matmul_loss = matmul, and the parts but matmul add up to 1.
WATERFALL_SHARES = {
    "wf_ideal_ms": 0.1,
    "wf_matmul_loss_ms": 0.3,
    "wf_matmul_ms": 0.4,
    "wf_memory_bound_ms": 0.2,
    "wf_recompute_ms": 0.05,
    "wf_optimizer_ms": 0.05,
    "wf_exposed_comm_ms": 0.2,
    "wf_idle_ms": 0.05,
    "wf_other_ms": 0.05,
}
NO_SHAPES = "the trace has no shapes (record_shapes=False)"


def add_waterfall(run_dir: Path, *, unpriced=(), missing=()) -> Path:
    """The wf_* cells of every ok row of a ``make_training_run`` folder, ``WATERFALL_SHARES``
    of its window_ms, on a named roofline; the points in ``unpriced`` without ideal and
    matmul_loss (a trace without shapes: NO_SHAPES), those in ``missing`` with none at all.
    Every other cell stays as written."""
    path = run_dir / "results.csv"
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    for row in rows:
        if row["status"] != "ok" or row["point"] in missing:
            continue
        window = float(row["window_ms"])
        row.update({c: repr(share * window) for c, share in WATERFALL_SHARES.items()})
        row.update(wf_profile="test CPU (measured by the fixture)", wf_unpriced="")
        if row["point"] in unpriced:
            row.update(wf_ideal_ms="", wf_matmul_loss_ms="", wf_unpriced=NO_SHAPES)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(rows)
    return run_dir


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
