"""Two-dimensional parallelism applied to a plain model: data parallel x tensor parallel.

``dims.ParallelDims`` is the one place that checks the degrees against the world size and
lays the ranks out: here a (dp, 1, tp) grid in row-major order, so that the
ranks of one TP group are consecutive (on a GPU node they share the fastest links) and each DP
group takes one rank from every TP group. The apply functions return a ``MeshParallel``, which
the harness drives like any other wrapped model and asks for the data-parallel coordinates
(ranks of one TP group must read the same batch) and for the full parameters.

The data-parallel dimension replicates (DDP) or shards (FSDP's FULL_SHARD); over it the
reference uses ``ReferenceDDP``/``ReferenceFSDP`` on the TP-rewritten model and the native
implementation uses ``DistributedDataParallel``/``fully_shard`` on the DTensor model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from parallel_kernels.ddp import ReferenceDDP
from parallel_kernels.dims import ParallelDims
from parallel_kernels.fsdp_layout import fsdp_comm_bytes, fsdp_units, zero_state_bytes
from parallel_kernels.fsdp_reference import ReferenceFSDP
from parallel_kernels.groups import device_mesh, host_tensors, split
from parallel_kernels.tensor_parallel import (
    COLWISE,
    COPY,
    ROWWISE,
    apply_plan,
    check_degree,
    comm_elements,
    local_param_count,
    plan_for,
    shard_dims,
    tp_plan,
)


class MeshParallel(nn.Module):
    """A model parallelised over a (dp, tp) mesh; forward goes to the wrapped module."""

    def __init__(
        self,
        module: nn.Module,
        model: nn.Module,
        *,
        dims: ParallelDims,
        rank: int,
        tp_group,
        shard_dims: dict[str, int],
    ) -> None:
        super().__init__()
        self.module = module
        self.dims = dims
        self.dp_rank, _, self.tp_rank = dims.coords(rank)
        self.tp_group = tp_group
        self.shard_dims = shard_dims
        self._model = [model]  # the plain model, rewritten in place (a list: not a submodule)
        # The parameters as the optimiser sees them, by name. PyTorch's DDP x TP transform
        # swaps new Parameter objects (same storage) into the modules after every forward;
        # the gradients land on these.
        self._params = dict(model.named_parameters())

    @property
    def dp_size(self) -> int:
        return self.dims.dp

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def full_state(self) -> dict[str, torch.Tensor]:
        """Every parameter of the plain model in full, by name (collectives on every rank):
        the DP dimension gathered first (FSDP), then the TP slices along their split dims."""
        model = self._model[0]
        if isinstance(self.module, ReferenceFSDP):
            buffers = dict(model.named_buffers())
            state = self.module.full_state_dict(rank0_only=False)
            state = {k: v for k, v in state.items() if k not in buffers}
        else:
            state = {k: p.detach() for k, p in self._params.items()}
        return {name: self._full(name, t) for name, t in state.items()}

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward without the data-parallel dimension's gradient synchronisation, for
        gradient accumulation: its wrapper's ``no_sync`` (DDP's, the reference DDP's) or
        FSDP2's ``set_requires_gradient_sync`` switch (``dp_shard``). TP's own calls still run:
        they carry activations the computation needs. With one data-parallel rank there is
        nothing to skip. A wrapper with neither (the reference FSDP) raises ValueError."""
        if self.dims.dp == 1:
            yield
            return
        own = getattr(self.module, "no_sync", None)
        if own is not None:
            with own():
                yield
            return
        switch = getattr(self._model[0], "set_requires_gradient_sync", None)
        if switch is None:
            raise ValueError(f"{type(self.module).__name__} has no way to skip gradient sync")
        switch(False)
        try:
            yield
        finally:
            switch(True)

    @torch.no_grad()
    def full_grads(self) -> dict[str, torch.Tensor]:
        """Every parameter's gradient in full, by name (collectives on every rank); for a
        replicating DP dimension (a sharding one keeps gradients in flat shards)."""
        if isinstance(self.module, ReferenceFSDP):
            raise ValueError("gradients of a sharded data-parallel dimension are flat shards")
        return {
            name: self._full(name, p.grad) for name, p in self._params.items() if p.grad is not None
        }

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that the whole model's gradient norm is at most ``max_norm``;
        returns that norm. Squares of split gradients are summed over the TP group, those of
        replicated ones counted once (every TP rank holds the same); DP replicas are equal
        after their all-reduce. With a sharding DP dimension, gradients are flat shards that
        mix split and replicated parameters: not supported."""
        if self.dims.dp_shard and self.dims.dp > 1:
            raise ValueError("gradient clipping is not supported with FSDP x TP (dp_shard)")
        grads = {k: p.grad for k, p in self._params.items() if p.grad is not None}
        local = {k: g.to_local() if hasattr(g, "to_local") else g for k, g in grads.items()}
        split = sum(
            (g.float().pow(2).sum() for k, g in local.items() if k in self.shard_dims),
            torch.zeros(()),
        )
        replicated = sum(
            (g.float().pow(2).sum() for k, g in local.items() if k not in self.shard_dims),
            torch.zeros(()),
        )
        if self.dims.tp > 1:
            dist.all_reduce(split, group=self.tp_group)
        total = (split + replicated).sqrt()
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in local.values():
            g.mul_(scale.to(g.dtype))
        return total

    def _full(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if hasattr(t, "full_tensor"):
            return t.full_tensor().detach().clone()
        if name in self.shard_dims and self.dims.tp > 1:
            parts = [torch.empty_like(t) for _ in range(self.dims.tp)]
            dist.all_gather(parts, t.detach().contiguous(), group=self.tp_group)
            return torch.cat(parts, dim=self.shard_dims[name])
        return t.detach().clone()


def _dims(group, tp_degree: int, dp_shard: bool) -> ParallelDims:
    return ParallelDims(world=dist.get_world_size(group), tp=tp_degree, dp_shard=dp_shard)


def _groups(group, dims: ParallelDims):
    """(tp group, dp group) over the ranks of ``group``."""
    if dims.tp == 1:
        return None, group
    if dims.dp == 1:
        return group, None
    dp_lines, _, tp_lines = dims.lines()  # the groups of each mesh dimension
    return split(group, tp_lines), split(group, dp_lines)


def apply_reference_tp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    tp_degree: int = 1,
    dp_shard: bool = False,
    layer: str = "megatron",
) -> nn.Module:
    """Megatron's layers (or, ``layer="naive"``, the naive ones) over TP groups, then
    ReferenceDDP (or ReferenceFSDP, FULL_SHARD, one flat parameter per block) over DP
    groups."""
    del device
    dims = _dims(group, tp_degree, dp_shard)
    plan = plan_for(model, layer, dims.tp)
    check_degree(model, plan, dims.tp)  # before any group exists: a bad degree fails cleanly
    dims_of = shard_dims(model, plan) if dims.tp > 1 else {}
    tp_pg, dp_pg = _groups(group, dims)
    if dims.tp > 1:
        apply_plan(model, plan, tp_pg)
    wrapped = model
    if dims.dp > 1:
        wrapped = (
            ReferenceFSDP(model, fsdp_units(model), strategy="FULL_SHARD", group=dp_pg)
            if dp_shard
            else ReferenceDDP(model, group=dp_pg)
        )
    return MeshParallel(
        wrapped,
        model,
        dims=dims,
        rank=dist.get_rank(group),
        tp_group=tp_pg,
        shard_dims=dims_of,
    )


def native_plan(plan) -> dict:
    """DTensor's styles for our plan. A ``copy`` point becomes a ``PrepareModuleOutput`` that
    leaves the module's output a replicated DTensor, so that q, k and v sum their partial input
    gradients as DTensors and all-reduce once at that point (torchtitan does the same with
    ``PrepareModuleInput`` on its attention module), as the reference's shared ``f`` does."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleOutput,
        RowwiseParallel,
    )

    styles = {
        COLWISE: ColwiseParallel,
        ROWWISE: RowwiseParallel,
        COPY: lambda: PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=Replicate(), use_local_output=False
        ),
    }
    return {name: styles[p.style]() for name, p in plan.items()}


