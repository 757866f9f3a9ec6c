"""The machine's noise floor: a fixed reference workload timed between points.

Whatever is swept, this workload never changes, so the spread of its median from one gap to the
next is the machine's own wander (other tenants, clocks, the scheduler): an effect smaller than
it cannot be told from noise by a single visit per point. The run records each gap's median in
noise.csv; the reading side turns them into the floor and warns when the sweep's effects are
smaller (``bench.stats.estimates.floor_variance``). Every rank runs it at once, as a point's
ranks do, and a repetition lasts from the first rank's start to the last rank's end, as a
step does.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bench.runner.measure.timing import timed_steps
from bench.runner.session.distenv import DistEnv

REPS = 20  # timed repetitions per gap (about 40 ms on the 2-core CPU machine)


def reference_workload(device: torch.device) -> Callable[[], None]:
    """Eight products of a fixed square matrix: about 2 ms on one CPU core, and a fraction of a
    millisecond on a GPU (larger there, so that launch latency does not dominate)."""
    n = 2048 if device.type == "cuda" else 256
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device)
    out = torch.empty_like(a)

    def run() -> None:
        for _ in range(8):
            torch.mm(a, a, out=out)

    return run


class NoiseFloor:
    """Times the reference workload at each gap between points."""

    def __init__(self, env: DistEnv) -> None:
        self.env = env
        self.work = reference_workload(env.device)
        self.work()  # first call: allocation and kernel selection, not the machine

    def measure(self) -> dict:
        times, _ = timed_steps(self.work, REPS, device=self.env.device, group=None)
        return {
            "ms": float(np.median(times)),
            "ms_min": float(times.min()),
            "ms_max": float(times.max()),
            "n": REPS,
        }
