"""The run folder of the data contract (docs/outputs.md): meta.json (with the folder's
``schema_version``), points.jsonl (``points.py``), results.csv, samples.csv, noise.csv, traces/.

Rows are appended and flushed to disk as each point finishes, so an interrupted run keeps every
point it completed, and ``--resume`` can skip them. ``read_run`` is how the reading side opens a
folder: it refuses, in one line, a folder that is not a run or that this version cannot read.

Schema versions (major.minor; a reader reads its own major and any minor):
- 1: meta.json, results.csv, samples.csv, traces/ (parallel-bench 0.1).
- 2.0: adds points.jsonl, every point resolved; meta.json names its schema_version.
- 2.1: rounds. results.csv has a row per visit of a point (``round``), each with the figures
  pooled over that point's rounds so far: a point's answer is its last ok row. samples.csv
  names each sample's round; noise.csv holds the reference workload timed between points.
  A 2.0 folder reads as one round without a noise floor.
- 2.6: interleaved cohorts. results.csv's ``method`` (rounds or paired), ``cohort``, ``cycles``,
  ``alone_ms`` and ``interleave_cost_pct``; a paired point's samples are indexed by cycle (its
  cohort's sample i were timed in the same cycle); meta.json's ``interleaved``. A folder
  without ``method`` reads as rounds.
- 2.7: racing. A paired candidate whose comparison was decided leaves its cohort's cycles:
  its ``cycles`` and samples are its own (its first cycles), paired with the best's over
  those; ``stop`` is its own. A 2.6 folder reads the same (every candidate's cycles equal).
- 2.8: ``peak_mem_mb`` is the configuration's own: the highest of three steps, less what the
  point leaves in the process once released (caches it filled; in a cohort, what candidates
  measured before it left) and, on the CPU, the harness's synthetic data set. A 2.7 folder
  reads as before (its figures hold those).
- 2.9: on the CPU, ``peak_mem_mb`` counts what any thread frees during a step (gloo's workers
  free what a collective kept): FSDP's figures on gloo were up to 2.9 MiB high in a step of
  three before, and what a step frees of the state it starts from (FSDP1's flat gradients,
  which ``zero_grad`` leaves: 1.19 MiB of llama:tiny's FULL_SHARD). A 2.8 folder reads as
  before.
- 2.10: ``mem_kept_mb``, the point's own state still alive once it was released (FSDP1's
  NO_SHARD keeps its flat parameters and AdamW's state), stays in ``peak_mem_mb``: it was taken
  off with the rest of what the point left, which read llama:tiny's FSDP1 NO_SHARD 4.75 MiB
  low. A 2.9 folder reads as before (no ``mem_kept_mb``).
- 2.11: ``peak_mem_mb`` is measured on a build of the point's own after its timed steps, on
  the CPU as c10's count of the bytes its allocator handed out (every thread, from before the
  build), not the C heap, which moved with the points run before (FSDP2's NO_SHARD llama:tiny
  13.5 MiB first in a launch, 18.4 after others; now 18.29 in both). A 2.10 folder reads as
  before.
- 2.12: a point record's ``verdict_group``: the candidates an interleaved cohort's verdict
  compares it with, where they are not its implementation's (a plan's verification). A 2.11
  folder reads as before (each implementation's points a group).
- 2.13: on the CPU, ``peak_mem_mb``'s steps wait after each collective until gloo's thread has
  let go of the caller's tensors (``released.py``): on a loaded machine it freed some after
  the next allocations, and bert:tiny's FSDP2 FULL_SHARD read 11.12 MiB in some steps, 10.37
  in others (now 10.37). A 2.12 folder reads as before.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.runfolder.columns import NOISE_COLUMNS, SAMPLE_COLUMNS
from bench.runfolder.points import POINTS_FILE, PointRecord, RunFolderError, read_points

SCHEMA_VERSION = "2.13"


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
        """One row; a key that is not a column is a bug in the caller: refused, not dropped."""
        unknown = sorted(set(row) - set(self.columns))
        if unknown:
            raise KeyError(f"{self.path.name} has no column {', '.join(unknown)}")
        self._write([[_cell(row.get(c)) for c in self.columns]])


class SamplesWriter(ResultsWriter):
    """``samples.csv``: every timed sample of a point, in one write."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, SAMPLE_COLUMNS)

    def append_samples(self, point: str, round_: int, samples: list[float]) -> None:
        self._write([[point, round_, i, f"{ms:.6g}"] for i, ms in enumerate(samples)])


def has_results(run_dir: Path) -> bool:
    csv_path = run_dir / "results.csv"
    return csv_path.exists() and csv_path.stat().st_size > 0


