"""What the planner's own runs share: ``bench/run.py`` launched here (the calibration's runs and
``--verify``'s), and a row's configuration in words (console, page, ``verify.csv``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN_PY = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def run_bench(args: list[str], timeout_s: float) -> str:
    """``bench/run.py args`` here: "" when it exits 0, else its output's last line (what a
    one-line error says). A run past ``timeout_s`` raises ``subprocess.TimeoutExpired``."""
    cmd = [sys.executable, str(RUN_PY), *args]
    return outcome(subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s))


def outcome(done: subprocess.CompletedProcess) -> str:
    """ "" for a run that exited 0, else its output's last line (what a one-line error says)."""
    if not done.returncode:
        return ""
    last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return last[0][:300]


def describe(row) -> str:
    """A plan row's configuration: layout, checkpointing, precision, micro-batch x accumulation."""
    return (
        f"{row['config']}, ckpt {row['activation_checkpointing']}, {row['precision']}, "
        f"{row['micro_batch']} x {row['grad_accum']}"
    )
