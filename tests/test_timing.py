"""The step's timing on a common clock, on live ranks with known stragglers and a known clock
offset: a step lasts from the first rank's start to the last rank's end, and the skew is the
spread of the ends."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.ranks

OFFSET_S = 1000.0  # rank 1's clock runs this far ahead of rank 0's (injected)
SLEEP_S = 0.02


def _clock_cases() -> dict:
    """On each rank: the offset estimated for a clock shifted by OFFSET_S on rank 1, and the
    step times of a 1 ms step read on that clock with and without the estimate."""
    import time

    import numpy as np
    import torch
    import torch.distributed as dist

    from bench.runner.measure.timing import Clock, common_clock, timed_steps

    cpu = torch.device("cpu")
    shift = OFFSET_S if dist.get_rank() == 1 else 0.0

    def shifted() -> float:
        return time.perf_counter() + shift

    clock = common_clock(None, cpu, read=shifted)

    def step() -> None:
        time.sleep(0.001)

    common, _ = timed_steps(step, 5, device=cpu, group=None, clock=clock)
    raw, _ = timed_steps(step, 5, device=cpu, group=None, clock=Clock(shifted))
    return {
        "offset_s": clock.offset_s,
        "round_trip_s": clock.round_trip_s,
        "common_ms": float(np.median(common)),
        "raw_ms": float(np.median(raw)),
    }


@pytest.mark.timeout(120)
def test_the_common_clock_cancels_a_clock_offset(pool):
    r0, r1 = pool(2).run(_clock_cases)
    assert r0["offset_s"] == 0.0
    # within the round trip of the best ping (Cristian's bound is half of it)
    assert r1["offset_s"] == pytest.approx(-OFFSET_S, abs=max(r1["round_trip_s"], 1e-4))
    assert r1["round_trip_s"] < 0.05
    assert r0["common_ms"] == r1["common_ms"]  # every rank gets the same all-reduced times
    assert 1.0 <= r0["common_ms"] < 50  # a 1 ms step, barrier exits apart by little
    assert r0["raw_ms"] > 1e5  # without the offset, the ranks' times do not compare


def _straggler_cases() -> dict:
    """A step of one all-reduce, with rank 1 sleeping SLEEP_S after it (its ends are late) or
    before it (the others wait in the all-reduce: every end is late together)."""
    import time

    import numpy as np
    import torch
    import torch.distributed as dist

    from bench.runner.measure.timing import common_clock, timed_steps

    cpu = torch.device("cpu")
    x = torch.ones(1000)
    late = dist.get_rank() == 1

    def after() -> None:
        dist.all_reduce(x)
        if late:
            time.sleep(SLEEP_S)

    def before() -> None:
        if late:
            time.sleep(SLEEP_S)
        dist.all_reduce(x)

    clock = common_clock(None, cpu)
    out = {}
    for name, step in (("after", after), ("before", before)):
        times, skew = timed_steps(step, 8, device=cpu, group=None, clock=clock)
        out[name] = (float(np.median(times)), float(np.median(skew)))
    return out


@pytest.mark.timeout(120)
def test_a_straggler_shows_in_the_skew_and_the_step(pool):
    r0, r1 = pool(2).run(_straggler_cases)
    assert r0 == r1
    ms = SLEEP_S * 1e3
    step, skew = r0["after"]
    # Rank 0 finishes right after the all-reduce and waits for rank 1: the skew is the sleep.
    # (Per-rank durations without a barrier per step give ~0 here: rank 0's next all-reduce
    # waits for rank 1, so both ranks' durations are equal.)
    assert ms * 0.8 < skew < ms * 2, skew
    assert step >= ms and step < ms * 3, step
    step, skew = r0["before"]
    # The sleep is before the collective: both ranks end together, the step holds the sleep.
    assert skew < ms * 0.5, skew
    assert step >= ms and step < ms * 3, step
