"""What a run folder may hold, and the one reader that holds a folder to it.

Every command that reads ``results/<run>/`` (the report and ``--baseline``, ``bench.model``'s
fit, validate and whatif, the planner's calibration and verification, the replay's report, a
resumed run) opens it here: ``read_run`` for the whole folder, ``read_results`` and
``read_samples`` for one table. Anything the schema does not allow (meta.json's fields of the
wrong type, a table missing a column, a figure that is not a number, a status that is neither
``ok`` nor ``error``, a point id that is not folder-safe, a table that is a directory or not
CSV) is one ``RunFolderError`` naming the file and the field, which each command prints as one
line before it exits with 2: the code after it reads data of the types it expects.

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
  free what a collective kept) and what a step frees of the state it starts from (FSDP1's flat
  gradients, which ``zero_grad`` leaves). A 2.8 folder reads as before.
- 2.10: ``mem_kept_mb``, the point's own state still alive once it was released (FSDP1's
  NO_SHARD keeps its flat parameters and AdamW's state), stays in ``peak_mem_mb``. A 2.9
  folder reads as before (no ``mem_kept_mb``).
- 2.11: ``peak_mem_mb`` is measured on a build of the point's own after its timed steps, on
  the CPU as c10's count of the bytes its allocator handed out (every thread, from before the
  build), not the C heap, which moved with the points run before. A 2.10 folder reads as
  before.
- 2.12: a point record's ``verdict_group``: the candidates an interleaved cohort's verdict
  compares it with, where they are not its implementation's (a plan's verification). A 2.11
  folder reads as before (each implementation's points a group).
- 2.13: on the CPU, ``peak_mem_mb``'s steps wait after each collective until gloo's thread has
  let go of the caller's tensors (``released.py``). A 2.12 folder reads as before.
- 2.14: meta.json's ``ended`` says how the run ended (``finished``, or why it stopped: an
  interrupt, a termination, the launcher lost), with ``end_time``; a folder is held by one run
  at a time (``.lock``, ``bench/runfolder/lock.py``). A 2.13 folder reads as before.
- 2.15: results.csv's ``wf_*`` columns, the MFU waterfall of a point's traced steps (its
  parts, the roofline priced on, what could not be priced). A 2.14 folder reads as before,
  without them.
- 2.16: results.csv's ``pp_*`` columns, a pipeline's figures: its stages' bubble measured
  beside the schedule's theory, their point-to-point bytes beside the count, and each rank's
  bubble and peak memory listed by rank (text). A 2.15 folder reads as before, without them.
- 2.17: results.csv's ``activation_checkpointing`` (the point's mode) and
  ``recompute_flops_per_step`` (what its checkpointing recomputes). A 2.16 folder reads as
  before, without them.
- 2.18: results.csv's ``compile`` (the point's torch.compile mode) and ``compile_seconds``
  (its compilation, outside the timed steps). A 2.17 folder reads as before, without them.
  Also ``matmul_precision`` (the matmuls' precision, fp8 among them) and ``untimed`` (why a
  row's step times are not its configuration's: fp8 emulated on a CPU).

The measurements behind each version's change are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.runfolder.column import Column
from bench.runfolder.columns import COLLECTIVE, NOISE_COLUMNS, REPLAY, SAMPLE_COLUMNS, TRAINING
from bench.runfolder.points import PointRecord, RunFolderError, is_point_id, read_points
from bench.runfolder.verdicts import TIED_SEP, VERDICTS_COLUMNS, VERDICTS_FILE

SCHEMA_VERSION = "2.18"

# meta.json: each field the reading side uses, with the types it may hold (a field a newer
# minor version adds is left aside); ``sweep`` is the one every run has.
META_TYPES: dict[str, tuple[type, ...]] = {
    "schema_version": (str,),
    "kind": (str,),
    "tradeoff": (bool,),
    "run_id": (str,),
    "sweep": (str,),
    "argv": (list,),
    "torch_version": (str,),
    "python": (str,),
    "backend": (str,),
    "device": (str,),
    "device_name": (str,),
    "world_size": (int,),
    "nodes": (int,),
    "ranks_per_node": (int,),
    "host": (str,),
    "cpu_count": (int, type(None)),
    "git_commit": (str, type(None)),
    "start_time": (str,),
    "end_time": (str, type(None)),
    "ended": (str, type(None)),
    "config": (dict,),
    "slurm": (dict, type(None)),
    "slurm_jobs": (list,),
    "impl_native": (dict,),
    "limits": (dict,),
    "collective_plan": (dict,),
    "interleaved": (list,),
    "round_orders": (list,),
    "budget_s": (int, float, type(None)),
    "notes": (list,),
    "trace_dir": (str,),
}
META_REQUIRED = ("sweep",)
KINDS = ("training", "scaling", "collective", "replay")


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


@dataclass(frozen=True)
class Table:
    """What one CSV of the folder must hold: its columns, which of them are numbers, and
    which identify points."""

    name: str
    required: tuple[str, ...]
    numbers: frozenset[str]
    point_ids: tuple[str, ...] = ()  # columns of ids that name folders (traces/<point>/)
    statuses: tuple[str, ...] = ()  # what ``status`` may hold, where the table has one


# The columns of results.csv no reading command can do without, by the run's kind: what names
# a row and its outcome, and a collective's measurement. Any other column may be absent (a
# folder of an older minor version); where present, it holds what its table row says.
KEYS = {
    "training": ("point", "model", "value", "impl", "status"),
    "collective": ("point", "collective", "impl", "world_size", "size_bytes", "time_us", "status"),
    "replay": ("point", "kind", "status"),
}


# What a row's ``status`` may say, by the run's kind (each column table's ``status`` row).
STATUSES = {
    "training": ("ok", "error"),
    "collective": ("ok", "error", "unsupported"),
    "replay": ("ok", "error", "unsupported"),
}
# The kinds whose point ids name folders (``traces/<point>/``, the report's pages): a replay's
# and a collectives run's ids name rows only.
FOLDER_IDS = ("training", "scaling")


def _results_table(columns: tuple[Column, ...], kind: str) -> Table:
    return Table(
        name="results.csv",
        required=KEYS.get(kind, KEYS["training"]),
        numbers=frozenset(c.name for c in columns if c.written and c.number),
        point_ids=("point",) if kind in FOLDER_IDS else (),
        statuses=STATUSES.get(kind, STATUSES["training"]),
    )


def _samples_table(kind: str) -> Table:
    return Table(
        name="samples.csv",
        required=tuple(c for c in SAMPLE_COLUMNS if c != "round"),  # 2.0 has no rounds
        numbers=frozenset({"round", "index", "ms"}),
        point_ids=("point",) if kind in FOLDER_IDS else (),
    )


NOISE = Table(
    name="noise.csv",
    required=tuple(NOISE_COLUMNS),
    numbers=frozenset({"gap", "round", "ms", "ms_min", "ms_max", "n"}),
)
VERDICTS = Table(
    name=VERDICTS_FILE,
    required=tuple(VERDICTS_COLUMNS),
    numbers=frozenset(
        {"best_ms", "n_values", "default_ratio", "default_low", "default_high", "cycles"}
        | {"floor_pct"}
    ),
)


def columns_of(kind: str | None) -> tuple[Column, ...]:
    """The column table of a run of this kind."""
    return {"collective": COLLECTIVE, "replay": REPLAY}.get(kind or "", TRAINING)


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


def _type_names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def check_meta(path: Path, meta: object) -> dict:
    """meta.json's fields of the types the readers use, or RunFolderError naming the field."""
    if not isinstance(meta, dict):
        raise RunFolderError(f"{path} is not a run's meta.json (not an object)")
    for key in META_REQUIRED:
        if key not in meta:
            raise RunFolderError(f"{path}: no field {key!r}")
    for key, types in META_TYPES.items():
        if key not in meta:
            continue
        value = meta[key]
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types)
        if wrong:
            raise RunFolderError(
                f"{path}: field {key!r} is {type(value).__name__} {_short(value)}, "
                f"not {_type_names(types)}"
            )
    if "kind" in meta and meta["kind"] not in KINDS:
        raise RunFolderError(f"{path}: field 'kind' is {meta['kind']!r}, not one of {KINDS}")
    if "argv" in meta and not all(isinstance(a, str) for a in meta["argv"]):
        raise RunFolderError(f"{path}: field 'argv' holds something other than strings")
    if "impl_native" in meta and not all(isinstance(v, bool) for v in meta["impl_native"].values()):
        raise RunFolderError(f"{path}: field 'impl_native' maps to something other than true/false")
    return meta


