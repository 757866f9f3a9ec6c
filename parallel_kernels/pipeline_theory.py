"""A pipeline schedule as arithmetic: the order in which a stage runs its micro-batches'
forwards and backwards, the schedule's theoretical bubble, the point-to-point bytes a stage
sends in one step (one stage a rank, or any placement of the stages: ``p2p_bytes_by_rank``),
and the most micro-batches' activations a stage holds at once.

Torch-free, so that the reference schedules (``pipeline_schedule.py``) run exactly the order
written here and a planner can price a pipeline without building one. Formulas after GPipe
(Huang et al. 2019) and 1F1B as Megatron-LM runs it (Narayanan et al. 2021, section 2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

FORWARD = "F"
BACKWARD = "B"


@dataclass(frozen=True)
class Pipeline:
    """p stages, m micro-batches a step, v stages a rank (``per_rank`` > 1: interleaved)."""

    stages: int
    microbatches: int
    per_rank: int = 1

    def __post_init__(self) -> None:
        for name in ("stages", "microbatches", "per_rank"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"a pipeline's {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class Action:
    """One step of a stage's order: the forward (``F``) or backward (``B``) of a micro-batch."""

    kind: str
    micro: int


def _check_stage(pipe: Pipeline, stage: int) -> None:
    if not 0 <= stage < pipe.stages:
        raise ValueError(f"stage {stage!r} is not one of the pipeline's {pipe.stages} stages")


def gpipe_order(pipe: Pipeline, stage: int) -> tuple[Action, ...]:
    """GPipe: every micro-batch's forward, then every backward in the same order."""
    _check_stage(pipe, stage)
    m = pipe.microbatches
    forwards = tuple(Action(FORWARD, i) for i in range(m))
    return forwards + tuple(Action(BACKWARD, i) for i in range(m))


def one_f_one_b_order(pipe: Pipeline, stage: int) -> tuple[Action, ...]:
    """1F1B: a warm-up of p - stage - 1 forwards (fewer when m is smaller), then one forward
    and one backward in turn, then the cool-down's backwards. A stage never holds more than
    p - stage micro-batches' activations, where GPipe holds all m."""
    _check_stage(pipe, stage)
    m = pipe.microbatches
    warmup = min(pipe.stages - stage - 1, m)
    order = [Action(FORWARD, i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [Action(FORWARD, warmup + i), Action(BACKWARD, i)]
    order += [Action(BACKWARD, i) for i in range(m - warmup, m)]
    return tuple(order)


SCHEDULES = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order}


def schedule_order(schedule: str, pipe: Pipeline, stage: int) -> tuple[Action, ...]:
    """The order a stage of a named schedule (``SCHEDULES``) runs its actions in."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    return SCHEDULES[schedule](pipe, stage)


def most_in_flight(order: tuple[Action, ...]) -> int:
    """The most micro-batches whose forward has run and backward not yet, along an order."""
    live = peak = 0
    for action in order:
        live += 1 if action.kind == FORWARD else -1
        peak = max(peak, live)
    return peak


def max_in_flight(schedule: str, pipe: Pipeline, stage: int) -> int:
    """The most micro-batches' activations a stage holds: m for GPipe, min(m, p - stage) for
    1F1B (the first stage holds the most, which is why 1F1B's memory does not grow with m)."""
    _check_stage(pipe, stage)
    if schedule == "gpipe":
        return pipe.microbatches
    if schedule == "1f1b":
        return min(pipe.microbatches, pipe.stages - stage)
    raise ValueError(f"unknown pipeline schedule {schedule!r} (known: {', '.join(SCHEDULES)})")


def bubble_fraction(pipe: Pipeline) -> float:
    """The share of a step a stage idles, all stages' forwards and backwards taking equal
    time: (p - 1) / (v m + p - 1). GPipe and 1F1B (v = 1) share it, since 1F1B reorders the
    same work; interleaving v stages a rank divides the fill and drain by v."""
    p, m, v = pipe.stages, pipe.microbatches, pipe.per_rank
    return (p - 1) / (v * m + p - 1)


def p2p_bytes_per_step(pipe: Pipeline, stage: int, received: int, sent: int) -> int:
    """The bytes a stage sends in one step, ``received`` and ``sent`` being the bytes of the
    activation it receives and sends per micro-batch: its output to the next stage in every
    forward (none from the last) and the gradient of its input, the received activation's
    size, to the previous stage in every backward (none from the first)."""
    _check_stage(pipe, stage)
    if received < 0 or sent < 0:
        raise ValueError(f"activation bytes must be 0 or more, got {received} and {sent}")
    forward = sent if stage < pipe.stages - 1 else 0
    backward = received if stage > 0 else 0
    return pipe.microbatches * (forward + backward)


def p2p_bytes_by_rank(
    microbatches: int, owners: tuple[int, ...], boundaries: tuple[int, ...]
) -> dict[int, int]:
    """The bytes each rank sends in one step, for any placement of the stages: ``owners[s]``
    is the rank that holds stage s (one stage a rank: ``range(p)``; interleaved: several a
    rank), ``boundaries[s]`` the bytes per micro-batch of what stage s hands stage s + 1. In
    every forward stage s sends its output to s + 1, in every backward s + 1 sends the gradient
    of that input back; two stages of one rank hand theirs over without a send.
    ``p2p_bytes_per_step`` is the case of one stage a rank."""
    if len(boundaries) != len(owners) - 1:
        raise ValueError(
            f"{len(owners)} stages have {len(owners) - 1} boundaries, got {len(boundaries)}"
        )
    if microbatches < 1 or any(b < 0 for b in boundaries):
        raise ValueError(
            f"need a positive micro-batch count and boundary bytes of 0 or more, got "
            f"{microbatches} and {list(boundaries)}"
        )
    out = dict.fromkeys(owners, 0)
    for s, size in enumerate(boundaries):
        if owners[s] != owners[s + 1]:
            out[owners[s]] += microbatches * size  # the activation, forward
            out[owners[s + 1]] += microbatches * size  # its gradient, backward
    return out
