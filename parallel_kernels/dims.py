"""Rank arithmetic in one place: a group's ranks laid out as a 2-D grid.

``outer`` replicas of ``inner`` consecutive ranks each (row-major, as torchtitan's ParallelDims
and ``init_device_mesh`` lay them out). Tensor parallelism puts a TP group on the inner
dimension and data-parallel replicas on the outer one; hybrid FSDP a shard group inside and
replicas across; plain data parallelism has an inner size of 1 (every rank its own replica).
"""

from __future__ import annotations

from dataclasses import dataclass

from parallel_kernels.groups import mesh_lines


@dataclass(frozen=True, kw_only=True)
class MeshDims:
    world: int
    inner: int = 1  # ranks of one inner group: the TP degree, or FSDP's shard group
    dp_shard: bool = False  # TP: the outer (data-parallel) dimension shards (FSDP)
    inner_name: str = "TP degree"  # what ``inner`` is, for the error messages

    def __post_init__(self) -> None:
        if not isinstance(self.inner, int) or self.inner < 1:
            raise ValueError(f"{self.inner_name} must be a positive integer, got {self.inner!r}")
        if self.world % self.inner:
            raise ValueError(
                f"{self.inner_name} {self.inner} does not divide the world size {self.world}"
            )

    @property
    def outer(self) -> int:
        return self.world // self.inner

    # Tensor parallelism's names for the two dimensions.
    tp = property(lambda self: self.inner)
    dp = property(lambda self: self.outer)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.outer, self.inner)

    def coords(self, rank: int) -> tuple[int, int]:
        """(outer index, inner index) of a rank: (dp, tp) for TP, (replica, shard) for FSDP."""
        return divmod(rank, self.inner)

    def lines(self) -> tuple[list[list[int]], list[list[int]]]:
        """(outer groups, inner groups): the rank lists of each dimension's groups."""
        outer, inner = mesh_lines(self.shape)
        return outer, inner
