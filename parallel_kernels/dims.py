"""Rank arithmetic in one place: a point's ranks as one validated row-major grid.

``ParallelDims`` lays a group's ranks out as (dp, pp, tp), as torchtitan's ParallelDims and
``init_device_mesh`` do: ``tp`` consecutive ranks a tensor-parallel group (on a GPU node they
share the fastest links), ``pp`` of those a pipeline, and the rest (``dp``) data-parallel
replicas, which replicate each parameter (DDP) or, ``dp_shard``, shard it (FSDP). Hybrid FSDP
splits the data-parallel ranks once more into replicas of ``shard_group`` consecutive ranks
(``dp_grid``). Plain data parallelism is the grid (world, 1, 1); tensor parallelism x DP
(parallel_kernels/mesh.py) is (dp, 1, tp); a pipeline's replicas and stages
(parallel_kernels/pipeline_mesh.py) are (dp, pp, tp). Every degree is checked here, once,
against the world size: a degree that does not divide it is one ValueError line.
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_kernels.groups import mesh_lines


def _positive(name: str, value) -> None:
    if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    world: int
    pp: int | None = 1  # ranks of one pipeline; None: every rank the TP groups leave
    tp: int = 1  # ranks of one tensor-parallel group
    dp_shard: bool = False  # the data-parallel ranks shard the parameters (FSDP), not replicate
    shard_group: int | None = None  # hybrid FSDP: data-parallel ranks of one shard group

    NAMES = ("dp", "pp", "tp")

    def __post_init__(self) -> None:
        _positive("PP degree", self.pp)
        _positive("TP degree", self.tp)
        _positive("shard group", self.shard_group)
        if self.world % self.tp:
            raise ValueError(f"TP degree {self.tp} does not divide the world size {self.world}")
        if self.pp is None:
            object.__setattr__(self, "pp", self.world // self.tp)
        if self.world % (self.pp * self.tp):
            what = f"PP degree {self.pp}" if self.tp == 1 else f"PP x TP {self.pp} x {self.tp}"
            raise ValueError(f"{what} does not divide the world size {self.world}")
        if self.shard_group is not None and self.dp % self.shard_group:
            raise ValueError(
                f"shard group {self.shard_group} does not divide the world size {self.world}"
            )

    @property
    def dp(self) -> int:
        return self.world // (self.pp * self.tp)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.dp, self.pp, self.tp)

    @property
    def replica(self) -> int:
        """Ranks one data-parallel replica (one pipeline of TP groups) spans."""
        return self.pp * self.tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(replica, stage rank, TP rank) of a rank."""
        dp, rest = divmod(rank, self.replica)
        return (dp, *divmod(rest, self.tp))

    def lines(self) -> list[list[list[int]]]:
        """Per dimension (dp, pp, tp), the rank lists of its groups."""
        return mesh_lines(self.shape)

    @property
    def dp_grid(self) -> tuple[int, int]:
        """Hybrid FSDP's (replicate, shard) grid of the data-parallel ranks."""
        shard = self.shard_group or 1
        return (self.dp // shard, shard)

    def dp_grid_lines(self) -> tuple[list[list[int]], list[list[int]]]:
        """(replicate groups, shard groups) of a grid of data-parallel ranks only (pp = tp =
        1): each shard group ``shard_group`` consecutive ranks."""
        if self.replica != 1:
            raise ValueError("a (replicate, shard) grid is of data-parallel ranks only")
        replicate, shard = mesh_lines(self.dp_grid)
        return replicate, shard
