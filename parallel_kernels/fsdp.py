"""FSDP's implementations as a strategy applies them: PyTorch's ``fully_shard`` (FSDP2), its
``FullyShardedDataParallel`` (FSDP1) and our ``ReferenceFSDP`` (``fsdp_reference.py``), with
their expected communication and state (``fsdp_layout.py``'s formulas)."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from torch import nn

from parallel_kernels.dims import ParallelDims
from parallel_kernels.facts import torch_dtype
from parallel_kernels.fsdp_layout import (
    STRATEGIES,
    fsdp_comm_bytes,
    fsdp_units,
    shard_group_size,
    zero_state_bytes,
)
from parallel_kernels.fsdp_reference import ReferenceFSDP
from parallel_kernels.groups import device_mesh


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown sharding strategy {strategy!r} (known: {', '.join(STRATEGIES)})")


PRECISIONS = ("none", "bf16", "fp16")  # FSDP's mixed precision: its param and reduce dtype


def _precision(mixed_precision: str) -> torch.dtype | None:
    if mixed_precision not in PRECISIONS:
        raise ValueError(
            f"unknown mixed precision {mixed_precision!r} (known: {', '.join(PRECISIONS)})"
        )
    return torch_dtype(mixed_precision)


def apply_reference_fsdp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    sharding_strategy: str = "FULL_SHARD",
    shard_size: int | None = None,
    mixed_precision: str = "none",
) -> nn.Module:
    del device
    _check_strategy(sharding_strategy)
    return ReferenceFSDP(
        model,
        fsdp_units(model),
        strategy=sharding_strategy,
        group=group,
        shard_size=shard_size,
        compute_dtype=_precision(mixed_precision),
    )


def mesh_shape(
    n: int, sharding_strategy: str = "FULL_SHARD", shard_size: int | None = None, **_
) -> tuple[int, ...]:
    """1-D for FULL_SHARD / SHARD_GRAD_OP, 2-D (replicate, shard) for HYBRID_SHARD and for
    NO_SHARD (shard size 1)."""
    if sharding_strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return (n,)
    s = shard_group_size(sharding_strategy, n, shard_size)
    return ParallelDims(world=n, shard_group=s).dp_grid


def fsdp_mesh(device: torch.device, group, strategy: str, shard_size: int | None):
    """The device mesh the current FSDP API takes, over ``group``'s ranks."""
    shape = mesh_shape(dist.get_world_size(group), strategy, shard_size)
    return device_mesh(
        device, group, shape, ("shard",) if len(shape) == 1 else ("replicate", "shard")
    )


def apply_native_fsdp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    sharding_strategy: str = "FULL_SHARD",
    shard_size: int | None = None,
    mixed_precision: str = "none",
) -> nn.Module:
    """``fully_shard`` (FSDP2) on each unit, then on the root; ``reshard_after_forward`` is
    False for SHARD_GRAD_OP; mixed precision through ``MixedPrecisionPolicy``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _check_strategy(sharding_strategy)
    dtype = _precision(mixed_precision)
    mesh = fsdp_mesh(device, group, sharding_strategy, shard_size)
    kwargs: dict = {"reshard_after_forward": sharding_strategy != "SHARD_GRAD_OP"}
    if dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    for unit in fsdp_units(model):
        fully_shard(unit, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def apply_native_fsdp1(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    sharding_strategy: str = "FULL_SHARD",
    shard_size: int | None = None,
    mixed_precision: str = "none",
    auto_wrap: str = "module",
    cpu_offload: bool = False,
    hybrid_mesh: bool = True,
) -> nn.Module:
    """The seed's ``FullyShardedDataParallel`` API (FSDP1): ShardingStrategy, each unit
    auto-wrapped (transformer blocks or linear layers), backward prefetch, original parameters.
    On CPU it needs ``device_id=cpu``. ``auto_wrap``: "module" wraps each unit's class (the
    transformer policy), "size" wraps any module of 100,000 parameters or more (the size-based
    policy). ``cpu_offload`` keeps parameters on the host (it needs pinned memory, so an
    accelerator: on a CPU-only machine the point fails with PyTorch's reason). HYBRID_SHARD gets
    an explicit 2-D device mesh:
    ``hybrid_mesh=False`` reproduces the silent divergence it shows without one (the harness's
    replica check must catch it)."""
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        CPUOffload,
        MixedPrecision,
        ShardingStrategy,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

    _check_strategy(sharding_strategy)
    units = fsdp_units(model)
    kwargs: dict = {}
    dtype = _precision(mixed_precision)
    if dtype is not None:
        kwargs["mixed_precision"] = MixedPrecision(
            param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype
        )
    if auto_wrap == "module":
        policy = ModuleWrapPolicy({type(u) for u in units})
    elif auto_wrap == "size":
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100_000)
    else:
        raise ValueError(f"unknown auto_wrap {auto_wrap!r} (known: module, size)")
    if cpu_offload:
        kwargs["cpu_offload"] = CPUOffload(offload_params=True)
    if sharding_strategy == "HYBRID_SHARD" and hybrid_mesh:
        kwargs["device_mesh"] = fsdp_mesh(device, group, sharding_strategy, shard_size)
    elif sharding_strategy != "HYBRID_SHARD":
        kwargs["process_group"] = group
    return FSDP(
        model,
        sharding_strategy=ShardingStrategy[sharding_strategy],
        auto_wrap_policy=policy,
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        device_id=device,
        use_orig_params=True,
        **kwargs,
    )


def fsdp_full_parameters(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter in full, gathered from the shards (a collective on every rank)."""
    if isinstance(model, ReferenceFSDP):
        return model.full_parameters()
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if isinstance(model, FSDP):
        with FSDP.summon_full_params(model, writeback=False):
            return [p.detach().clone() for p in model.parameters()]
    return [
        p.full_tensor().detach() if hasattr(p, "full_tensor") else p.detach()
        for p in model.parameters()
    ]


def expected_comm_bytes(
    psi: int,
    n: int,
    sharding_strategy: str = "FULL_SHARD",
    shard_size: int | None = None,
    mixed_precision: str = "none",
    **_,
) -> float:
    """``fsdp_comm_bytes`` with 4 bytes per element, or 2 under bf16/fp16 mixed precision
    (which gathers and reduces in that dtype)."""
    b = 4 if _precision(mixed_precision) is None else 2
    return fsdp_comm_bytes(psi, n, sharding_strategy, shard_size, elem_bytes=b)


def expected_state_bytes(
    psi: int, n: int, sharding_strategy: str = "FULL_SHARD", shard_size: int | None = None, **_
) -> float:
    return zero_state_bytes(psi, n, sharding_strategy, shard_size)
