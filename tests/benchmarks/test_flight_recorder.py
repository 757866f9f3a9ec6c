"""What the flight recorder costs a DDP step: both sides in one launch, interleaved block by
block, the paired ratio gated (``bench/selftime/recorder_cost.py`` says how). Load beside the
launch falls on both blocks of a cycle and cancels in its ratio, so the gate fails only on a
cost the interval is sure of; the goal is <= 1.02, printed for the note.

The gate is on the interval's low end: the recorder must be shown to cost more than ``GATE``.
Two processes' steps differ by several percent whatever the recorder does (placement, memory
layout: the A/A run, ``--aa``, both jobs with the recorder on, gave 0.930, 1.011 and 1.114 in
three launches here, the last one's interval [1.049, 1.280]; on/off gave 0.84 to 1.08 over seven
launches), so the gate sits past that spread: it catches a recorder that costs a quarter of a
step (per-call stack capture or symbolisation, a lock), not a few percent; the second test
proves it fails on such a cost. The figure is reported, not gated, against the goal.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOAL, GATE = 1.02, 1.25


def recorder_cost(*args: str) -> dict:
    cmd = [sys.executable, "bench/selftime/recorder_cost.py", "--json", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gate(f: dict) -> None:
    """Fails only when the whole interval is past the gate: a cost the cycles are sure of."""
    assert f["low"] <= GATE, (
        f"the flight recorder costs {f['ratio']:.3f} [{f['low']:.3f}, {f['high']:.3f}] x a "
        f"step, past the gate {GATE}"
    )


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_recorder_costs_no_measurable_time(record_property):
    f = recorder_cost()
    print(
        f"flight recorder on / off, DDP wide_mlp step: {f['ratio']:.3f} [{f['low']:.3f}, "
        f"{f['high']:.3f}] over {f['cycles']} paired cycles (goal <= {GOAL}, gate: the "
        f"interval's low end <= {GATE}); {f['entries_recorded']} entries recorded"
    )
    record_property("fr_on_over_off", f["ratio"])
    assert f["entries_recorded"] > 0  # the recorder was on where it was said to be
    gate(f)


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_the_gate_fails_on_a_recorder_that_costs_half_a_step():
    # a sleep of half the step's own time: half a step, however loaded the machine is
    f = recorder_cost("--cycles", "8", "--slow-pct", "50")
    with pytest.raises(AssertionError, match=r"the flight recorder costs .* past the gate"):
        gate(f)
