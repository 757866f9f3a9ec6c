"""Read the run folders the model is fitted from and checked against, refusing mixtures.

A model fitted on one machine says nothing about another: every run handed to one command must
come from the same host, backend, device and torch version, and a training run's points must
have their traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pandas as pd

from bench.model.errors import FitError
from bench.runfolder.points import POINTS_FILE, PointRecord, RunFolderError
from bench.runfolder.schema import Run, read_run

# What must agree between the runs of one model: the machine and the software that timed them
# (cpu_count only where both runs record it: older runs do not).
MACHINE_KEYS = ("host", "backend", "device", "device_name", "torch_version", "nodes")
RECORDED_SINCE = ("cpu_count",)


class TrainingRun(NamedTuple):
    path: Path
    meta: dict
    ok: pd.DataFrame  # the ok rows of results.csv
    points: dict[str, PointRecord]


class RunError(FitError):
    """Run folders that cannot be used together (or at all); the message says why."""


def _read(run_dir: Path) -> Run:
    run_dir = Path(run_dir)
    if not (run_dir / "meta.json").exists() or not (run_dir / "results.csv").exists():
        raise RunError(f"{run_dir} is not a run folder (no meta.json and results.csv)")
    try:
        return read_run(run_dir)
    except RunFolderError as e:
        raise RunError(str(e)) from None


def same_machine(metas: list[tuple[Path, dict]]) -> None:
    """Raise RunError naming the first key on which the runs differ."""
    first_path, first = metas[0]
    for path, meta in metas[1:]:
        keys = [*MACHINE_KEYS, *(k for k in RECORDED_SINCE if k in meta and k in first)]
        for key in keys:
            if meta.get(key) != first.get(key):
                raise RunError(
                    f"runs from different machines or settings: {key} is {first.get(key)!r} "
                    f"in {first_path} but {meta.get(key)!r} in {path}"
                )


def with_samples(results: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """``results`` with ``samples_ms``: each row's timed iterations in ms (samples.csv's of the
    same point and round), None where it has none."""
    if "point" not in results or samples.empty:
        return results.assign(samples_ms=None)
    by_visit = {
        (str(point), int(round_)): group.to_numpy(float)
        for (point, round_), group in samples.groupby(["point", "round"])["ms"]
    }
    rounds = results["round"].fillna(1) if "round" in results else [1] * len(results)
    keys = zip(results["point"].astype(str), rounds, strict=True)
    return results.assign(samples_ms=[by_visit.get((p, int(r))) for p, r in keys])


def read_collectives_runs(run_dirs: list[Path]) -> tuple[dict, pd.DataFrame]:
    """(meta of the first, all rows with their samples) of one or more message_size runs."""
    metas, frames = [], []
    for d in run_dirs:
        run = _read(d)
        meta, df = run.meta, run.results
        if meta.get("kind") != "collective":
            raise RunError(f"{d} is a {meta.get('sweep')!r} run, not a --sweep message_size run")
        plan = meta.get("collective_plan") or {}
        if plan.get("dtype", "float32") != "float32":
            raise RunError(f"{d} timed {plan['dtype']}, training moves float32")
        if plan.get("op", "sum") not in ("sum", "avg"):
            raise RunError(f"{d} timed op {plan['op']}, training reduces with sum")
        metas.append((Path(d), meta))
        frames.append(with_samples(df, run.samples))
    same_machine(metas)
    return metas[0][1], pd.concat(frames, ignore_index=True)


def read_training_runs(run_dirs: list[Path]) -> list[TrainingRun]:
    """[(folder, meta, ok rows, point records)] of training runs whose ok points all have
    traces and records."""
    out = []
    for d in run_dirs:
        run = _read(d)
        meta, df = run.meta, run.results
        if meta.get("kind") == "collective":
            raise RunError(f"{d} is a collectives run; give it with --collectives")
        ok = df[df["status"] == "ok"]
        missing = sorted(set(ok["point"]) - set(run.points))
        if missing:
            raise RunError(f"{d}: point {missing[0]} has no record in {POINTS_FILE}")
        for _, row in ok.iterrows():
            folder = Path(d) / "traces" / str(row["point"])
            if not any(folder.glob("*.pt.trace.json*")):
                raise RunError(f"{d}: point {row['point']} has no traces in {folder}")
        out.append(TrainingRun(Path(d), meta, ok.reset_index(drop=True), run.points))
    same_machine([(r.path, r.meta) for r in out])
    return out


def check_compatible(collectives_meta: dict, source: Path, runs) -> None:
    """The collectives run must come from the training runs' machine."""
    same_machine([(source, collectives_meta), *[(r.path, r.meta) for r in runs]])
