"""One run's configuration: every setting of ``bench/run.py``, typed, frozen, with its default
written here once.

The command line (``bench/runner/cli.py``) builds it once from argv and passes it down; nothing
below the command line reads an argparse namespace. A self-launched run hands the ranks this
configuration and the resolved points as JSON (``Resolved``), so that they neither parse nor
resolve again. Field names are the command line's own (``--max-point-s`` -> ``max_point_s``):
meta.json's ``config`` holds them, and ``--resume`` compares the ``same_run`` ones.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from bench.runfolder.points import PointRecord
from bench.stats.paired import TIE_BAND_PCT

# Training sweeps repeat every point this many rounds; the message-size sweep once (it repeats
# sizes adaptively instead).
DEFAULT_ROUNDS = 3
# Timed steps per point (--max-steps): a training sweep's, all rounds together (an interleaved
# cohort shares its candidates' steps, so short steps can cycle until their seconds run out);
# the message-size sweep's iterations per size.
TRAINING_MAX_STEPS, COLLECTIVE_MAX_STEPS = 600, 60
# --interleave: always (where the candidates can share the launch), where their state fits, never
INTERLEAVE = ("on", "auto", "off")


def _same_run(default: Any = None) -> Any:
    """A setting that makes two launches the same run: --resume refuses a run made with
    another value of it."""
    return field(default=default, metadata={"same_run": True})


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    # what is swept
    sweep: str = _same_run("")
    values: str | None = _same_run()
    values2: str | None = _same_run()
    model: str | None = _same_run()
    impl: str | None = _same_run()
    strategy: str | None = _same_run()
    scaling: str | None = _same_run()
    option: tuple[str, ...] | None = _same_run()
    # where the run goes
    out: Path | None = None
    resume: bool = False
    reports_dir: Path = Path("reports")
    no_report: bool = False
    predict_with: tuple[Path, ...] | None = None
    # what every visit of a point does
    batch_size: int = _same_run(64)
    clip_grad_norm: float | None = _same_run()
    warmup_steps: int = _same_run(5)
    steps: int = _same_run(10)
    # how long a point is timed, and the rounds (None: DEFAULT_ROUNDS, or 1 for message_size;
    # max_steps None: TRAINING_MAX_STEPS, or COLLECTIVE_MAX_STEPS for message_size)
    target_ci_pct: float = _same_run(2.0)
    max_steps: int | None = _same_run()
    max_point_s: float = _same_run(8.0)
    rounds: int | None = _same_run()
    seed: int = _same_run(0)
    budget: float | None = None  # seconds: the whole sweep's wall time, None: unbounded
    # candidates of one model timed in cycles within the launch (auto: where their state fits)
    interleave: str = _same_run("auto")
    tie_band_pct: float = _same_run(TIE_BAND_PCT)  # a paired interval within +-this %: a tie
    # how the job runs
    profile_steps: int = _same_run(3)
    point_timeout: float = 300.0
    debug: bool = False
    backend: str = _same_run("auto")
    nproc_per_node: int | None = None
    # the message_size sweep (after nccl-tests)
    min_bytes: str = _same_run("1K")
    max_bytes: str = _same_run("64M")
    factor: str = _same_run("2")
    iters: int = _same_run(20)
    warmup_iters: int = _same_run(5)
    check: int = _same_run(1)
    dtype: str = _same_run("float32")
    op: str = _same_run("sum")
    collectives: str | None = _same_run()
    # the command line as given (meta.json's ``argv``)
    argv: tuple[str, ...] = ()

    def settings(self) -> dict[str, Any]:
        """Every setting as JSON holds it (meta.json's ``config``): paths as strings, tuples
        as lists; the command line itself is meta.json's ``argv``."""
        return json.loads(
            json.dumps({k: v for k, v in asdict(self).items() if k != "argv"}, default=str)
        )

    def run_settings(self) -> dict[str, Any]:
        """The settings that make two launches the same run, as JSON holds them."""
        settings = self.settings()
        return {f.name: settings[f.name] for f in fields(self) if f.metadata.get("same_run")}

    @classmethod
    def from_settings(cls, data: dict[str, Any]) -> RunConfig:
        """The inverse of ``settings`` (plus ``argv``): what a self-launched rank reads."""
        data = dict(data)
        for name in ("out", "reports_dir"):
            if data.get(name) is not None:
                data[name] = Path(data[name])
        for name in ("option", "argv"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        if data.get("predict_with") is not None:
            data["predict_with"] = tuple(Path(p) for p in data["predict_with"])
        return cls(**data)


# The defaults, for the command line's help and for what each visit of a point does
# (``resolve.VisitSettings``).
DEFAULTS = RunConfig()


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """What the command line hands the ranks: the configuration, and either the training
    points or the message-size sweep's plan (its fields), each resolved once."""

    config: RunConfig
    points: tuple[PointRecord, ...] = ()
    collective_plan: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": {**self.config.settings(), "argv": list(self.config.argv)},
            "points": [asdict(p) for p in self.points],
            "collective_plan": self.collective_plan,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Resolved:
        return cls(
            config=RunConfig.from_settings(data["config"]),
            points=tuple(PointRecord.from_dict(p) for p in data["points"]),
            collective_plan=data["collective_plan"],
        )


def runs_to_json(runs: list[Resolved]) -> str:
    """What one launch hands its ranks: runs they make one after the other (the planner's
    calibration: its collectives, then its training points), each into its own folder."""
    return json.dumps([r.to_dict() for r in runs])


def runs_from_json(text: str) -> list[Resolved]:
    """``runs_to_json``'s runs, or a ValueError (KeyError, TypeError) for what it did not write."""
    data = json.loads(text)
    if not isinstance(data, list) or not data:
        raise ValueError("not a list of runs")
    return [Resolved.from_dict(d) for d in data]
