"""The space: the configurations a plan weighs, each resolved into the point record a sweep
would run.

For a model at a world size, each family's layouts (``families.py``: DDP at a few bucket sizes;
FSDP2 and FSDP1 with each sharding strategy; tensor parallelism at each degree within a node,
the rest of the ranks replicated or sharded; pipelines of each degree and schedule, the rest
replicas), each with activation checkpointing off, full and selective:op, in fp32 and bf16,
eager (``request.OPTIONS``, as ``--option`` narrows or names them: fp8, compile), and at each
split of a replica's batch that makes the global batch (its family's ``splits``: a
(micro-batch, accumulation) pair, or a pipeline's micro-batch count). Every configuration
resolves to a ``PointRecord`` (``bench.runner.configure.resolve.resolve_point``, what
``bench/run.py`` resolves) and names the exact ``bench/run.py`` command that runs it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from bench.plan.families import FAMILIES, accumulated
from bench.plan.request import PlanRequest
from bench.runfolder.points import PointRecord
from bench.runner.configure.resolve import PointRequest, VisitSettings, resolve_point
from parallel_kernels import checkpointing
from parallel_kernels.compiling import EAGER, compiles
from parallel_kernels.knobs import KNOBS
from parallel_kernels.models import workload

# A checkpointed row of a model whose workload names no blocks to recompute: its build raises
# (``parallel_kernels.checkpointing``), as ``bench/run.py``'s point of it fails (an error row).
NO_CHECKPOINT_UNITS = (
    "the model names no checkpoint units (nor FSDP units, their default): activation "
    "checkpointing recomputes per block, and the row's run fails saying so"
)


def names_checkpoint_units(model: str) -> bool:
    """Whether ``model``'s workload names the blocks activation checkpointing recomputes (its
    ``checkpoint_units``, by default its ``fsdp_units``). Without them only the checkpointed
    rows cannot be planned: DDP needs no units, and FSDP wraps each linear layer and the root
    (``parallel_kernels.fsdp_layout.fsdp_units``), which the planner tracks as it is built."""
    return bool(workload(model).block_types)


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Config:
    """One configuration: its family and name, ``bench/run.py``'s strategy and implementation
    (its family's), the knobs it sets, its micro-batch, and the world size it runs at."""

    family: str  # a row of families.FAMILIES: ddp, fsdp2, fsdp1, tp, pp
    label: str  # e.g. "fsdp2 HYBRID_SHARD/8", "tp4 x ddp"
    model: str
    strategy: str
    impl: str
    knobs: dict[str, Any] = field(default_factory=dict)
    micro_batch: int = 1
    world_size: int = 1

    @property
    def accumulates(self) -> bool:
        return int(self.knobs.get("grad_accum", 1)) > 1

    @property
    def checkpointed(self) -> bool:
        return checkpointing.checkpointed(self.checkpointing)

    @property
    def checkpointing(self) -> str:
        """Its checkpointing mode, as rows spell it (``checkpointing.parse_checkpointing``)."""
        return checkpointing.parse_checkpointing(self.knobs.get("activation_checkpointing", "off"))

    @property
    def tp_degree(self) -> int:
        """Ranks of the group inside a replica (a TP group; 1 without one)."""
        return int(self.knobs.get("tp_degree") or 1)

    @property
    def run_knobs(self) -> dict[str, Any]:
        """The knobs ``bench/run.py`` takes: those of the plan's layout that this checkout's
        knob table lacks are the plan's own words (a pipeline's ``pp_degree`` where the
        strategy runs one pipeline over every rank: ``families.Family.columns``)."""
        return {k: v for k, v in self.knobs.items() if k in KNOBS}

    def step_flops(self, micro_batch_flops: float) -> float:
        """A rank's FLOPs per step from one micro-batch's as counted: ``grad_accum`` of them,
        of which a rank computes 1/tp (the counter sees a TP group's ops whole, DTensor's global
        shapes)."""
        return micro_batch_flops * int(self.knobs["grad_accum"]) / self.tp_degree

    def point(self, **changes: Any) -> PointRecord:
        """The record ``bench/run.py`` would resolve (at another world size, micro-batch or
        with other knobs where ``changes`` says so)."""
        c = replace(self, **changes) if changes else self
        return resolve_point(
            PointRequest(
                sweep="plan",
                values={"plan": c.label},
                model=c.model,
                strategy=c.strategy,
                impl=c.impl,
                knobs=c.run_knobs,
                world_size=c.world_size,
                per_visit=VisitSettings(batch_size=c.micro_batch),
            )
        )

    def command(self, world_size: int | None = None, gpus_per_node: int = 8) -> str:
        """The ``bench/run.py`` command that runs this configuration (on ``world_size`` ranks,
        its own by default; torchrun's rendezvous flags for several nodes are the user's)."""
        world = world_size or self.world_size
        sweep = FAMILIES[self.family].layout_knob
        per_node = min(world, gpus_per_node)
        args = ["torchrun"]
        if world > per_node:
            args.append(f"--nnodes={world // per_node}")
        args += [
            f"--nproc_per_node={per_node}",
            "bench/run.py",
            "--sweep",
            sweep,
            "--values",
            _text(self.knobs[sweep]),
            "--model",
            self.model,
            "--impl",
            self.impl,
            "--batch-size",
            str(self.micro_batch),
        ]
        args += [f"--option={k}={_text(v)}" for k, v in self.run_knobs.items() if k != sweep]
        return shlex.join(args)


def micro_batches(global_batch: int, replicas: int) -> list[tuple[int, int]]:
    """(micro-batch, accumulation) pairs with micro x accumulation x replicas = global batch,
    accumulation a power of two up to ``families.MAX_ACCUM``."""
    return [(m, k["grad_accum"]) for m, k in accumulated(global_batch, replicas, {})]


def enumerate_space(request: PlanRequest) -> list[Config]:
    """Every configuration of the request's model at its world size that makes its global
    batch: each family's layouts, in the families' table order, by checkpointing, precision and
    split of a replica's batch (its family's ``splits``)."""
    world, options = request.world_size, request.options
    wl = workload(request.model)
    configs = []
    for family in FAMILIES.values():
        if family.name not in request.families:
            continue
        for label, layout in family.layouts(world, request.gpus_per_node, wl):
            replicas = world // family.replica_ranks(layout)
            for levers in _levers(options):
                for micro, split in family.splits(request.global_batch, replicas, layout):
                    knobs = {**layout, **levers, **split}
                    configs.append(
                        Config(
                            family.name,
                            label,
                            request.model,
                            family.strategy,
                            family.impl,
                            knobs,
                            micro,
                            world,
                        )
                    )
    return configs


def _levers(options) -> list[dict[str, Any]]:
    """Each combination of the step's knobs the space varies: checkpointing, precision and
    compile (set only where on, so that an eager row's knobs and command are as before)."""
    return [
        {"activation_checkpointing": ckpt, "precision": precision}
        | ({"compile": mode} if compiles({"compile": mode}) else {})
        for ckpt in options["activation_checkpointing"]
        for precision in options["precision"]
        for mode in options.get("compile", (EAGER,))
    ]


def why_empty(request: PlanRequest) -> str:
    """Why the request's space holds no configuration, in one line: its families lay out none
    of the model at its world size (a pipeline needs a workload that names its blocks), or no
    layout splits its global batch."""
    wl = workload(request.model)
    asked = [FAMILIES[f] for f in request.families]
    if not any(f.layouts(request.world_size, request.gpus_per_node, wl) for f in asked):
        return (
            f"{', '.join(request.families)} lay out no configuration of {request.model} at "
            f"{request.world_size} ranks (tp needs the model's TP plan; pp a workload that names "
            "two blocks or more, Workload.pipeline, and a degree that divides the world)"
        )
    return "no configuration of the space makes that global batch"
