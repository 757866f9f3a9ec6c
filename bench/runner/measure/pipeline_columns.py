"""The pipeline's columns of a point's row (results.csv's ``pp_*``), for a point whose
implementation steps by a schedule (its row's ``steps`` fact, ``strategies.Impl``): each
stage's bubble from its trace (``bench/analysis/pipeline_bubble.py``) beside the schedule's
theoretical bubble, and the point-to-point bytes it sent per step beside the count from the
stages' shapes (``pipeline_theory``).

The count needs what each stage hands the next per sample: the plain model cut as the pipeline
cuts it and one sample run through its stages on fake tensors (shapes only; on real tensors,
one sample on the CPU, for a model that reads its data), once per model and stage count.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.analysis.pipeline_bubble import pipeline_bubble, stage_summary
from bench.analysis.trace import Trace
from bench.runfolder.points import PointRecord
from parallel_kernels.models import workload
from parallel_kernels.pipeline_stages import split_stages
from parallel_kernels.pipeline_theory import Pipeline, bubble_fraction, p2p_bytes_by_rank
from parallel_kernels.workload import stamp


def pipelines(point: PointRecord) -> bool:
    """Whether the point's implementation runs a pipeline schedule (its row says so)."""
    return point.impl_facts.get("steps") == "schedule"


@dataclass(frozen=True)
class PipelineLayout:
    """What the analytical figures need of a point's pipeline: its model, the pipeline rank
    that holds each stage (p ranks, v stages a rank), its micro-batches and their samples."""

    model: str
    owners: tuple[int, ...]
    microbatches: int
    micro_batch: int

    @property
    def ranks(self) -> int:
        return len(set(self.owners))

    @property
    def pipe(self) -> Pipeline:
        return Pipeline(self.ranks, self.microbatches, len(self.owners) // self.ranks)


def layout_of(point: PointRecord, model) -> PipelineLayout:
    """The layout of a point's pipelined model (``parallel_kernels.pipeline.PipelinedModel``:
    the pipeline rank of each of its stages, its plan's micro-batches)."""
    m = model.plan.microbatches
    return PipelineLayout(
        model=point.model,
        owners=tuple(model.owners),
        microbatches=m,
        micro_batch=point.batch_per_replica // m,
    )


@functools.cache
def boundary_bytes_per_sample(model: str, stages: int) -> tuple[int, ...]:
    """Bytes per sample of what each of ``stages`` stages of ``model`` hands the next (one
    fewer than the stages): on fake tensors, or on one real sample where the model reads its
    data."""
    try:
        return _boundaries(model, stages, FakeTensorMode(allow_non_fake_inputs=True))
    except Exception:  # noqa: BLE001  (a model that reads its data: one real sample below)
        return _boundaries(model, stages, None)


def _boundaries(model: str, stages: int, fake: FakeTensorMode | None) -> tuple[int, ...]:
    wl = workload(model)
    out = []
    with torch.random.fork_rng():  # the run's random state untouched
        inputs, targets = wl.batch(1, 0)
        with fake if fake is not None else torch.device("cpu"), torch.no_grad():
            split = split_stages(stamp(wl.build(), wl), stages)
            x = split.stage_batch(inputs, targets)[0]
            for stage in split.stages[:-1]:
                x = stage(x)
                out.append(x.numel() * x.element_size())
    return tuple(out)


def expected_p2p_bytes(layout: PipelineLayout) -> float:
    """The point-to-point bytes a rank of the pipeline sends per step, mean over its ranks,
    counted from the stages' shapes (``pipeline_theory.p2p_bytes_by_rank``)."""
    per_sample = boundary_bytes_per_sample(layout.model, len(layout.owners))
    boundaries = tuple(b * layout.micro_batch for b in per_sample)
    by_rank = p2p_bytes_by_rank(layout.microbatches, layout.owners, boundaries)
    return sum(by_rank.values()) / layout.ranks


def pipeline_columns(trace: Trace, layout: PipelineLayout) -> dict:
    """One rank's ``pp_*`` columns: its stage's bubble (each of the row's bubble columns
    reduces it over the ranks its own way), the schedule's theoretical bubble, its
    point-to-point bytes per step and the pipeline's count of them."""
    mine = stage_summary(pipeline_bubble(trace))
    bubble = mine.get("bubble_pct", math.nan)
    try:
        expected = expected_p2p_bytes(layout)
    except Exception:  # noqa: BLE001  (a model the count cannot run: an empty cell, not a failure)
        expected = math.nan
    return {
        "pp_bubble_pct": bubble,
        "pp_bubble_mean_pct": bubble,
        "pp_bubble_by_rank_pct": bubble,
        "pp_bubble_theory_pct": 100 * bubble_fraction(layout.pipe),
        "pp_p2p_bytes_per_step": mine.get("p2p_bytes_per_step", math.nan),
        "pp_p2p_bytes_expected": expected,
    }
