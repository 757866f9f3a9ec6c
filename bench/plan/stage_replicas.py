"""A pipeline stage's data-parallel replicas (a ``pp`` row's ``dp_shard``): what a rank of the
stage holds and which collectives the r ranks holding the stage run, replicated (DDP: each
stage's gradients averaged after the schedule in one flat all-reduce) or sharded by FSDP2
(``parallel_kernels/pipeline_mesh.py``: each block a unit, then the stage the root).

A sharded rank is tracked as the replicated one is, with two replicas (FSDP2's own gathers,
its buffers and its reshards in every action, as the run's code makes them), and moved to r
replicas by the rule: its sharded state, where nothing is gathered (the schedule's start, after
it, the optimiser's step, the gradients a backward leaves), is the tracked one's times 2 / r;
what an action gathers is whole whatever r (one unit's parameters and buffers at a time).
Derived from the replicated rank instead (its state over r, plus a block gathered and one
prefetched), a rank read high against runs (docs/benchmarks.md, "Pipelines sharded by FSDP2"):
FSDP2's buffers and reshards do not follow the model's blocks.

Its collectives: each micro-batch's forward all-gathers the stage's parameters and its backward
all-gathers them again and reduce-scatters their gradients (every micro-batch: the pipeline's
schedule leaves FSDP2's gradient sync on), over the r ranks holding the stage; DDP's rank runs
one all-reduce of them after the schedule. FSDP2's own work beside them, per unit (each block
and the stage's root) and micro-batch: its copies into and out of those collectives' buffers
and its hooks (``unit_copies``; priced in ``pipeline_time.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STATE = ("params", "grads", "optim")  # the categories FSDP2 shards (``memory.CATEGORIES``)
FORWARD, BACKWARD, AFTER = "forward", "backward", "after"
SHARDING = "FULL_SHARD"  # what FSDP2's fully_shard runs a stage as: resharded after forward


def replicas(knobs: Mapping[str, Any], world: int) -> int:
    """The ranks holding each stage: the world over one pipeline's ranks."""
    return world // int(knobs["pp_degree"])


def sharded(knobs: Mapping[str, Any], world: int) -> bool:
    """Whether FSDP2 shards each stage over its replicas (``dp_shard`` with replicas)."""
    return bool(knobs.get("dp_shard")) and replicas(knobs, world) > 1


@dataclass(frozen=True)
class Collective:
    """One collective a rank of a stage runs over the stage's replicas: its name (a cost
    model's: all_reduce, all_gather, reduce_scatter), the whole tensor's bytes, its ranks, how
    many a step runs and where (in each micro-batch's ``forward`` or ``backward``, or ``after``
    the schedule)."""

    name: str
    nbytes: float
    ranks: int
    per_step: int
    phase: str


def collectives(knobs: Mapping[str, Any], world: int, stage_bytes: float) -> tuple:
    """The collectives over the replicas of a stage of ``stage_bytes`` parameter bytes."""
    r, m = replicas(knobs, world), int(knobs["pp_microbatches"])
    if r < 2:
        return ()
    if not sharded(knobs, world):
        return (Collective("all_reduce", stage_bytes, r, 1, AFTER),)
    return (
        Collective("all_gather", stage_bytes, r, m, FORWARD),
        Collective("all_gather", stage_bytes, r, m, BACKWARD),
        Collective("reduce_scatter", stage_bytes, r, m, BACKWARD),
    )


def stage_units(knobs: Mapping[str, Any], world: int, blocks: int) -> int:
    """FSDP2's units on a rank of a stage of ``blocks`` blocks, where it shards the stage:
    each block and then the stage, its root; none on a replicated stage."""
    return blocks + 1 if sharded(knobs, world) else 0


def unit_copies(stage_bytes: float, units: int, r: int) -> tuple[Collective, ...]:
    """FSDP2's copies per unit and micro-batch of a stage of ``stage_bytes`` parameter bytes
    over ``r`` replicas, as ``Collective``s of the bytes each reads and writes (``name``: the
    collective they serve): each all-gather's shard into its buffer and the buffer out into
    the parameters, in forward and again in backward; the gradients into the reduce-scatter's
    buffer and its shard out, in backward."""
    unit = stage_bytes / units if units else 0.0
    gather = (unit / r, unit)  # the shard copied in, the whole unit copied out
    copies = [("all_gather", b, FORWARD) for b in gather] + [
        ("all_gather", b, BACKWARD) for b in gather
    ]
    copies += [("reduce_scatter", b, BACKWARD) for b in (unit, unit / r)]
    return tuple(Collective(name, b, r, 1, phase) for name, b, phase in copies)


TRACKED_REPLICAS = 2  # the replicas a sharded pipeline's rank is tracked with
SETTLED = ("start", "post", "optimiser")  # a rank's figures where nothing is gathered


def _scaled(parts: dict, by: float, keys: tuple[str, ...]) -> dict:
    return {k: v * by if k in keys else v for k, v in parts.items()}


def over_replicas(mem, r: int):
    """A sharded rank's figures (a ``pipeline_memory.StageMemory``) tracked with
    ``TRACKED_REPLICAS`` replicas, as a rank of ``r`` holds them: its sharded state where
    nothing is gathered times 2 / r, the gradients a backward leaves alike."""
    by = TRACKED_REPLICAS / r
    fields = {name: _scaled(getattr(mem, name), by, STATE) for name in SETTLED}
    fields["grads"] = _scaled(mem.grads, by, ("grads",))
    return dataclasses.replace(mem, **fields)