def read_meta(run_dir: Path) -> dict:
    path = Path(run_dir) / "meta.json"
    if not path.is_file():
        raise RunFolderError(f"{run_dir} is not a run folder (no meta.json)")
    try:
        meta = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise RunFolderError(f"{path} is not JSON ({e})") from None
    meta = check_meta(path, meta)
    check_schema(Path(run_dir), meta)
    return meta


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _raw(path: Path, text: tuple[str, ...] = ()) -> pd.DataFrame | None:
    """The CSV as pandas reads it (the ``text`` columns as strings), None where the file is
    absent or empty."""
    if not path.exists():
        return None
    if not path.is_file():
        raise RunFolderError(f"{path} is not a file")
    try:
        if path.stat().st_size == 0:
            return None
        return pd.read_csv(path, dtype=dict.fromkeys(text, str) or None)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise RunFolderError(f"{path} is not a CSV table ({first})") from None


def check_table(path: Path, df: pd.DataFrame, table: Table) -> pd.DataFrame:
    """``df`` with its number columns as numbers; RunFolderError naming the file, the column
    and the first row (its line in the file) that breaks the schema."""
    missing = [c for c in table.required if c not in df.columns]
    if missing:
        named = ", ".join(repr(c) for c in missing[:4])
        more = (
            f" and {len(missing) - 4} more of its {len(table.required)}" if len(missing) > 4 else ""
        )
        raise RunFolderError(f"{path}: no column {named}{more}")
    df = df.copy()
    for col in sorted(table.numbers & set(df.columns)):
        df[col] = _numbers(path, df[col], col)
    for col in table.point_ids:
        if col in df.columns:
            _check_ids(path, df[col], col)
    if table.statuses and "status" in df.columns:
        bad = ~df["status"].isin(table.statuses)
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise RunFolderError(
                f"{path}: line {i + 2}: column 'status' is {_short(df['status'].iloc[i])}, "
                f"not {' or '.join(table.statuses)}"
            )
    return df


