"""A pipeline's step simulated over its schedule: each stage runs its forwards and backwards in
the order ``parallel_kernels.pipeline_theory`` writes for it, and an action starts when its
stage is free and what it needs has arrived.

- F of micro-batch i on stage s (s > 0) waits for stage s - 1's F of i and the send of its
  output over the link between the two (``StagedPipeline.send_ms``);
- B of i on stage s (s < p - 1) waits for stage s + 1's B of i and the send of the gradient of
  that activation back, the same bytes;
- the last stage's B follows its own F, which its order puts first.

A send is posted as its tensor is made and does not hold its stage (the reference schedules'
sends, ``parallel_kernels/pipeline_schedule.py``), so a stage idles only waiting for what it
receives: the schedule's bubble, with unequal stages and slow links what the theory's
(p - 1) / (m + p - 1) leaves out. With equal stages and free links it is that exactly (a test).
Torch-free arithmetic, as ``pipeline_theory`` is; the planner prices the actions
(``bench/plan/pipeline_time.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_kernels.pipeline_theory import BACKWARD, FORWARD, Pipeline, schedule_order


@dataclass(frozen=True)
class StageCost:
    """One micro-batch's forward and backward on a stage, ms."""

    forward_ms: float
    backward_ms: float


@dataclass(frozen=True)
class StagedPipeline:
    """What the simulation runs: the schedule, its micro-batches a step, each stage's costs in
    pipeline order, and the send between stage s and s + 1 of one micro-batch's activation (or
    of its gradient back), ms."""

    schedule: str
    microbatches: int
    stages: tuple[StageCost, ...]
    send_ms: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.send_ms) != len(self.stages) - 1:
            raise ValueError(
                f"{len(self.stages)} stages have {len(self.stages) - 1} links between them, "
                f"got {len(self.send_ms)} send times"
            )


@dataclass(frozen=True)
class Span:
    kind: str  # FORWARD or BACKWARD
    micro: int
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class PipelineTimeline:
    """Each stage's actions as they ran, in its order, from the step's start at 0."""

    spans: tuple[tuple[Span, ...], ...]

    @property
    def makespan_ms(self) -> float:
        """From the step's start to the end of the last action of any stage."""
        return max(s[-1].end_ms for s in self.spans)

    def busy_ms(self, stage: int) -> float:
        return sum(s.end_ms - s.start_ms for s in self.spans[stage])

    def bubble(self, stage: int) -> float:
        """The share of the makespan stage ``stage`` idles."""
        return 1.0 - self.busy_ms(stage) / self.makespan_ms

    def mean_bubble(self) -> float:
        return sum(self.bubble(s) for s in range(len(self.spans))) / len(self.spans)

    def most_in_flight(self, stage: int) -> int:
        """The most micro-batches whose forward had run on ``stage`` and backward not yet."""
        live = peak = 0
        for span in self.spans[stage]:
            live += 1 if span.kind == FORWARD else -1
            peak = max(peak, live)
        return peak


def _needs(run: StagedPipeline, stage: int, kind: str, micro: int) -> tuple[int, str] | None:
    """The action of another stage that ``kind`` of ``micro`` on ``stage`` waits for."""
    if kind == FORWARD and stage > 0:
        return stage - 1, FORWARD
    if kind == BACKWARD and stage < len(run.stages) - 1:
        return stage + 1, BACKWARD
    return None


def simulate_pipeline(run: StagedPipeline) -> PipelineTimeline:
    """Every stage's actions in its schedule's order, each at the earliest its stage and its
    input allow; a ValueError where the orders wait on each other for ever (no valid
    schedule does)."""
    p, m = len(run.stages), run.microbatches
    orders = [schedule_order(run.schedule, Pipeline(p, m), s) for s in range(p)]
    done: dict[tuple[int, str, int], float] = {}
    spans: list[list[Span]] = [[] for _ in range(p)]
    free = [0.0] * p
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for s, order in enumerate(orders):
            while len(spans[s]) < len(order):
                action = order[len(spans[s])]
                needs = _needs(run, s, action.kind, action.micro)
                ready = 0.0
                if needs is not None:
                    other, kind = needs
                    if (other, kind, action.micro) not in done:
                        break
                    link = min(s, other)
                    ready = done[(other, kind, action.micro)] + run.send_ms[link]
                cost = run.stages[s]
                ms = cost.forward_ms if action.kind == FORWARD else cost.backward_ms
                start = max(free[s], ready)
                free[s] = start + ms
                done[(s, action.kind, action.micro)] = free[s]
                spans[s].append(Span(action.kind, action.micro, start, free[s]))
                left -= 1
                moved = True
        if not moved:
            raise ValueError(f"the {run.schedule} orders of {p} stages wait on each other")
    return PipelineTimeline(tuple(tuple(s) for s in spans))
