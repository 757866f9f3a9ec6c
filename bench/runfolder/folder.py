"""Writing the run folder of the data contract (docs/outputs.md): meta.json, points.jsonl
(``points.py``), results.csv, samples.csv, noise.csv, traces/. ``schema.py`` says what each may
hold and reads them back.

Rows are appended and flushed to disk as each point finishes, so an interrupted run keeps every
point it completed, and ``--resume`` can skip them; a row a full disk cut short is taken back,
so the table stays whole (``ResultsWriter``). Whole files (meta.json, points.jsonl, reports)
are written through ``atomic.py``: a reader never sees half of one.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
import os
import subprocess
from pathlib import Path

import pandas as pd

from bench.runfolder.atomic import OutputError, describe, write_text
from bench.runfolder.columns import SAMPLE_COLUMNS


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
    """Appends rows to a CSV file (``results.csv``), each append one fsync'd write; an append
    that fails (a full disk) is taken back to the last whole row and raises ``OutputError``."""

    def __init__(self, path: Path, columns: list[str]) -> None:
        self.path = path
        self.columns = columns
        if not path.exists() or path.stat().st_size == 0:
            self._write([columns])

    def _write(self, rows: list[list]) -> None:
        buf = io.StringIO()
        csv.writer(buf).writerows(rows)
        data = buf.getvalue().encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise OutputError(describe(self.path, e)) from None
        try:
            size = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as e:
                os.ftruncate(fd, size)  # the rows before stay whole; this one is not half there
                raise OutputError(describe(self.path, e)) from None
        finally:
            os.close(fd)

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
    write_text(path, json.dumps(meta, indent=2, sort_keys=True) + "\n")


def ours_and_native(impls: list[str], native: dict[str, bool]) -> tuple[str | None, str | None]:
    """(our implementation, PyTorch's) among ``impls`` of a collectives run, by each one's
    ``native`` fact (the collectives table's, recorded in meta.json as ``impl_native``); None
    where absent."""
    ours = [i for i in impls if native.get(i) is False]
    theirs = [i for i in impls if native.get(i)]
    return (ours[0] if ours else None), (theirs[0] if theirs else None)