def _numbers(path: Path, values: pd.Series, col: str) -> pd.Series:
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        return values
    as_numbers = pd.to_numeric(values, errors="coerce")
    bad = as_numbers.isna() & values.notna() & (values.astype(str).str.strip() != "")
    if bad.any():
        i = int(bad.to_numpy().argmax())
        raise RunFolderError(
            f"{path}: line {i + 2}: column {col!r} is {_short(values.iloc[i])}, not a number"
        )
    return as_numbers


def _check_ids(path: Path, ids: pd.Series, col: str) -> None:
    for i, value in enumerate(ids):
        if not is_point_id(value):
            raise RunFolderError(
                f"{path}: line {i + 2}: column {col!r} is {_short(value)}, not a point id "
                f"(letters, digits and _ . = + -)"
            )


def read_table(run_dir: Path, table: Table) -> pd.DataFrame | None:
    """One table of the folder, checked; None where the file is absent or empty."""
    path = Path(run_dir) / table.name
    df = _raw(path)
    return None if df is None else check_table(path, df, table)


def read_results(run_dir: Path, meta: dict | None = None) -> pd.DataFrame:
    """results.csv, every visit, checked against the table of the run's kind (an empty frame
    before the first row)."""
    meta = read_meta(run_dir) if meta is None else meta
    kind = meta.get("kind")
    df = read_table(run_dir, _results_table(columns_of(kind), kind or "training"))
    if df is None:
        return pd.DataFrame()
    if len(df) and "round" not in df:
        df["round"] = 1
    return df


def read_samples(run_dir: Path, kind: str | None = "training") -> pd.DataFrame:
    """samples.csv of a run of ``kind``, checked (an empty frame with its columns where there
    is none)."""
    df = read_table(run_dir, _samples_table(kind or "training"))
    if df is None:
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    if "round" not in df:  # schema 2.0: one round
        df.insert(1, "round", 1)
    if df[["round", "index", "ms"]].isna().any().any():
        col = next(c for c in ("round", "index", "ms") if df[c].isna().any())
        i = int(df[col].isna().to_numpy().argmax())
        raise RunFolderError(
            f"{Path(run_dir) / 'samples.csv'}: line {i + 2}: column {col!r} is empty"
        )
    return df


def read_run(run_dir: Path) -> Run:
    """meta.json, results.csv, samples.csv, noise.csv and, for training runs, the points
    record, each checked against the schema; one-line RunFolderError otherwise."""
    run_dir = Path(run_dir)
    meta = read_meta(run_dir)
    visits = read_results(run_dir, meta)
    samples = read_samples(run_dir, meta.get("kind"))
    noise = read_table(run_dir, NOISE)
    noise = pd.DataFrame(columns=NOISE_COLUMNS) if noise is None else noise
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


def read_verdicts(run_dir: Path) -> pd.DataFrame | None:
    """The run's verdicts (``tied`` as lists of strings), checked; None for a run without
    them (a collectives run, or one made before they were written)."""
    path = Path(run_dir) / VERDICTS_FILE
    if not path.exists():
        return None
    df = _raw(path, text=("best", "default", "value2", "tied"))
    if df is None:  # written with its header even when empty: an empty file is no table
        raise RunFolderError(f"{path} is not a CSV table (an empty file)")
    df = check_table(path, df, VERDICTS)
    df["tied"] = [
        [] if pd.isna(t) or t == "" else str(t).split(TIED_SEP) for t in df["tied"].astype(object)
    ]
    return df


def answers(visits: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """A row per point: its last ok visit (its figures pool every round), else its last
    visit; in the points record's order where there is one, else in the file's."""
    if visits.empty or "point" not in visits:
        return visits
    ok = visits["status"].eq("ok") if "status" in visits else pd.Series(True, index=visits.index)
    ranked = visits.assign(_ok=ok.astype(int), _at=range(len(visits)))
    last = ranked.sort_values(["_ok", "_at"]).drop_duplicates("point", keep="last")
    first_visit = {p: i for i, p in enumerate(dict.fromkeys(visits["point"]))}
    rank = {p: i for i, p in enumerate(order)} if order else first_visit
    last = last.assign(_pos=last["point"].map(lambda p: rank.get(p, len(rank) + first_visit[p])))
    return last.sort_values("_pos").drop(columns=["_ok", "_at", "_pos"]).reset_index(drop=True)


__all__ = ["SCHEMA_VERSION", "RunFolderError"]
