"""Rank arithmetic in one place: a group's ranks laid out as a row-major grid.

``outer`` replicas of ``inner`` consecutive ranks each (row-major, as torchtitan's ParallelDims
and ``init_device_mesh`` lay them out). Tensor parallelism puts a TP group on the inner
dimension and data-parallel replicas on the outer one; hybrid FSDP a shard group inside and
replicas across; plain data parallelism has an inner size of 1 (every rank its own replica).
``ParallelDims`` is the same arithmetic over three dimensions, (dp, pp, tp), for a pipeline
whose stages are tensor-parallel and whose replicas replicate or shard them.
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


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """A point's ranks as a row-major (dp, pp, tp) grid: ``tp`` consecutive ranks a
    tensor-parallel group, ``pp`` of those a pipeline, the rest (``dp``) its data-parallel
    replicas, which replicate (DDP) or, ``dp_shard``, shard (FSDP2) each stage. A pipeline of
    one tensor-parallel rank is ``MeshDims``' (replica, stage rank) grid, its ranks consecutive
    as before. ``pp`` None: every rank the TP groups leave is a pipeline rank."""

    world: int
    pp: int | None = None
    tp: int = 1
    dp_shard: bool = False

    NAMES = ("dp", "pp", "tp")

    def __post_init__(self) -> None:
        for name, value in (("PP degree", self.pp), ("TP degree", self.tp)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.world % self.tp:
            raise ValueError(f"TP degree {self.tp} does not divide the world size {self.world}")
        if self.pp is None:
            object.__setattr__(self, "pp", self.world // self.tp)
        if self.world % (self.pp * self.tp):
            what = f"PP degree {self.pp}" if self.tp == 1 else f"PP x TP {self.pp} x {self.tp}"
            raise ValueError(f"{what} does not divide the world size {self.world}")

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