def done_visits(visits: pd.DataFrame) -> set[tuple[str, int]]:
    """(point, round) of every visit finished with status ok (what ``--resume`` skips)."""
    if visits.empty or "point" not in visits or "status" not in visits:
        return set()
    ok = visits[visits["status"] == "ok"]
    rounds = ok["round"] if "round" in ok else pd.Series(1, index=ok.index)
    return {(str(p), int(r)) for p, r in zip(ok["point"], rounds.fillna(1), strict=True)}


def write_meta(path: Path, meta: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file


@dataclass
class Run:
    """A run folder as the reading side sees it."""

    path: Path
    meta: dict
    results: pd.DataFrame  # one row per point: its answer (the last ok visit, else the last)
    samples: pd.DataFrame  # point, round, index, ms
    points: dict[str, PointRecord] = field(default_factory=dict)  # training runs
    visits: pd.DataFrame = field(default_factory=pd.DataFrame)  # every row, a row per round
    noise: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=NOISE_COLUMNS))


def ours_and_native(impls: list[str], native: dict[str, bool]) -> tuple[str | None, str | None]:
    """(our implementation, PyTorch's) among ``impls`` of a collectives run, by each one's
    ``native`` fact (the collectives table's, recorded in meta.json as ``impl_native``); None
    where absent."""
    ours = [i for i in impls if native.get(i) is False]
    theirs = [i for i in impls if native.get(i)]
    return (ours[0] if ours else None), (theirs[0] if theirs else None)


def check_schema(run_dir: Path, meta: dict) -> None:
    """RunFolderError unless this version reads the folder's schema."""
    version = str(meta.get("schema_version", "1"))
    major = version.split(".")[0]
    mine = SCHEMA_VERSION.split(".")[0]
    if not major.isdigit():
        raise RunFolderError(f"{run_dir}: unknown schema_version {version!r}")
    if int(major) > int(mine):
        raise RunFolderError(
            f"{run_dir} has schema {version}, newer than this parallel-bench reads "
            f"({SCHEMA_VERSION}): read it with the version that wrote it"
        )
    if int(major) < int(mine):
        raise RunFolderError(
            f"{run_dir} has schema {version} (no points record): parallel-bench 0.1 reads it"
        )


def read_meta(run_dir: Path) -> dict:
    path = Path(run_dir) / "meta.json"
    if not path.is_file():
        raise RunFolderError(f"{run_dir} is not a run folder (no meta.json)")
    try:
        meta = json.loads(path.read_text())
    except ValueError as e:
        raise RunFolderError(f"{path} is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise RunFolderError(f"{path} is not a run's meta.json")
    check_schema(Path(run_dir), meta)
    return meta


def _csv(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=columns)
    try:
        return pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise RunFolderError(f"{path} is not a results table ({str(e).splitlines()[0]})") from None


def read_run(run_dir: Path) -> Run:
    """meta.json, results.csv, samples.csv and, for training runs, the points record; one-line
    RunFolderError when the folder is not a run this version reads."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    visits = _csv(run_dir / "results.csv")
    samples = _csv(run_dir / "samples.csv", SAMPLE_COLUMNS)
    if "round" not in samples:  # schema 2.0: one round
        samples.insert(1, "round", 1)
    if len(visits) and "round" not in visits:
        visits["round"] = 1
    noise = _csv(run_dir / "noise.csv", NOISE_COLUMNS)
    points = {} if meta.get("kind") in ("collective", "replay") else read_points(run_dir)
    return Run(
        path=run_dir,
        meta=meta,
        results=answers(visits, list(points)),
        samples=samples,
        points=points,
        visits=visits,
        noise=noise,
    )


def answers(visits: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """A row per point: its last ok visit (its figures pool every round), else its last
    visit; in the points record's order where there is one, else in the file's."""
    if visits.empty or "point" not in visits:
        return visits
    ok = visits["status"].eq("ok") if "status" in visits else pd.Series(True, index=visits.index)
    ranked = visits.assign(_ok=ok.astype(int), _at=range(len(visits)))
    last = ranked.sort_values(["_ok", "_at"]).drop_duplicates("point", keep="last")
    first_seen = {p: i for i, p in enumerate(dict.fromkeys(visits["point"]))}
    rank = {p: i for i, p in enumerate(order)} if order else first_seen
    last = last.assign(_pos=last["point"].map(lambda p: rank.get(p, len(rank) + first_seen[p])))
    return last.sort_values("_pos").drop(columns=["_ok", "_at", "_pos"]).reset_index(drop=True)


__all__ = ["POINTS_FILE", "RunFolderError"]