def apply_native_tp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    tp_degree: int = 1,
    dp_shard: bool = False,
) -> nn.Module:
    """``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel`` over the mesh's
    "tp" dimension, then ``DistributedDataParallel`` (after PyTorch's DTensor-to-local
    transform for 2-D) or ``fully_shard`` per block over its "dp" dimension."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.nn.parallel import DistributedDataParallel

    dims = _dims(group, tp_degree, dp_shard)
    plan = tp_plan(model)
    check_degree(model, plan, dims.tp)
    mesh = device_mesh(device, group, (dims.dp, dims.tp), ("dp", "tp"))
    dims_of = shard_dims(model, plan) if dims.tp > 1 else {}
    if dims.tp > 1:
        parallelize_module(model, mesh["tp"], native_plan(plan))
    wrapped = model
    if dims.dp > 1 and dp_shard:
        # fully_shard joins the TP and DP meshes into one (rank grids, real tensors also where
        # the planner builds the model with fake ones; its parameters stay fake)
        with host_tensors():
            for unit in fsdp_units(model):
                fully_shard(unit, mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
    elif dims.dp > 1:
        if dims.tp > 1:
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

            _pre_dp_module_transform(model)
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(
            model, process_group=mesh["dp"].get_group(), device_ids=device_ids
        )
    return MeshParallel(
        wrapped,
        model,
        dims=dims,
        rank=dist.get_rank(group),
        tp_group=mesh["tp"].get_group() if dims.tp > 1 else None,
        shard_dims=dims_of,
    )


def _dp_strategy(dp_shard: bool) -> str:
    return "FULL_SHARD" if dp_shard else "NO_SHARD"


def local_layout(model: nn.Module, layer: str, n: int, tp_degree: int, dp_shard: bool):
    """(mesh dims, TP plan, parameters one rank holds after TP) for the analytical figures;
    ``layer``: the implementation's TP layers, ``megatron`` or ``naive``."""
    dims = ParallelDims(world=n, tp=tp_degree, dp_shard=dp_shard)
    plan = plan_for(model, layer, dims.tp)
    return dims, plan, local_param_count(model, shard_dims(model, plan), dims.tp)


