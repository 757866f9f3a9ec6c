"""A pipeline's ranks on a (dp, pp, tp) mesh (``dims.ParallelDims``): the groups a rank of a
pipeline joins, tensor parallelism applied to the plain model before it is cut, FSDP2 over the
replicas of a stage, and a stage's parameters back in full.

Tensor parallelism rewrites the plain model first, with the workload's TP plan over the "tp"
dimension (native: ``parallelize_module`` on DTensors; reference: our Megatron layers), so
that the stages cut from it share its TP modules; each block's output is a local tensor, so a
stage sends plain activations to the next, as without TP. With ``dp_shard`` each rank's stage
modules are then wrapped by ``fully_shard`` over the "dp" dimension (each unit, then the
stage), as torchtitan composes PP with FSDP: the replicas' gradients are reduce-scattered in
backward rather than averaged after the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parallel_kernels.dims import ParallelDims
from parallel_kernels.groups import device_mesh, host_tensors, split
from parallel_kernels.tensor_parallel import apply_plan, check_degree, shard_dims, tp_plan
from parallel_kernels.workload import modules_of_types


def pipe_dims(
    world: int, pp_degree: int | None, tp_degree: int = 1, dp_shard: bool = False
) -> ParallelDims:
    """The point's ranks as (replica, stage rank, TP rank): ``tp_degree`` ranks a TP group,
    ``pp_degree`` of them a pipeline (None: every rank the TP groups leave), the rest replicas;
    degrees that do not divide the world are refused."""
    return ParallelDims(world=world, pp=pp_degree, tp=tp_degree, dp_shard=dp_shard)


def mesh_shape(
    world: int, pp_degree: int | None = None, tp_degree: int = 1, dp_shard: bool = False, **_
) -> tuple[int, ...] | None:
    """The (dp, pp, tp) grid whose lines are the groups a point asks for; None where the
    pipeline is the point's whole group (one replica, no TP)."""
    dims = pipe_dims(world, pp_degree, tp_degree, dp_shard)
    return dims.shape if dims.replica < world or dims.tp > 1 else None


def replica_ranks(world: int, pp_degree: int | None = None, tp_degree: int = 1, **_) -> int:
    """Ranks one data-parallel replica spans: a pipeline of TP groups."""
    return pipe_dims(world, pp_degree, tp_degree).replica


@dataclass(frozen=True)
class PipeGroups:
    """This rank's place in the grid: the pipeline's group, the group of the ranks holding the
    same stages in every replica (None: one replica), its TP group (None: no TP), the device
    mesh FSDP2 and DTensor need (None: neither used), and its (replica, stage, TP) ranks."""

    dims: ParallelDims
    pipe: Any
    replicas: Any
    tp: Any
    mesh: Any
    dp_rank: int
    pp_rank: int
    tp_rank: int

    @property
    def sharded(self) -> bool:
        """Whether FSDP2 shards the stages over the replicas."""
        return self.dims.dp_shard and self.dims.dp > 1


def pipe_groups(group, dims: ParallelDims, device: torch.device, native: bool) -> PipeGroups:
    """The groups of this rank of ``group``, laid out by ``dims``; a device mesh where
    FSDP2 shards the replicas or the native implementation runs TP on DTensors."""
    coords = dims.coords(dist.get_rank(group))
    if dims.replica == dims.world and dims.tp == 1:
        return PipeGroups(dims, group, None, None, None, *coords)
    dp_lines, pp_lines, tp_lines = dims.lines()
    replicas = split(group, dp_lines) if dims.dp > 1 else None
    tp = split(group, tp_lines) if dims.tp > 1 else None
    wants_mesh = (dims.dp_shard and dims.dp > 1) or (native and dims.tp > 1)
    mesh = device_mesh(device, group, dims.shape, ParallelDims.NAMES) if wants_mesh else None
    return PipeGroups(dims, split(group, pp_lines), replicas, tp, mesh, *coords)


def check_tp(model: nn.Module, tp_degree: int) -> None:
    """Refuse a TP degree the model's plan cannot split (its workload's ``tp_plan`` missing,
    a layer or the heads not divisible), in one ValueError line."""
    if tp_degree > 1:
        check_degree(model, tp_plan(model), tp_degree)


def tensor_parallel(model: nn.Module, groups: PipeGroups, native: bool) -> dict[str, int]:
    """The plain model rewritten in place by its TP plan over this rank's TP group (before it
    is cut); the split dimension of each parameter our TP layers split, by the plain names, to
    gather them by (empty without TP, and for DTensors, which gather themselves)."""
    if groups.tp is None:
        return {}
    plan = tp_plan(model)
    check_degree(model, plan, groups.dims.tp)
    if native:
        from torch.distributed.tensor.parallel import parallelize_module

        from parallel_kernels.mesh import native_plan

        parallelize_module(model, groups.mesh["tp"], native_plan(plan))
        return {}
    dims_of = shard_dims(model, plan)
    apply_plan(model, plan, groups.tp)
    return dims_of


def shard_stages(stages: list[nn.Module], units: tuple[type[nn.Module], ...], groups) -> None:
    """Each of this rank's stage modules sharded by FSDP2 over the replicas: its units (the
    workload's FSDP units) and then the stage itself."""
    from torch.distributed.fsdp import fully_shard

    mesh = groups.mesh["dp"]
    with host_tensors():
        for stage in stages:
            for unit in modules_of_types(stage, units):
                fully_shard(unit, mesh=mesh)
            fully_shard(stage, mesh=mesh)


def local_shape(param: torch.Tensor, groups: PipeGroups) -> tuple[int, ...]:
    """The shape of the tensor this rank holds of a plain parameter after TP (already applied
    to ``param``) and FSDP2 (rows chunked over the replicas, as ``torch.chunk`` cuts them)."""
    shape = tuple(local(param).shape)
    if not groups.sharded:
        return shape
    rows = torch.empty(shape[0], device="meta").chunk(groups.dims.dp)
    mine = rows[groups.dp_rank].shape[0] if groups.dp_rank < len(rows) else 0
    return (mine, *shape[1:])


def local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (itself, not a copy), or the tensor."""
    if hasattr(t, "to_local"):
        with torch.no_grad():
            return t.to_local()
    return t


@torch.no_grad()
def full_tensor(t: torch.Tensor, dim: int | None, groups: PipeGroups) -> torch.Tensor:
    """A parameter in full: a DTensor gathered over its mesh, then a slice of our TP layers
    gathered over the TP group along its split ``dim`` (collectives on the ranks holding its
    stage)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    if dim is None or groups.tp is None:
        return t.detach()
    parts = [torch.empty_like(t) for _ in range(groups.dims.tp)]
    dist.all_gather(parts, t.detach().contiguous(), group=groups.tp)
    return torch.cat(parts, dim=dim)
