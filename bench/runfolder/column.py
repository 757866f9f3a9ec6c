"""What a column is: its name, unit, how the ranks' figures become the point's figure, whether it
belongs to the data contract, its meaning and its place in the report (``columns.py`` holds the
tables of them)."""

from __future__ import annotations

from dataclasses import dataclass

# How the ranks' figures become a point's figure:
POINT = "point"  # the same on every rank: a fact of the point or of its outcome
TIMED = "timed"  # already cross-rank: the timing all-reduces each step's first start and last end
MEAN = "mean"  # mean over ranks (NaN where a rank has none)
MAX = "max"  # largest over ranks (memory: the rank that needs most)
DERIVED = "derived"  # computed from other aggregated columns
READER = "reader"  # computed by the reading side; never written to results.csv


@dataclass(frozen=True)
class Column:
    name: str
    unit: str
    ranks: str
    contract: bool  # part of the data contract (in its order) or an extra
    meaning: str
    report: int = 0  # position in the report's table of every point (0: not shown)

    @property
    def written(self) -> bool:
        return self.ranks != READER


def col(name, unit, ranks, contract, meaning, report=0) -> Column:
    return Column(name, unit, ranks, contract, meaning, report)


# Where every row ran, in each table.
RAN_ON = (
    col("backend", "", POINT, False, "gloo or nccl"),
    col("device", "", POINT, False, "cpu or cuda"),
)