def expected_comm_bytes(
    psi: int,
    n: int,
    *,
    model: nn.Module,
    impl,
    tokens: int,
    tp_degree: int = 1,
    dp_shard: bool = False,
    **_,
) -> float:
    """fp32 payload per step and rank: the TP activations (``comm_elements``) plus the data
    parallel gradients of this rank's Psi_local parameters over the dp ranks, as DDP
    (NO_SHARD: 4 Psi_local all-reduced) or FULL_SHARD moves them (``fsdp_comm_bytes``)."""
    del psi
    dims, plan, local = local_layout(model, impl.tp_layer, n, tp_degree, dp_shard)
    tp_bytes = 4 * sum(comm_elements(model, plan, tokens, dims.tp).values())
    if dims.dp == 1:
        return tp_bytes
    return tp_bytes + fsdp_comm_bytes(local, dims.dp, _dp_strategy(dp_shard))


def expected_state_bytes(
    psi: int,
    n: int,
    *,
    model: nn.Module,
    impl,
    tp_degree: int = 1,
    dp_shard: bool = False,
    **_,
) -> float:
    """The ZeRO accounting (``zero_state_bytes``) of the local parameters over the dp ranks:
    16 bytes each, divided by the DP degree when it shards (ZeRO-3)."""
    del psi
    dims, _, local = local_layout(model, impl.tp_layer, n, tp_degree, dp_shard)
    return zero_state_bytes(local, dims.dp, _dp_strategy(dp_shard))


def mesh_shape(n: int, tp_degree: int = 1, dp_shard: bool = False, **_) -> tuple[int, int]:
    """The (dp, tp) mesh of ``n`` ranks; a TP degree that does not divide them is refused."""
    dims = ParallelDims(world=n, tp=tp_degree, dp_shard=dp_shard)
    return (dims.dp, dims.tp)


def data_parallel_coords(model: nn.Module, rank: int, world: int) -> tuple[int, int]:
    """(index, size) of this rank's data-parallel replica: ranks of one tensor-parallel group
    must read the same batch."""
    if hasattr(model, "dp_size"):  # a (dp, tp) mesh's, a pipeline's
        return model.dp_rank, model.dp_size
    return rank, world  # every rank its own replica
