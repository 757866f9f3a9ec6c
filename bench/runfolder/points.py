"""The points record of a run folder (``points.jsonl``): each point resolved once, in full.

The running side resolves everything a point is before it runs
(``bench/runner/configure/resolve.py``): sweep and swept values, model, strategy, implementation
with its facts, every knob with its value and default, world size and ranks, batch, steps, and the
inputs of its expected figures. It writes one JSON line per point; the reading side (report,
comparison, analysis, cost model) takes these records and nothing of the running side's tables, so
that a run folder keeps its meaning after the code that wrote it has moved on.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bench.runfolder.atomic import write_text

POINTS_FILE = "points.jsonl"
# A point id is folder-safe: the report reads ``traces/<id>/`` and writes pages named by it, so
# an id that could climb out of the run folder (``x/../..``) is refused wherever it is read.
POINT_ID = re.compile(r"[A-Za-z0-9_.=+-]+")


def is_point_id(value: object) -> bool:
    return isinstance(value, str) and bool(POINT_ID.fullmatch(value)) and value not in (".", "..")


# The fields of a record the reading side computes with, and the JSON types each must hold.
RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "sweep": (str,),
    "model": (str,),
    "strategy": (str,),
    "impl": (str,),
    "schedule": (str,),
    "swept": (list,),
    "values": (dict,),
    "swept_defaults": (dict,),
    "impl_facts": (dict,),
    "knobs": (dict,),
    "defaults": (dict,),
    "figures": (dict,),
    "world_size": (int,),
    "ranks": (list,),
    "dp_size": (int,),
    "tp_size": (int,),
    "batch_per_replica": (int,),
    "steps": (int,),
    "warmup_steps": (int,),
    "profile_steps": (int,),
    "global_batch": (int, type(None)),
    "verdict_group": (str,),
}


class RunFolderError(ValueError):
    """A folder that cannot be read as a run; the message is one line that says why."""


def same_value(a, b) -> bool:
    """Two swept values are the same: as numbers where both read as numbers (25 and "25.0"
    from a CSV), else as text; None is no value."""
    if a is None or b is None:
        return False
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


@dataclass(frozen=True, kw_only=True)
class PointRecord:
    id: str  # folder-safe, unique within a run: ``wide_mlp-bucket_cap_mb=25-native``
    sweep: str  # the sweep's name; a grid's is its knobs joined by commas
    swept: tuple[str, ...]  # the sweeps (axes) varied, in order (two for a grid)
    value: Any  # the first swept value (what results.csv's ``value`` holds)
    values: dict[str, Any]  # every swept axis (a sweep's name) -> its value here
    # each swept axis -> the default of the knob it varies (None: an axis of its own, such as
    # mesh layouts or world sizes): what the report compares the best value with
    swept_defaults: dict[str, Any]
    model: str
    strategy: str
    impl: str
    impl_facts: dict[str, Any]  # the implementation's row (parallel_kernels/strategies.py)
    schedule: str  # how the cost model schedules a step of the strategy: ddp, fsdp, tp
    knobs: dict[str, Any]  # every knob of the strategy and of the step, with its value
    defaults: dict[str, Any]  # the same knobs' defaults
    autocast: str | None  # dtype the forward runs under torch.autocast in, or None
    world_size: int  # ranks the point runs on (its first ``world_size`` ranks)
    ranks: tuple[int, ...]
    dp_size: int  # data-parallel replicas (ranks / TP degree)
    tp_size: int
    scaling: str | None = None  # world-size sweeps: weak or strong
    global_batch: int | None = None  # strong scaling: one global batch split over replicas
    batch_per_replica: int
    steps: int
    warmup_steps: int
    profile_steps: int
    # The inputs of the analytical figures, from the plain model's shapes: params, grad_bytes,
    # tokens_per_sample; fsdp_unit_bytes (fp32 bytes per FSDP unit in forward order, the
    # root's own parameters first); tp_comm_calls ([collective, phase, elements] per TP call
    # of one step); comm_bytes_expected, state_bytes_expected (or None where they do not apply).
    figures: dict[str, Any] = field(default_factory=dict)
    # The candidates an interleaved cohort's paired verdict compares it with
    # (bench/runner/train/racing.py): empty, its implementation's points at its grid value (a
    # sweep's); named, every point of the run that names the same (a plan's verification,
    # whose configurations are of several implementations and compared with each other).
    verdict_group: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @property
    def is_default(self) -> bool:
        """Its first swept axis holds that knob's default (the value whose cost a verdict
        states over the best)."""
        axis = self.swept[0]
        return same_value(self.values.get(axis), self.swept_defaults.get(axis))

    @classmethod
    def from_dict(cls, data: dict) -> PointRecord:
        """A record from its JSON; fields a newer minor version added are left aside."""
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names}
        for key, types in RECORD_TYPES.items():
            value = kwargs.get(key)
            if key in kwargs and (not isinstance(value, types) or isinstance(value, bool)):
                raise RunFolderError(
                    f"field {key!r} is {type(value).__name__}, not {types[0].__name__}"
                )
        if "id" in kwargs and not is_point_id(kwargs["id"]):
            raise RunFolderError(f"point id {kwargs['id']!r} is not folder-safe")
        for key in ("swept", "ranks"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise RunFolderError(f"a point record is incomplete ({e})") from None


def write_points(path: Path, points: list[PointRecord]) -> None:
    """All of a run's points, written once before the first runs (atomic, like meta.json)."""
    write_text(path, "".join(p.to_json() + "\n" for p in points))


def read_points(run_dir: Path) -> dict[str, PointRecord]:
    """The run's point records by id; RunFolderError (one line) when missing or corrupt."""
    path = Path(run_dir) / POINTS_FILE
    if not path.is_file():
        raise RunFolderError(f"{run_dir} has no points record ({POINTS_FILE})")
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except ValueError as e:
            raise RunFolderError(f"{path}:{n} is not JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise RunFolderError(f"{path}:{n} is not a point record")
        try:
            rec = PointRecord.from_dict(data)
        except RunFolderError as e:
            raise RunFolderError(f"{path}:{n}: {e}") from None
        out[rec.id] = rec
    return out
