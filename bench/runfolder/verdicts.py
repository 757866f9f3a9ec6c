"""``verdicts.csv``: a training run's answers, machine-readable, a row per model and
implementation (and grid value): the best value, the values tied with it, the default and its
cost over the best with the interval, and the method the verdict came from.

Written once the sweep is done, by the reading side's answers (``bench/report/answers.py``),
from what the folder holds; ``--baseline`` reads both runs' (``schema.read_verdicts``) to say
whether the answer moved.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bench.runfolder.atomic import write_with

VERDICTS_FILE = "verdicts.csv"
VERDICTS_COLUMNS = [
    "model",
    "impl",
    "value2",  # a grid's second value (empty outside grids)
    "best",  # the fastest value
    "best_ms",  # its typical step time
    "tied",  # the best and the values tied with it at 95 % (Bonferroni), ";"-joined
    "n_values",
    "default",  # the swept knob's default, where the sweep visited it
    "default_ratio",  # its typical time over the best's, with the 95 % interval
    "default_low",
    "default_high",
    "default_tied",
    "method",  # rounds: the rounds' medians against each other; paired: per-cycle ratios
    "cycles",  # paired comparisons: the cycles timed (empty for rounds)
    "floor_pct",  # the machine's noise floor, % (the run's noise.csv)
]
TIED_SEP = ";"


def write_verdicts(run_dir: Path, table: pd.DataFrame) -> Path:
    """The table (VERDICTS_COLUMNS), atomically: a reader never sees half a file."""
    table = table.reindex(columns=VERDICTS_COLUMNS)
    return write_with(Path(run_dir) / VERDICTS_FILE, lambda f: table.to_csv(f, index=False))
