"""A point being run on this rank, from its build to its row (``lifecycle.py`` runs it).

A round's visit is one candidate; a cohort has several, alive side by side. The candidate holds
what the stages hand on: its process group, its trainer, its clock, its check against the plain
model, its samples, and its error once it failed.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from bench.runfolder.points import PointRecord
from bench.runner.faults import watchdog
from bench.runner.measure.timing import Budget, Clock
from bench.runner.session.distenv import synchronize
from parallel_kernels.groups import point_group, set_point_group

ROUNDS, PAIRED = "rounds", "paired"  # how a point was timed (results.csv's ``method``)


@dataclass(frozen=True, kw_only=True)
class Visit:
    """What a visit brings from the point's earlier rounds: its round, their samples (every
    member rank holds the same, all-reduced), and whether to profile it (its first visit that
    finishes: traces, their breakdown and memory are made once per point). ``budget``: its
    timed steps' when timed alone (None: a cohort's candidate, timed in cycles)."""

    budget: Budget | None = None
    round: int = 1
    prior_times: tuple[float, ...] = ()  # step times (first start to last end)
    prior_skew: tuple[float, ...] = ()  # last end - first end per step
    prior_medians: tuple[float, ...] = ()  # each earlier round's median
    profile: bool = True


@dataclass
class Candidate:
    """A point on this rank while it runs: what each stage leaves for the next."""

    point: PointRecord
    trace_dir: Path  # the point's traces/<id>/
    visit: Visit = field(default_factory=Visit)
    method: str = ROUNDS  # results.csv's ``method``
    cohort: str | None = None  # results.csv's ``cohort``: its cohort's name (None: in rounds)
    group: dist.ProcessGroup | None = None
    trainer: object = None
    clock: Clock | None = None
    peak: tuple | None = None  # MFU's peaks, timed before the model held memory
    checked: str | None = None  # what its check against the plain model returned
    compile_s: float | None = None  # compile_seconds: its first warm-up step less its last
    compiled_at: int = 0  # dynamo's count of compiled frames when its warm-up ended
    recompiled: int = 0  # frames dynamo compiled while its steps were timed
    alone: list[float] = field(default_factory=list)  # a cohort's: steps timed alone
    times: list[float] = field(default_factory=list)  # a cohort's: its step in each cycle
    skew: list[float] = field(default_factory=list)
    data_ms: list[float] = field(default_factory=list)  # putting each step's data on the device
    error: str | None = None
    written: bool = False  # its row is in results.csv
    active: bool = True  # still in the cycles (``racing.py``: a decided one leaves)
    stop: str = ""  # why it left the cycles (results.csv's ``stop``)
    # an effect of known size for selftime (bench/selftime/paired_power.py): each timed step
    # made this % longer, by a spin of that share of the candidate's last step
    slow_pct: float = 0.0

    def step(self, *inputs) -> None:
        """One step of its trainer."""
        self.step_of(self.trainer, *inputs)

    def step_of(self, trainer, *inputs) -> None:
        """One step of ``trainer`` (its own, or the build its memory is measured on): a job
        cancelled ends it here, and the model's own collectives go to the point's group."""
        watchdog.check_terminated()
        outside = point_group()
        set_point_group(self.group)
        try:
            trainer.step(*inputs)
        finally:
            set_point_group(outside)
        if self.slow_pct and (self.times or self.alone):
            # a spin, not a sleep: a sleep of a fraction of a millisecond overshoots by more
            # than itself on a loaded machine; the spin is exact, as a slower kernel would be
            until = time.perf_counter() + self.slow_pct / 100 * (self.times or self.alone)[-1] / 1e3
            while time.perf_counter() < until:
                pass

    def fetch(self) -> None:
        """The next step's data onto the device, untimed but timed apart (``data_ms``)."""
        t0 = time.perf_counter()
        self.trainer.fetch()
        synchronize(self.trainer.device)
        self.data_ms.append((time.perf_counter() - t0) * 1e3)

    def drop(self) -> None:
        """It failed: its group goes at once (members still waiting in it wake: gloo has no
        other way to wake them) and its model with it."""
        if self.group is not None:
            dist.destroy_process_group(self.group)
            self.group = None
        self.trainer = None
        gc.collect()
