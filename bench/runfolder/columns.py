"""The tables of columns: what each column of results.csv is, and how ranks make it.

Each column is a row with named fields (``column.py``): its name, unit, how the per-rank
figures become the point's figure (``ranks``), whether it belongs to the data contract (the
design notes' columns, listed first in docs/outputs.md) or is an extra, one line of meaning,
and its places in the report's and the console's tables. The tables live in
``training_columns.py``, ``collective_columns.py`` and ``replay_columns.py``; this module
gathers them. The harness aggregates by them, the writer refuses any key they do not list, the
report and the console pick their tables' columns from them, and docs/outputs.md's column list
is made from them (a test keeps the two equal). A new metric is one new row.
"""

from __future__ import annotations

from bench.runfolder.collective_columns import COLLECTIVE
from bench.runfolder.column import Column
from bench.runfolder.replay_columns import REPLAY
from bench.runfolder.training_columns import TRAINING

__all__ = ["COLLECTIVE", "NOISE_COLUMNS", "REPLAY", "SAMPLE_COLUMNS", "TRAINING", "Column"]

# Every timed sample of every point (samples.csv): the slowest rank's time of each timed step
# or iteration, so that runs can be compared on samples rather than on medians.
SAMPLE_COLUMNS = ["point", "round", "index", "ms"]

# noise.csv: the reference workload timed at each gap between points (``gap`` counts them,
# ``after`` names the point before it, empty at a round's start): its median, extremes, count.
NOISE_COLUMNS = ["gap", "round", "after", "ms", "ms_min", "ms_max", "n"]


def written(table: tuple[Column, ...]) -> list[str]:
    """The columns of results.csv, in order: the contract's, then the extras."""
    cols = [c for c in table if c.written]
    return [c.name for c in cols if c.contract] + [c.name for c in cols if not c.contract]


def contract(table: tuple[Column, ...]) -> list[str]:
    return [c.name for c in table if c.contract]


def by_ranks(table: tuple[Column, ...], how: str) -> list[str]:
    return [c.name for c in table if c.ranks == how]


def report_columns(table: tuple[Column, ...]) -> list[str]:
    return [c.name for c in sorted((c for c in table if c.report), key=lambda c: c.report)]


def console_columns(table: tuple[Column, ...]) -> list[str]:
    """The columns of the table a sweep prints when it ends, in their order."""
    return [c.name for c in sorted((c for c in table if c.console), key=lambda c: c.console)]


def quiet_columns(table: tuple[Column, ...], df) -> list[str]:
    """The columns of ``df`` the console leaves out: every row holds the column's ``quiet``
    value (a knob at its default says nothing)."""
    return [
        c.name
        for c in table
        if c.quiet is not None and c.name in df and (df[c.name] == c.quiet).all()
    ]


def markdown(table: tuple[Column, ...]) -> str:
    """The table as docs/outputs.md lists it."""
    lines = ["| column | unit | ranks | contract | meaning |", "|---|---|---|---|---|"]
    lines += [
        f"| `{c.name}` | {c.unit} | {c.ranks} | {'yes' if c.contract else ''} | {c.meaning} |"
        for c in table
    ]
    return "\n".join(lines)


def docs_block() -> str:
    """What docs/outputs.md holds between its column markers (a test keeps them equal)."""
    return (
        "Training sweeps (`results.csv`; ranks: how the ranks' figures become the point's; "
        "`reader` columns are computed by the report, never written):\n\n"
        + markdown(TRAINING)
        + "\n\nThe collective sweep (`--sweep message_size`):\n\n"
        + markdown(COLLECTIVE)
        + "\n\nA replay of a traced job's communication (`python -m bench.replay`):\n\n"
        + markdown(REPLAY)
    )
