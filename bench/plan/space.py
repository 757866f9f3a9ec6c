"""The configurations a plan weighs, each resolved into the point record a sweep would run.

For a model at a world size: DDP at a few bucket sizes; FSDP2 and FSDP1 with each sharding
strategy (hybrid with one node's ranks per shard group, where the world spans nodes); tensor
parallelism at each degree within a node, the rest of the ranks data parallel, replicated (DDP)
or sharded (FSDP); each with activation checkpointing off and on, in fp32 and bf16, and at each
(micro-batch, accumulation) pair whose product over the replicas is the global batch. Every
row resolves to a ``PointRecord`` (``bench.runner.configure.resolve.resolve_point``, what
``bench/run.py`` resolves) and names the exact ``bench/run.py`` command that runs it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from bench.runfolder.points import PointRecord
from bench.runner.configure.resolve import resolve_point
from parallel_kernels.models import workload

BUCKETS_MB = (5.0, 25.0, 100.0)
SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
FAMILIES = ("ddp", "fsdp2", "fsdp1", "tp")  # what --strategy names
MAX_ACCUM = 8
OPTIONS = {  # what --option narrows, and each one's values
    "activation_checkpointing": ("off", "on"),
    "precision": ("fp32", "bf16"),
}
# The sweep whose values set each strategy's layout knob (what a row's command runs).
LAYOUT_SWEEP = {"ddp": "bucket_cap_mb", "fsdp": "sharding_strategy", "tp": "tp_degree"}
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
    """One configuration: its family and name, the strategy, implementation and knobs it sets,
    its micro-batch, and the world size it runs at."""

    family: str  # ddp, fsdp2, fsdp1, tp
    label: str  # e.g. "fsdp2 HYBRID_SHARD/8", "tp4 x ddp"
    model: str
    strategy: str
    impl: str
    knobs: dict[str, Any] = field(default_factory=dict)
    micro_batch: int = 1
    world_size: int = 1

    def point(self, **changes: Any) -> PointRecord:
        """The record ``bench/run.py`` would resolve (at another world size, micro-batch or
        with other knobs where ``changes`` says so)."""
        c = replace(self, **changes) if changes else self
        return resolve_point(
            sweep="plan",
            values={"plan": c.label},
            model=c.model,
            strategy=c.strategy,
            impl=c.impl,
            knobs=dict(c.knobs),
            world_size=c.world_size,
            batch_size=c.micro_batch,
        )

    def command(self, world_size: int | None = None, gpus_per_node: int = 8) -> str:
        """The ``bench/run.py`` command that runs this configuration (on ``world_size`` ranks,
        its own by default; torchrun's rendezvous flags for several nodes are the user's)."""
        world = world_size or self.world_size
        sweep = LAYOUT_SWEEP[self.strategy]
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
        args += [f"--option={k}={_text(v)}" for k, v in self.knobs.items() if k != sweep]
        return shlex.join(args)


def _layouts(world: int, gpus_per_node: int, tp_ok: bool) -> list[tuple[str, str, str, str, dict]]:
    """(family, label, strategy, impl, knobs) of each parallel layout at this world size."""
    out = [
        ("ddp", f"ddp bucket {mb:g} MB", "ddp", "native", {"bucket_cap_mb": mb})
        for mb in BUCKETS_MB
    ]
    for impl, family in (("native", "fsdp2"), ("native_fsdp1", "fsdp1")):
        for sharding in SHARDINGS:
            knobs: dict[str, Any] = {"sharding_strategy": sharding}
            label = f"{family} {sharding}"
            if sharding == "HYBRID_SHARD":
                shard = min(gpus_per_node, world // 2)
                if shard < 2 or world % shard:
                    continue  # no shard group of two or more with replicas of it
                knobs["shard_size"] = shard
                label += f"/{shard}"
            out.append((family, label, "fsdp", impl, knobs))
    degree = 2
    while tp_ok and degree <= min(gpus_per_node, world):
        if world % degree == 0:
            for shard, dp in ((False, "ddp"), (True, "fsdp")):
                if shard and world // degree < 2:
                    continue  # no data-parallel dimension to shard
                label = f"tp{degree} x {dp}" if world > degree else f"tp{degree}"
                knobs = {"tp_degree": degree, "dp_shard": shard}
                out.append(("tp", label, "tp", "native", knobs))
        degree *= 2
    return out


def micro_batches(global_batch: int, replicas: int) -> list[tuple[int, int]]:
    """(micro-batch, accumulation) pairs with micro x accumulation x replicas = global batch,
    accumulation a power of two up to ``MAX_ACCUM``."""
    if global_batch % replicas:
        return []
    per_replica = global_batch // replicas
    pairs, accum = [], 1
    while accum <= min(MAX_ACCUM, per_replica):
        if per_replica % accum == 0:
            pairs.append((per_replica // accum, accum))
        accum *= 2
    return pairs


def enumerate_space(
    model: str,
    *,
    world_size: int,
    gpus_per_node: int,
    global_batch: int,
    families: tuple[str, ...] = FAMILIES,
    options: dict[str, tuple[str, ...]] | None = None,
) -> list[Config]:
    """Every configuration of ``model`` at ``world_size`` that makes ``global_batch``."""
    options = {**OPTIONS, **(options or {})}
    tp_ok = workload(model).tp_plan is not None
    configs = []
    for family, label, strategy, impl, layout in _layouts(world_size, gpus_per_node, tp_ok):
        if family not in families:
            continue
        replicas = world_size // layout.get("tp_degree", 1)
        for ckpt in options["activation_checkpointing"]:
            for precision in options["precision"]:
                for micro, accum in micro_batches(global_batch, replicas):
                    knobs = {
                        **layout,
                        "activation_checkpointing": ckpt,
                        "precision": precision,
                        "grad_accum": accum,
                    }
                    configs.append(
                        Config(family, label, model, strategy, impl, knobs, micro, world_size)
                    )
    return configs
