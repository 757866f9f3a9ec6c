"""The pipeline schedules a point can name (the ``pp_schedule`` knob's values), one row each.

A row says which class of ``torch.distributed.pipelining.schedules`` runs it (the native
implementation), how many stages a rank holds and where they go (``loop``: stage s on rank
s mod p, as the interleaved schedules place them; ``v``: rank r holds stages r and 2p-1-r,
as ZBV and DualPipeV do), whether our reference (``pipeline_schedule.py``) runs it too, and
torch's own rule on the micro-batch count, so that a count torch would refuse is refused at
the command line. A schedule whose class the installed torch lacks is not offered.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


def _any(m: int, p: int) -> str | None:
    return None


def _at_least_stages(m: int, p: int) -> str | None:
    """Schedule1F1B's rule: a micro-batch for every stage (p stages, one a rank)."""
    return None if m >= p else f"at least as many micro-batches as its {p} stages"


def _whole_rounds(m: int, p: int) -> str | None:
    """The interleaved schedules' rule: max(1, m // p) rounds of micro-batches, whole."""
    rounds = max(1, m // p)
    return None if m % rounds == 0 else f"a multiple of its {rounds} rounds (max(1, m // {p}))"


def _at_least_all_stages(m: int, p: int) -> str | None:
    """ScheduleDualPipeV's rule: a micro-batch for every stage (2 a rank)."""
    return None if m >= 2 * p else f"at least as many micro-batches as its {2 * p} stages"


@dataclass(frozen=True, kw_only=True)
class PipeSchedule:
    name: str  # the knob's value
    torch_class: str  # in torch.distributed.pipelining.schedules
    per_rank: int = 1  # stages a rank holds (v)
    placement: str = "loop"  # "loop": stage s on rank s mod p; "v": rank r holds r, 2p-1-r
    reference: bool = False  # our reference (pipeline_schedule.py) runs it too
    # (micro-batches, ranks of the pipeline) -> what torch asks of the count, or None: fits
    microbatch_rule: Callable[[int, int], str | None] = _any
    # Weight gradients in a pass of their own (zero bubble, DualPipeV). FSDP2 over the replicas
    # (dp_shard) is refused with these: at torch 2.13 the last stage's FSDP units get no
    # gradient, or a wrong one (parallel_kernels/pipeline.py).
    split_backward: bool = False

    def stages_of(self, rank: int, ranks: int) -> tuple[int, ...]:
        """The stages pipeline rank ``rank`` of ``ranks`` holds, in order."""
        if self.placement == "v":
            return (rank, 2 * ranks - 1 - rank)
        return tuple(rank + k * ranks for k in range(self.per_rank))

    def owners(self, ranks: int) -> tuple[int, ...]:
        """The pipeline rank of each stage, stage by stage."""
        out = [0] * (ranks * self.per_rank)
        for r in range(ranks):
            for s in self.stages_of(r, ranks):
                out[s] = r
        return tuple(out)

    def refusal(self, microbatches: int, ranks: int) -> str | None:
        """Why torch's schedule cannot run ``microbatches`` over ``ranks``, or None."""
        need = self.microbatch_rule(microbatches, ranks)
        if need is None:
            return None
        return (
            f"pp_schedule={self.name} over {ranks} ranks needs {need}, "
            f"not pp_microbatches={microbatches}"
        )

    def torch_type(self) -> type:
        """The installed torch's class of this schedule."""
        from torch.distributed.pipelining import schedules

        return getattr(schedules, self.torch_class)


ALL: tuple[PipeSchedule, ...] = (
    PipeSchedule(name="gpipe", torch_class="ScheduleGPipe", reference=True),
    PipeSchedule(
        name="1f1b", torch_class="Schedule1F1B", reference=True, microbatch_rule=_at_least_stages
    ),
    PipeSchedule(
        name="interleaved_1f1b",
        torch_class="ScheduleInterleaved1F1B",
        per_rank=2,
        microbatch_rule=_whole_rounds,
    ),
    PipeSchedule(
        name="interleaved_zb",
        torch_class="ScheduleInterleavedZeroBubble",
        per_rank=2,
        microbatch_rule=_whole_rounds,
        split_backward=True,
    ),
    PipeSchedule(
        name="zbv",
        torch_class="ScheduleZBVZeroBubble",
        per_rank=2,
        placement="v",
        split_backward=True,
    ),
    PipeSchedule(
        name="dualpipev",
        torch_class="ScheduleDualPipeV",
        per_rank=2,
        placement="v",
        microbatch_rule=_at_least_all_stages,
        split_backward=True,
    ),
)


def _installed_classes() -> frozenset[str]:
    """The classes the installed torch's ``pipelining/schedules.py`` defines, read from its
    source: importing ``torch.distributed.pipelining`` costs a process 1.2 s here (it imports
    torch.export), and every rank and command reads the knobs (docs/benchmarks.md, "make
    test's time")."""
    path = Path(torch.__file__).parent / "distributed" / "pipelining" / "schedules.py"
    try:
        return frozenset(re.findall(r"^class (\w+)", path.read_text(), re.MULTILINE))
    except OSError:  # a torch installed without its sources: ask the module itself
        from torch.distributed.pipelining import schedules

        return frozenset(dir(schedules))


# The schedules the installed torch has, by name: the knob's values.
SCHEDULES: dict[str, PipeSchedule] = {
    s.name: s for s in ALL if s.torch_class in _installed_classes()
}


def parse_schedule(text: str) -> str:
    """A ``pp_schedule`` value: one of ``SCHEDULES``; one the installed torch lacks is named."""
    value = str(text).strip().lower()
    if value in SCHEDULES:
        return value
    lacking = {s.name: s for s in ALL if s.name not in SCHEDULES}
    if value in lacking:
        raise ValueError(
            f"pipeline schedule {value} needs torch.distributed.pipelining's "
            f"{lacking[value].torch_class}, which torch {torch.__version__} lacks"
        )
    raise ValueError(f"{text!r} is not a pipeline schedule ({', '.join(SCHEDULES)})")


def schedule(name: str) -> PipeSchedule:
    if name not in SCHEDULES:
        parse_schedule(name)  # raises, saying why
    return SCHEDULES[name]
