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
proves, through the same launch, that it fails on a real cost (a step made four times as long:
with 8 cycles under load a cost of half a step read 1.45 [1.02, 1.76], and a doubling 1.98
[1.20, 2.77] with sweeps beside; the interval decides).
The figure is reported, not gated, against the goal.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

REPO = Path(__file__).resolve().parents[2]
GOAL, GATE = 1.02, 1.25


@pytest.fixture(scope="module")
def figures() -> dict:
    """One launch: the recorder on and off, and a third job whose steps are four times as long
    (a sleep of three times the step's own time, so four times however loaded the machine is),
    in the same cycles. Twice as long read 1.98 [1.20, 2.77] with a make sweep and other
    sweeps beside: the load widens the interval past what a doubling can clear. 12 cycles of 2
    steps (the tool's defaults are 24 of 3): the gate and a quadrupled step are distinguished with
    half the cycles, and the launch takes a third of the time."""
    cmd = [sys.executable, "bench/selftime/recorder_cost.py", "--json", "--slow-pct", "300"]
    cmd += ["--cycles", "12", "--block", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gate(f: dict) -> None:
    """Fails only when the whole interval is past the gate: a cost the cycles are sure of."""
    assert f["low"] <= GATE, (
        f"the flight recorder costs {f['ratio']:.3f} [{f['low']:.3f}, {f['high']:.3f}] x a "
        f"step, past the gate {GATE}"
    )


@pytest.mark.timeout(700)
def test_recorder_costs_no_measurable_time(figures, record_property):
    f = figures
    print(
        f"flight recorder on / off, DDP wide_mlp step: {f['ratio']:.3f} [{f['low']:.3f}, "
        f"{f['high']:.3f}] over {f['cycles']} paired cycles (goal <= {GOAL}, gate: the "
        f"interval's low end <= {GATE}); {f['entries_recorded']} entries recorded"
    )
    record_property("fr_on_over_off", f["ratio"])
    assert f["entries_recorded"] > 0  # the recorder was on where it was said to be
    gate(f)


@pytest.mark.timeout(700)
def test_the_gate_fails_on_a_recorder_that_quadruples_a_step(figures):
    slow = figures["slow"]
    print(
        f"a step made four times as long reads {slow['ratio']:.3f} [{slow['low']:.3f}, "
        f"{slow['high']:.3f}]"
    )
    with pytest.raises(AssertionError, match=r"the flight recorder costs .* past the gate"):
        gate(slow)
