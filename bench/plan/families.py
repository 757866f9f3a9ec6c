"""The planner's families: the ways a plan lays a model over its ranks, one row of facts each.

A family is what ``--family`` names: ``ddp``, ``fsdp2``, ``fsdp1``, ``tp``, ``pp``. It is the
planner's word, not ``bench/run.py``'s: each row maps onto ``bench/run.py``'s vocabulary, a
strategy (a row of ``parallel_kernels/strategies.py``'s ``STRATEGIES``) and one of its
implementations, so FSDP2 and FSDP1 are two families of the one strategy ``fsdp``. A row says
which layouts of the family a plan weighs at a world size, which knob's sweep runs one
(``space.Config.command``), what a rank's state is sharded over (``trackings.worlds``), what a
CPU plan calibrates of its implementation's own work (``calibration.py``, ``step_time.py``),
whether its accumulating rows are tracked (``memory.py``), how a replica's batch is split
into micro-batches, and whether it cuts the model into pipeline stages (``pipelined``: its
memory per stage, ``pipeline_memory.py``, and its step from the schedule's simulation,
``pipeline_time.py``). The rest of the planner asks these rows and the strategy's own row (its
``schedule``, its implementations' memory facts); docs/extending.md says what a new one needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from parallel_kernels.fsdp_layout import shard_group_size
from parallel_kernels.knobs import KNOBS
from parallel_kernels.pipeline_theory import SCHEDULES as PP_SCHEDULES
from parallel_kernels.workload import Workload

BUCKETS_MB = (5.0, 25.0, 100.0)
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")

# What an implementation computes beyond the model's FLOPs, which a CPU plan's calibration
# measures (``calibration.py``) and the step time adds (``step_time.py``):
UNIT_COPIES = "copies per unit"  # FSDP's: its collectives' buffers copied, its hooks, per unit
OP_DISPATCH = "dispatch per op"  # TP's: DTensor decides each op's sharding in Python

MAX_ACCUM = 8  # the most micro-batches a row accumulates
PP_MICROBATCHES = (1, 2, 4)  # a pipeline of d stages: d, 2d and 4d micro-batches a step

# Layout = (label, knobs): a row's name in plan.csv and the knobs that lay it out.
Layouts = Callable[[int, int, Workload], list[tuple[str, dict[str, Any]]]]
# (global batch, replicas, a layout's knobs) -> each (micro-batch, knobs) that makes the batch:
# the ``--batch-size`` of its command and the knobs that split a replica's batch
Splits = Callable[[int, int, Mapping[str, Any]], list[tuple[int, dict[str, Any]]]]


def _tp_ranks(knobs: Mapping[str, Any]) -> int:
    """Ranks one data-parallel replica spans: its TP group (1 without one)."""
    return int(knobs.get("tp_degree", 1))


def accumulated(global_batch: int, replicas: int, knobs: Mapping) -> list[tuple[int, dict]]:
    """(micro-batch, ``grad_accum``) with micro x accumulation x replicas = global batch,
    accumulation a power of two up to ``MAX_ACCUM``."""
    del knobs
    if global_batch % replicas:
        return []
    per_replica = global_batch // replicas
    pairs, accum = [], 1
    while accum <= min(MAX_ACCUM, per_replica):
        if per_replica % accum == 0:
            pairs.append((per_replica // accum, {"grad_accum": accum}))
        accum *= 2
    return pairs


@dataclass(frozen=True)
class Family:
    name: str  # what --family names, and plan.csv's ``family``
    strategy: str  # bench/run.py's strategy: its STRATEGIES row
    impl: str  # the strategy's implementation the family runs
    layout_knob: str  # the knob whose sweep runs a row (its command's --sweep)
    # (world size, ranks per node, the model's workload) -> each layout planned there
    layouts: Layouts
    # (a row's knobs, its world size) -> the ranks a rank's state is sharded over where that
    # does not grow with the world, None where it is sharded over the world's data-parallel
    # ranks (``trackings.worlds``)
    state_group: Callable[[Mapping[str, Any], int], int | None]
    own_work: str = ""  # UNIT_COPIES, OP_DISPATCH, or "": none calibrated
    # why its accumulating rows are not tracked (each is its row's error); "": they are
    accumulation_untracked: str = ""
    # (a layout's knobs) -> the ranks one data-parallel replica spans (TP's group, a pipeline)
    replica_ranks: Callable[[Mapping[str, Any]], int] = _tp_ranks
    splits: Splits = accumulated  # how a replica's batch is split (``Splits``)
    # it cuts the model into pipeline stages, one a rank: its memory is tracked per stage
    # (``pipeline_memory.py``) and its step simulated over the schedule (``pipeline_time.py``)
    pipelined: bool = False
    # (a row's knobs, its world size) -> plan.csv's columns of its own (a pipeline's degree,
    # schedule, micro-batches, and why this checkout cannot run it, ``cannot_run``)
    columns: Callable[[Mapping[str, Any], int], dict[str, Any]] = lambda knobs, world: {}
    # the family whose implementation shards a row's replicas where its ``dp_shard`` is set
    # (a pipeline's stages: FSDP2's), whose own work (``own_work``) that row pays too
    replicas_sharded_by: str = ""


def replicated(knobs: Mapping[str, Any], world: int) -> int:
    """A state every data-parallel rank holds whole (DDP's): a group of one."""
    del knobs, world
    return 1


def _ddp_layouts(world: int, gpus_per_node: int, wl: Workload) -> list[tuple[str, dict]]:
    del world, gpus_per_node, wl
    return [(f"ddp bucket {mb:g} MB", {"bucket_cap_mb": mb}) for mb in BUCKETS_MB]


def _fsdp_layouts(family: str, world: int, gpus_per_node: int, wl: Workload) -> list:
    """Each sharding strategy; hybrid with one node's ranks (at most half the world) per shard
    group, where such a group has replicas."""
    del wl
    out = []
    for sharding in SHARDINGS:
        knobs: dict[str, Any] = {"sharding_strategy": sharding}
        label = f"{family} {sharding}"
        if sharding == "HYBRID_SHARD":
            shard = min(gpus_per_node, world // 2)
            if shard < 2 or world % shard:
                continue  # no shard group of two or more with replicas of it
            knobs["shard_size"] = shard
            label += f"/{shard}"
        out.append((label, knobs))
    return out


def _fsdp_state_group(knobs: Mapping[str, Any], world: int) -> int | None:
    s = shard_group_size(knobs["sharding_strategy"], world, knobs.get("shard_size"))
    return None if s == world else s


def _tp_layouts(world: int, gpus_per_node: int, wl: Workload) -> list[tuple[str, dict]]:
    """Each TP degree within a node that divides the world, the rest of the ranks data
    parallel, replicated (DDP) or sharded (FSDP); none for a model without a TP plan."""
    out: list[tuple[str, dict]] = []
    degree = 2
    while wl.tp_plan is not None and degree <= min(gpus_per_node, world):
        if world % degree == 0:
            for shard, dp in ((False, "ddp"), (True, "fsdp")):
                if shard and world // degree < 2:
                    continue  # no data-parallel dimension to shard
                label = f"tp{degree} x {dp}" if world > degree else f"tp{degree}"
                out.append((label, {"tp_degree": degree, "dp_shard": shard}))
        degree *= 2
    return out


def _tp_state_group(knobs: Mapping[str, Any], world: int) -> int | None:
    del world
    return None if knobs.get("dp_shard") else int(knobs["tp_degree"])


def pipeline_blocks(wl: Workload) -> int:
    """The blocks a pipeline cuts the model into stages by (its ``Workload.pipeline``), from
    the model on the meta device; 0 for a model whose workload does not say where they are."""
    return 0 if wl.pipeline is None else _blocks_of(wl.name)


@functools.cache
def _blocks_of(model: str) -> int:
    import torch

    from parallel_kernels.models import workload

    wl = workload(model)
    with torch.device("meta"):
        return len(wl.pipeline.blocks(wl.build()))


def _pp_layouts(world: int, gpus_per_node: int, wl: Workload) -> list[tuple[str, dict]]:
    """Each pipeline degree d that divides the world, from 2 to the model's blocks, the rest of
    the ranks data-parallel replicas of the pipeline, replicated (DDP) or, where there are
    replicas, sharded by FSDP2 (``dp_shard``), with each schedule the planner simulates
    (``pipeline_theory.SCHEDULES``); none for a model that names no blocks to cut."""
    del gpus_per_node
    blocks = pipeline_blocks(wl)
    out: list[tuple[str, dict]] = []
    for degree in range(2, min(world, blocks) + 1):
        if world % degree:
            continue
        for schedule in PP_SCHEDULES:
            knobs = {"pp_degree": degree, "pp_schedule": schedule}
            if world == degree:
                out.append((f"pp{degree} {schedule}", knobs))
                continue
            out.append((f"pp{degree} {schedule} x dp", knobs))
            out.append((f"pp{degree} {schedule} x fsdp", {**knobs, "dp_shard": True}))
    return out


def _pp_ranks(knobs: Mapping[str, Any]) -> int:
    return int(knobs["pp_degree"])


def _pp_splits(global_batch: int, replicas: int, knobs: Mapping) -> list[tuple[int, dict]]:
    """A replica's whole batch a step (the command's ``--batch-size``), split by the schedule
    into d, 2d or 4d micro-batches (``pp_microbatches``) where they divide it; no
    accumulation beside (the pipeline accumulates over its own micro-batches)."""
    degree = int(knobs["pp_degree"])
    if global_batch % replicas:
        return []
    batch = global_batch // replicas
    counts = [k * degree for k in PP_MICROBATCHES if batch % (k * degree) == 0]
    return [(batch, {"grad_accum": 1, "pp_microbatches": m}) for m in counts]


def _pp_columns(knobs: Mapping[str, Any], world: int) -> dict[str, Any]:
    """A pipeline row's own columns; ``cannot_run`` says why ``bench/run.py`` here cannot run
    it ("" where it can): a checkout whose ``pp`` strategy has no ``pp_degree`` knob runs one
    pipeline over every rank."""
    degree = int(knobs["pp_degree"])
    why = ""
    if "pp_degree" not in KNOBS and degree != world:
        why = (
            f"this checkout's pp runs one pipeline over every rank (no pp_degree knob): "
            f"{degree} stages with replicas at {world} ranks cannot run"
        )
    return {
        "pp_degree": degree,
        "pp_schedule": knobs["pp_schedule"],
        "pp_microbatches": int(knobs["pp_microbatches"]),
        "cannot_run": why,
    }


# An accumulating step under DTensor's fake dispatch costs two micro-batches' steps, too slow
# for a plan's time target, so those TP rows are not tracked; ``bench/run.py`` runs them
# (MeshParallel.no_sync). The cost: docs/benchmarks.md, "Planning time".
TP_ACCUMULATION_UNTRACKED = (
    "not tracked: TP's accumulating step costs the plan two micro-batches' steps under "
    "DTensor's fake dispatch; bench/run.py runs it (its command)"
)

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("ddp", "ddp", "native", "bucket_cap_mb", _ddp_layouts, replicated),
        Family(
            "fsdp2",
            "fsdp",
            "native",
            "sharding_strategy",
            partial(_fsdp_layouts, "fsdp2"),
            _fsdp_state_group,
            own_work=UNIT_COPIES,
        ),
        Family(
            "fsdp1",
            "fsdp",
            "native_fsdp1",
            "sharding_strategy",
            partial(_fsdp_layouts, "fsdp1"),
            _fsdp_state_group,
            own_work=UNIT_COPIES,
        ),
        Family(
            "tp",
            "tp",
            "native",
            "tp_degree",
            _tp_layouts,
            _tp_state_group,
            own_work=OP_DISPATCH,
            accumulation_untracked=TP_ACCUMULATION_UNTRACKED,
        ),
        # the reference implementation: its step can be tracked under fake tensors (torch's
        # PipelineStage agrees shapes over the group at its first step, which a fake process
        # group cannot answer), and every byte it sends is known
        Family(
            "pp",
            "pp",
            "reference",
            "pp_schedule",
            _pp_layouts,
            replicated,
            replica_ranks=_pp_ranks,
            splits=_pp_splits,
            pipelined=True,
            columns=_pp_columns,
            replicas_sharded_by="fsdp2",
        ),
    )
}


def own_works(family: str, knobs: Mapping[str, Any]) -> tuple[Family, ...]:
    """The families whose implementations' own work a row of ``family`` at ``knobs`` pays: its
    own, and where its replicas are sharded (``dp_shard``), the sharding family's."""
    f = FAMILIES[family]
    by = f.replicas_sharded_by if knobs.get("dp_shard") else ""
    return (f, FAMILIES[by]) if by else (f,)


def family_of(strategy: str, impl: str) -> str:
    """The family that runs ``bench/run.py``'s ``strategy`` with ``impl``: the planner's word
    for it (a KeyError where no family does)."""
    for f in FAMILIES.values():
        if (f.strategy, f.impl) == (strategy, impl):
            return f.name
    raise KeyError(f"no family runs strategy {strategy} with implementation {impl}")
