"""The run folder of the data contract (DESIGN.md section 3): meta.json, results.csv, traces/.

Rows are appended and flushed to disk as each point finishes, so an interrupted run keeps every
point it completed, and ``--resume`` can skip them.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import subprocess
from pathlib import Path

import pandas as pd

# The columns every training sweep has, in this order; extra columns follow them.
TRAINING_COLUMNS = [
    "sweep",
    "value",
    "impl",
    "strategy",
    "world_size",
    "status",
    "error",
    "step_ms_median",
    "step_ms_min",
    "step_ms_max",
    "samples_per_s",
    "compute_ms",
    "comm_ms",
    "overlap_ms",
    "exposed_comm_ms",
    "idle_ms",
    "compute_comm_ratio",
    "overlap_pct",
    "gpu_util_pct",
    "peak_mem_mb",
    "comm_bytes_per_step",
]
TRAINING_EXTRA_COLUMNS = [
    "model",
    "point",
    "backend",
    "device",
    "window_ms",
    "comm_bytes_expected",
    "state_mb",
    "state_mb_expected",
    "param_mb",
    "grad_mb",
    "optim_mb",
    "peak_rss_mb",
    "cpu_busy_pct",
    "nvml_util_pct",
    "params",
    "grad_bytes",
    "comm_calls_per_step",
    "steps",
    "loss",
    "step_ms_p10",
    "step_ms_p90",
    "rank_skew_ms",
    "scaling",
    "global_batch",
    "batch_per_replica",
    "grad_accum",
    "comm_bytes_per_sample",
    "trace_dir",
]


# The collective sweep's columns (DESIGN.md section 3), then extras.
COLLECTIVE_COLUMNS = [
    "sweep",
    "collective",
    "impl",
    "world_size",
    "dtype",
    "size_bytes",
    "count",
    "time_us",
    "algbw_GBps",
    "busbw_GBps",
    "wrong",
    "status",
    "error",
]
COLLECTIVE_EXTRA_COLUMNS = [
    "op",
    "time_us_min",
    "time_us_max",
    "busbw_frac_p2p",
    "iters",
    "point",
    "backend",
    "device",
]


# Every timed sample of every point (samples.csv): the slowest rank's time of each timed step
# or iteration, so that runs can be compared on samples rather than on medians.
SAMPLE_COLUMNS = ["point", "index", "ms"]


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def default_run_dir(root: Path, sweep: str) -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return root / f"{stamp}-{sweep}"


def git_commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _cell(value) -> str:
    """CSV text of a value: metrics that do not apply (None/NaN) stay empty, never zero."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


class ResultsWriter:
    """Appends rows to a CSV file (``results.csv``), each append one fsync'd write."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns
        if not path.exists() or path.stat().st_size == 0:
            with path.open("w", newline="") as f:
                csv.writer(f).writerow(columns)

    def _write(self, rows: list[list]) -> None:
        with self.path.open("a", newline="") as f:
            csv.writer(f).writerows(rows)
            f.flush()
            os.fsync(f.fileno())

    def append(self, row: dict) -> None:
        self._write([[_cell(row.get(c)) for c in self.columns]])


class SamplesWriter(ResultsWriter):
    """``samples.csv``: every timed sample of a point, in one write."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, SAMPLE_COLUMNS)

    def append_samples(self, point: str, samples: list[float]) -> None:
        self._write([[point, i, f"{ms:.6g}"] for i, ms in enumerate(samples)])


def has_results(run_dir: Path) -> bool:
    csv_path = run_dir / "results.csv"
    return csv_path.exists() and csv_path.stat().st_size > 0


def done_points(path: Path) -> set[str]:
    """Point ids already finished with status ok (what ``--resume`` skips)."""
    if not path.exists():
        return set()
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    if "point" not in df or "status" not in df:
        return set()
    return set(df.loc[df["status"] == "ok", "point"])


def write_meta(path: Path, meta: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file


def read_run(run_dir: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(meta, results, samples) of a run folder; absent files give empty values."""
    meta_path, csv_path = run_dir / "meta.json", run_dir / "results.csv"
    samples_path = run_dir / "samples.csv"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    df = pd.read_csv(csv_path) if csv_path.exists() else pd.DataFrame()
    samples = (
        pd.read_csv(samples_path) if samples_path.exists() else pd.DataFrame(columns=SAMPLE_COLUMNS)
    )
    return meta, df, samples
