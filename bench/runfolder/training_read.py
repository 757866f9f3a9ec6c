"""The training table's reader columns: figures the reading side computes from results.csv (the
report, the console's closing table), listed so that both name them alike; never written."""

from __future__ import annotations

from bench.runfolder.column import READER, Column

READ: tuple[Column, ...] = (
    Column(
        name="efficiency_pct",
        unit="%",
        ranks=READER,
        meaning="world-size sweeps: speedup / ideal",
        report=7,
        console=19,
    ),
    Column(
        name="compute_share_pct",
        unit="%",
        ranks=READER,
        meaning="compute_ms / window_ms",
        report=19,
    ),
    Column(
        name="typical_ms",
        unit="ms",
        ranks=READER,
        meaning="geometric mean of the rounds' medians",
        report=8,
        console=8,
    ),
    Column(
        name="typical_ms_low",
        unit="ms",
        ranks=READER,
        meaning="its 95 % interval, low end: the rounds' drift "
        "included (or, in one round, the noise floor)",
        report=9,
        console=9,
    ),
    Column(
        name="typical_ms_high",
        unit="ms",
        ranks=READER,
        meaning="its 95 % interval, high end",
        report=10,
        console=10,
    ),
    Column(
        name="best",
        ranks=READER,
        meaning="the console's mark: * the best value per model and implementation, = tied "
        "with it at 95 % (the report shades the rows instead)",
        console=7,
    ),
    Column(
        name="comm_MB",
        unit="MB",
        ranks=READER,
        meaning="comm_bytes_per_step in MB (1e6 bytes), as the console prints it",
        console=15,
    ),
)
