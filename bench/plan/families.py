"""The planner's families: the ways a plan lays a model over its ranks, one row of facts each.

A family is what ``--family`` names: ``ddp``, ``fsdp2``, ``fsdp1``, ``tp``. It is the
planner's word, not ``bench/run.py``'s: each row maps onto ``bench/run.py``'s vocabulary, a
strategy (a row of ``parallel_kernels/strategies.py``'s ``STRATEGIES``) and one of its
implementations, so FSDP2 and FSDP1 are two families of the one strategy ``fsdp``. A row says
which layouts of the family a plan weighs at a world size, which knob's sweep runs one
(``space.Config.command``), what a rank's state is sharded over (``trackings.worlds``), what a
CPU plan calibrates of its implementation's own work (``calibration.py``, ``step_time.py``),
and whether its accumulating rows are tracked (``memory.py``). The rest of the planner asks
these rows and the strategy's own row (its ``schedule``, its implementations' memory facts);
docs/extending.md says what a new one needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from parallel_kernels.fsdp_layout import shard_group_size
from parallel_kernels.workload import Workload

BUCKETS_MB = (5.0, 25.0, 100.0)
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")

# What an implementation computes beyond the model's FLOPs, which a CPU plan's calibration
# measures (``calibration.py``) and the step time adds (``step_time.py``):
UNIT_COPIES = "copies per unit"  # FSDP's: its collectives' buffers copied, its hooks, per unit
OP_DISPATCH = "dispatch per op"  # TP's: DTensor decides each op's sharding in Python

# Layout = (label, knobs): a row's name in plan.csv and the knobs that lay it out.
Layouts = Callable[[int, int, Workload], list[tuple[str, dict[str, Any]]]]


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
    )
}


def family_of(strategy: str, impl: str) -> str:
    """The family that runs ``bench/run.py``'s ``strategy`` with ``impl``: the planner's word
    for it (a KeyError where no family does)."""
    for f in FAMILIES.values():
        if (f.strategy, f.impl) == (strategy, impl):
            return f.name
    raise KeyError(f"no family runs strategy {strategy} with implementation {impl}")
