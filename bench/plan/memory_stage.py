"""The planner's memory stage over every family: the rows of the families whose ranks hold one
layout of the model (``memory.py``) and those that cut it into pipeline stages
(``families.Family.pipelined``: ``pipeline_memory.py``), their builds and countings in one pool of
workers (``tracking_workers.map_builds``), so that neither waits for the other's last build."""

from __future__ import annotations

import functools

from bench.plan import pipeline_memory
from bench.plan.families import FAMILIES
from bench.plan.memory import predict_memory as predict_layouts
from bench.plan.memory import run_build
from bench.plan.space import Config
from bench.plan.tracked import Tracked
from bench.plan.tracking_workers import Progress, map_builds
from bench.plan.trackings import Job, builds, figures, plan_trackings


def predict_memory(
    configs: list[Config],
    *,
    gpus_per_node: int,
    gpu: bool = False,
    workers: int = 1,
    progress: Progress | None = None,
) -> list[Tracked]:
    """Each configuration's figures, in order (``memory.predict_memory``'s, a pipeline row's
    ``pipeline_memory``'s), tracked in ``workers`` processes; ``gpu``: the target is a GPU."""
    piped = [FAMILIES[c.family].pipelined for c in configs]
    if not any(piped):
        return predict_layouts(
            configs, gpus_per_node=gpus_per_node, gpu=gpu, workers=workers, progress=progress
        )
    layouts = [c for c, p in zip(configs, piped, strict=True) if not p]
    plan = plan_trackings(layouts)
    groups = builds(plan.jobs)
    staged = pipeline_memory.plan_stages([c for c, p in zip(configs, piped, strict=True) if p], gpu)
    track = functools.partial(_any_build, gpus_per_node=gpus_per_node, gpu=gpu)
    got = map_builds(track, groups + list(staged.items), workers, progress)
    memo = plan.assemble(
        {
            job.key: t
            for group, ts in zip(groups, got[: len(groups)], strict=True)
            for job, t in zip(group, ts, strict=True)
        }
    )
    rows = iter(staged.assemble(got[len(groups) :]))
    return [next(rows) if p else figures(c, memo) for c, p in zip(configs, piped, strict=True)]


def _any_build(build: tuple, gpus_per_node: int, gpu: bool) -> list:
    """A layout's build (``memory.run_build``) or a pipeline's work (``pipeline_memory.run_item``),
    as the pool meets them."""
    if isinstance(build[0], Job):
        return run_build(build, gpus_per_node, gpu)
    return pipeline_memory.run_item(build, gpus_per_node, gpu)
