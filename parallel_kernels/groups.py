"""Process subgroups that the strategies carve out of the group they are given.

Two facts of ``torch.distributed`` shape this module. A subgroup is created by every rank of
the job in the same order (PyTorch names a group by a per-process counter, or, with local
synchronisation, by its ranks and the number of groups the process already holds, so ranks
with different histories would not meet). And DTensor and FSDP cache what they derive from a
device mesh under the mesh's ranks and shape, so two alike meshes must resolve to the same live
groups: subgroups are therefore kept for the life of the process and handed out again for the
same ranks and timeout (a job uses few distinct rank sets).

When a strategy runs on the whole job, its subgroups are created on first use (every rank is
in the strategy's code, in the same order). When it runs on part of the job (a world-size
sweep runs a 2-rank point in a 4-rank launch while the other ranks wait), every rank first
calls ``prepare`` with the lines of the strategy's mesh, so that waiting ranks take part.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

_KEPT: dict[tuple, dist.ProcessGroup] = {}


def ranks_of(group: dist.ProcessGroup | None) -> list[int]:
    """Global ranks of ``group``'s members, in group-rank order."""
    n = dist.get_world_size(group)
    return [dist.get_global_rank(group, r) for r in range(n)] if group else list(range(n))


def timeout_of(group: dist.ProcessGroup | None) -> datetime.timedelta | None:
    """The timeout ``group`` was created with (None: the default group's)."""
    if group is None:
        return None
    for device in ("cpu", "cuda"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return None


def mesh_lines(shape: tuple[int, ...]) -> list[list[list[int]]]:
    """Per dimension of a row-major grid of ``shape`` over ranks 0..n-1, the lines along it:
    the rank lists that vary only that dimension's index (the groups of that dimension)."""
    with host_tensors():
        grid = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
        return [grid.movedim(d, -1).reshape(-1, shape[d]).tolist() for d in range(len(shape))]


def host_tensors():
    """A context in which tensors are real even under ``FakeTensorMode`` (the planner builds a
    strategy with fake tensors, bench/plan/memory.py): a mesh's rank grid is bookkeeping read
    back with ``tolist``, which a fake tensor cannot give."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _kept(ranks: list[int], timeout: datetime.timedelta | None) -> dist.ProcessGroup:
    """The kept group of these global ranks; created here, by every rank of the job."""
    key = (tuple(ranks), timeout)
    if key not in _KEPT:
        _KEPT[key] = dist.new_group(list(ranks), timeout=timeout)
    return _KEPT[key]


def forget_groups() -> None:
    """Drop the kept groups, whose process group is being destroyed (the planner makes a fake
    world per configuration, bench/plan/memory.py)."""
    _KEPT.clear()


def prepare(group_ranks: list[int], lines: list[list[list[int]]], timeout) -> None:
    """Create (every rank of the job, in the same order) the kept groups that a strategy
    running on ``group_ranks`` will ask ``split`` for: ``lines`` as ``mesh_lines`` gives them,
    in ranks of that group."""
    for dim in lines:
        for line in dim:
            _kept([group_ranks[r] for r in line], timeout)


def split(
    group: dist.ProcessGroup | None, layout: list[list[int]], *, keep_whole: bool = False
) -> dist.ProcessGroup | None:
    """This rank's subgroup among ``layout`` (lists of group ranks that partition ``group``):
    a kept group. A subgroup that is all of ``group`` is ``group`` itself, unless
    ``keep_whole``."""
    me = dist.get_rank(group)
    members = ranks_of(group)
    mine = next(sub for sub in layout if me in sub)
    if len(mine) == len(members) and not keep_whole:
        return group
    timeout = timeout_of(group)
    if len(members) == dist.get_world_size():
        # the whole job runs this strategy: create on first use, every rank alike
        for sub in layout:
            _kept([members[r] for r in sub], timeout)
    key = (tuple(members[r] for r in mine), timeout)
    if key not in _KEPT:
        raise RuntimeError(
            f"subgroup {list(key[0])} was not prepared: a strategy on part of the job needs "
            "groups.prepare on every rank first"
        )
    return _KEPT[key]


def device_mesh(
    device: torch.device,
    group: dist.ProcessGroup | None,
    shape: tuple[int, ...],
    names: tuple[str, ...],
):
    """A row-major DeviceMesh of ``shape`` over ``group``'s ranks, built from kept groups
    (``init_device_mesh`` would span the whole job, and a mesh built on a group that is later
    destroyed would leave DTensor's caches pointing at it)."""
    from torch.distributed.device_mesh import DeviceMesh

    group = group or dist.group.WORLD
    dim_groups = [split(group, lines, keep_whole=True) for lines in mesh_lines(shape)]
    with host_tensors():
        if len(shape) == 1:
            return DeviceMesh.from_group(dim_groups[0], device.type, mesh_dim_names=names)
        global_grid = torch.tensor(ranks_of(group)).reshape(shape)
        return DeviceMesh.from_group(
            dim_groups, device.type, mesh=global_grid, mesh_dim_names=names
        )


_POINT: list[dist.ProcessGroup | None] = [None]


def point_group() -> dist.ProcessGroup | None:
    """The process group of the point this rank is running (None outside one: the default
    group). A model that issues collectives of its own (an MoE's all-to-all, a statistic
    averaged over ranks) passes it as ``group=``: the point runs in a group of its own, with its
    own timeout, and the job's default group is the suite's."""
    return _POINT[0]


def set_point_group(group: dist.ProcessGroup | None) -> None:
    """The harness names the point's group while the point runs (None after it)."""
    _POINT[0] = group
