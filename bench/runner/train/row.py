"""A row of results.csv, typed, and what a visit hands back with it.

``Row`` has one field per column the training table writes, in results.csv's order: its fields
are made from the table (``bench/runfolder/training_columns.py``), where a column is defined, so
that a new column is still one new row of that table. A field is None where the row has no
value (an empty cell); the writer formats every value as it always has (``ResultsWriter``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass, replace

from bench.runfolder import columns
from bench.runfolder.points import PointRecord
from parallel_kernels.float8 import matmul_precision

_Cells = make_dataclass(
    "_Cells",
    [(name, object, field(default=None)) for name in columns.written(columns.TRAINING)],
    frozen=True,
    kw_only=True,
)


class Row(_Cells):
    """One row of results.csv: a field per written column, in the table's order."""

    @classmethod
    def columns(cls) -> list[str]:
        """results.csv's columns, in order: the fields' names."""
        return [f.name for f in fields(cls)]

    @classmethod
    def of(cls, point: PointRecord, **cells) -> Row:
        """A row of ``point``: the columns its record decides, and ``cells``."""
        return cls(**point_columns(point), **cells)

    def cells(self) -> dict:
        """Column -> value for the columns that hold one (what the run's writer takes)."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    def filled_from(self, earlier: dict) -> Row:
        """This row with its empty cells taken from ``earlier`` (an earlier row of the point):
        a later round does not trace again, so it carries the first visit's traced figures,
        its memory and its check against the plain model."""
        empty = {f.name for f in fields(self) if getattr(self, f.name) is None}
        return replace(self, **{k: v for k, v in earlier.items() if k in empty})


def point_columns(point: PointRecord) -> dict:
    """The columns of a row that its record decides, whatever the outcome."""
    second = point.swept[1] if len(point.swept) > 1 else None
    return {
        "sweep": point.sweep,
        "value": point.value,
        "value2": point.values[second] if second else None,
        "impl": point.impl,
        "strategy": point.strategy,
        "model": point.model,
        "point": point.id,
        "world_size": point.world_size,
        "scaling": point.scaling,
        "global_batch": point.global_batch,
        "activation_checkpointing": point.knobs.get("activation_checkpointing"),
        "compile": point.knobs.get("compile"),
        "matmul_precision": matmul_precision(point.knobs),
    }


@dataclass(frozen=True)
class VisitResult:
    """A visit's row and its timed samples: this visit's step times (samples.csv's) and their
    skews (kept for the point's next round), both in ms; none for a failed visit."""

    row: Row
    samples_ms: tuple[float, ...] = ()
    skew_ms: tuple[float, ...] = ()

    @property
    def timed_s(self) -> float:
        """Seconds of timed steps this visit spent."""
        return sum(self.samples_ms) / 1e3

    def as_dict(self) -> dict:
        """The row's cells and its samples (``samples_ms``), as the run's writer takes them."""
        cells = self.row.cells()
        if self.samples_ms:
            cells["samples_ms"] = list(self.samples_ms)
        return cells
