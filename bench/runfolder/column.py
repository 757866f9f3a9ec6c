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
RANKS = "ranks"  # every rank's figure, in rank order, joined by ";" (text: a pipeline's stages)
DERIVED = "derived"  # computed from other aggregated columns
READER = "reader"  # computed by the reading side; never written to results.csv


@dataclass(frozen=True, kw_only=True)
class Column:
    name: str
    ranks: str  # how the ranks' figures become the point's (above)
    meaning: str
    unit: str = ""
    contract: bool = False  # part of the data contract (in its order), else an extra
    report: int = 0  # position in the report's table of every point (0: not shown)
    console: int = 0  # position in the table the console prints at a sweep's end (0: not shown)
    # A value that says nothing (a knob at its default): the console leaves the column out of
    # a table whose every row holds it.
    quiet: str | float | None = None
    # A number (the schema's reader refuses any other cell): a figure of the ranks always is;
    # a fact of the point (``POINT``) is text unless its row says it counts something.
    numeric: bool | None = None

    @property
    def number(self) -> bool:
        return (
            self.numeric if self.numeric is not None else self.ranks not in (POINT, READER, RANKS)
        )

    @property
    def written(self) -> bool:
        return self.ranks != READER


# Where every row ran, in each table.
RAN_ON = (
    Column(name="backend", ranks=POINT, meaning="gloo or nccl"),
    Column(name="device", ranks=POINT, meaning="cpu or cuda"),
)
