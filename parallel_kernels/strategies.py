"""One registry: strategy name -> the functions that apply it to a plain model.

Every strategy has implementations (``native``: PyTorch's own; ``reference``: ours in this
package), each a function ``apply(model, *, group, device, **options) -> nn.Module``. The model
passed in is plain (see ``models.py``) and already on ``device``; the returned module is what the
training loop calls forward/backward on and gives to the optimiser. Options are keyword-only and
listed per strategy with their defaults, so the sweep layer can validate them before any work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from parallel_kernels.accelerate_ddp import apply_accelerate, autocast_forward
from parallel_kernels.ddp import ReferenceDDP
from parallel_kernels.fsdp import STRATEGIES as SHARDING_STRATEGIES
from parallel_kernels.fsdp import (
    ReferenceFSDP,
    fsdp_comm_bytes,
    fsdp_units,
    shard_group_size,
    zero_state_bytes,
)
from parallel_kernels.groups import device_mesh
from parallel_kernels.mesh import MeshDims, MeshParallel, apply_native_tp, apply_reference_tp
from parallel_kernels.mesh import expected_comm_bytes as mesh_comm_bytes
from parallel_kernels.mesh import expected_state_bytes as mesh_state_bytes

ApplyFn = Callable[..., nn.Module]


def all_parameters(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


COMM_HOOKS = ("none", "fp16", "bf16", "powersgd", "powersgd2")  # powersgd: rank 1
# PowerSGD's settings here (Vogels et al. 2019; torch's PowerSGDState): compress from the second
# step (the first runs a plain all-reduce), and only matrices it shrinks at least twofold.
POWERSGD_START_ITER = 2
POWERSGD_MIN_COMPRESSION = 2.0
POWERSGD_GLOO_MAX_BYTES = 1 << 20  # DDP's first bucket holds 1 MiB: above it, two buckets


def powersgd_rank(comm_hook: str) -> int:
    """The matrix rank of a PowerSGD setting: ``powersgd`` is rank 1, ``powersgd2`` rank 2."""
    return int(comm_hook.removeprefix("powersgd") or 1)


def _check_hook(comm_hook: str) -> None:
    if comm_hook not in COMM_HOOKS:
        raise ValueError(f"unknown comm_hook {comm_hook!r} (known: {', '.join(COMM_HOOKS)})")


def apply_native_ddp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    bucket_cap_mb: float = 25.0,
    comm_hook: str = "none",
) -> nn.Module:
    """DistributedDataParallel, with one of PyTorch's communication hooks: fp16/bf16
    compression (``default_hooks``) or PowerSGD of rank 1 or 2 with error feedback."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    _check_hook(comm_hook)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(
        model, process_group=group, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb
    )
    if comm_hook in ("fp16", "bf16"):
        hook = getattr(default_hooks, f"{comm_hook}_compress_hook")
        ddp.register_comm_hook(group, hook)
    elif comm_hook.startswith("powersgd"):
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if dist.get_backend(group) == "gloo" and grad_bytes > POWERSGD_GLOO_MAX_BYTES:
            # Seen here with torch 2.13: wide_mlp (two buckets) hangs in the first compressed
            # step; the seed MLP (one bucket) runs.
            raise ValueError(
                "PowerSGD hangs on gloo with more than one gradient bucket (its all-reduces are "
                "issued from future callbacks); use NCCL, or a model under 1 MiB of gradients"
            )
        state = psgd.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=powersgd_rank(comm_hook),
            start_powerSGD_iter=POWERSGD_START_ITER,
            min_compression_rate=POWERSGD_MIN_COMPRESSION,
        )
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    return ddp


def apply_reference_ddp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    bucket_cap_mb: float = 25.0,
    overlap: bool = True,
    comm_hook: str = "none",
) -> nn.Module:
    """ReferenceDDP; ``comm_hook`` fp16/bf16 casts each bucket down for its all-reduce (it
    works on gloo, where PyTorch's bf16 hook refuses); PowerSGD is native only."""
    del device  # buckets live where the parameters live
    _check_hook(comm_hook)
    if comm_hook.startswith("powersgd"):
        raise ValueError("PowerSGD is implemented by native DDP only (comm_hook=powersgd*)")
    compress = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(comm_hook)
    return ReferenceDDP(
        model, group=group, bucket_cap_mb=bucket_cap_mb, overlap=overlap, compress=compress
    )


def apply_ddp_autocast(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    mixed_precision: str = "none",
) -> nn.Module:
    """Plain DDP with the forward under autocast and fp32 outputs, as Accelerate prepares it."""
    return apply_native_ddp(autocast_forward(model, device, mixed_precision), group=group,
                            device=device)  # fmt: skip


def _ddp_expected_comm_bytes(psi: int, n: int, *, model: nn.Module, comm_hook: str = "none",
                             **_) -> float:  # fmt: skip
    """Every gradient all-reduced once: 4 Psi in fp32, 2 Psi compressed to fp16/bf16. PowerSGD
    of rank r (Vogels et al. 2019, algorithm 1) all-reduces, per gradient matrix of n x m
    elements (a tensor viewed as shape[0] x the rest), P (n x r) and Q (m x r) in fp32 when
    that shrinks it at least ``POWERSGD_MIN_COMPRESSION`` fold, else the matrix itself; 1-D
    gradients (biases) go uncompressed. Counted in its compressing steps."""
    if comm_hook in ("fp16", "bf16"):
        return 2 * psi
    if not comm_hook.startswith("powersgd"):
        return 4 * psi
    r = powersgd_rank(comm_hook)
    total = 0.0
    for p in model.parameters():
        if p.dim() <= 1:
            total += 4 * p.numel()
            continue
        rows, cols = p.shape[0], p.numel() // p.shape[0]
        low_rank = (rows + cols) * min(r, rows, cols)
        total += 4 * (low_rank if rows * cols >= POWERSGD_MIN_COMPRESSION * low_rank
                      else rows * cols)  # fmt: skip
    return total


def _check_strategy(strategy: str) -> None:
    if strategy not in SHARDING_STRATEGIES:
        raise ValueError(
            f"unknown sharding strategy {strategy!r} (known: {', '.join(SHARDING_STRATEGIES)})"
        )


PRECISIONS = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
FSDP1_DEFAULTS = {"auto_wrap": "module", "cpu_offload": False, "hybrid_mesh": True}


def _refuse_fsdp1_options(impl: str, options: dict) -> None:
    """Options of the FSDP1 API only: harmless at their defaults, refused otherwise."""
    for key, value in options.items():
        if key not in FSDP1_DEFAULTS:
            raise TypeError(f"unexpected option {key!r}")
        if value != FSDP1_DEFAULTS[key]:
            raise ValueError(f"option {key}={value} exists only for native_fsdp1, not {impl}")


def _precision(mixed_precision: str) -> torch.dtype | None:
    if mixed_precision not in PRECISIONS:
        raise ValueError(
            f"unknown mixed precision {mixed_precision!r} (known: {', '.join(PRECISIONS)})"
        )
    return PRECISIONS[mixed_precision]


def apply_reference_fsdp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    sharding_strategy: str = "FULL_SHARD",
    shard_size: int | None = None,
    mixed_precision: str = "none",
    **fsdp1_only,
) -> nn.Module:
    del device
    _check_strategy(sharding_strategy)
    _refuse_fsdp1_options("reference", fsdp1_only)
    return ReferenceFSDP(
        model,
        fsdp_units(model),
        strategy=sharding_strategy,
        group=group,
        shard_size=shard_size,
        compute_dtype=_precision(mixed_precision),
    )


def _fsdp_mesh_shape(
    n: int, sharding_strategy: str = "FULL_SHARD", shard_size: int | None = None, **_
) -> tuple[int, ...]:
    """1-D for FULL_SHARD / SHARD_GRAD_OP, 2-D (replicate, shard) for HYBRID_SHARD and for
    NO_SHARD (shard size 1)."""
    if sharding_strategy in ("FULL_SHARD", "SHARD_GRAD_OP"):
        return (n,)
    s = shard_group_size(sharding_strategy, n, shard_size)
    return (n // s, s)


def fsdp_mesh(device: torch.device, group, strategy: str, shard_size: int | None):
    """The device mesh the current FSDP API takes, over ``group``'s ranks."""
    shape = _fsdp_mesh_shape(dist.get_world_size(group), strategy, shard_size)
    return device_mesh(device, group, shape, ("shard",) if len(shape) == 1 else
                       ("replicate", "shard"))  # fmt: skip


def apply_native_fsdp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    sharding_strategy: str = "FULL_SHARD",
    shard_size: int | None = None,
    mixed_precision: str = "none",
    **fsdp1_only,
) -> nn.Module:
    """``fully_shard`` (FSDP2) on each unit, then on the root; ``reshard_after_forward`` is
    False for SHARD_GRAD_OP; mixed precision through ``MixedPrecisionPolicy``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _check_strategy(sharding_strategy)
    _refuse_fsdp1_options("native", fsdp1_only)
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


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the gradient of the whole model to ``max_norm`` however it is split across ranks:
    the wrapper's own method where it has one (FSDP1, the reference), else PyTorch's, which
    handles DTensor shards (FSDP2) and replicated gradients (DDP)."""
    own = getattr(model, "clip_grad_norm_", None)
    if own is not None:
        return own(max_norm)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


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


def data_parallel_coords(model: nn.Module, rank: int, world: int) -> tuple[int, int]:
    """(index, size) of this rank's data-parallel replica: ranks of one tensor-parallel group
    must read the same batch."""
    if isinstance(model, MeshParallel):
        return model.dp_rank, model.dp_size
    return rank, world


def _fsdp_expected_comm_bytes(
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


def _fsdp_expected_state_bytes(
    psi: int, n: int, sharding_strategy: str = "FULL_SHARD", shard_size: int | None = None, **_
) -> float:
    return zero_state_bytes(psi, n, sharding_strategy, shard_size)


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    description: str
    impls: Mapping[str, ApplyFn]
    options: Mapping[str, Any]  # option name -> default
    default_impls: tuple[str, ...]
    # Tensors every rank must hold bit-identically after a step; the harness checksums them to
    # catch a run whose replicas silently diverged.
    replicated: Callable[[nn.Module], list[torch.Tensor]] = lambda m: all_parameters(m)
    # Bytes of parameters, gradients and optimiser state one rank holds, by the ZeRO paper's
    # accounting: (params, world size, *, model, impl, tokens, **options) -> bytes, where model
    # is the plain model before the strategy rewrites it and tokens the activation rows of one
    # rank's batch.
    expected_state_bytes: Callable[..., float] | None = None
    # Payload bytes per step as the backend records them (each collective's input), same
    # arguments.
    expected_comm_bytes: Callable[..., float] | None = None
    # The shape of the device mesh the strategy lays its ranks on, (world size, **options) ->
    # shape, or None without subgroups: its lines are the subgroups it will ask for (see
    # groups.prepare).
    mesh_shape: Callable[..., tuple[int, ...] | None] = lambda n, **_: None

    def apply(self, impl: str, model: nn.Module, **kwargs: Any) -> nn.Module:
        if impl not in self.impls:
            raise KeyError(f"strategy {self.name!r} has no implementation {impl!r}")
        return self.impls[impl](model, **kwargs)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="ddp",
            description="data parallel: replicated model, gradients all-reduced in buckets",
            impls={
                "native": apply_native_ddp,
                "reference": apply_reference_ddp,
                # Same buckets, all-reduced only after backward: the no-overlap baseline.
                "reference_nooverlap": partial(apply_reference_ddp, overlap=False),
            },
            options={"bucket_cap_mb": 25.0, "comm_hook": "none"},
            default_impls=("native", "reference"),
            expected_state_bytes=lambda psi, n, **_: zero_state_bytes(psi, n, "NO_SHARD"),
            expected_comm_bytes=_ddp_expected_comm_bytes,
        ),
        Strategy(
            name="fsdp",
            description="sharded data parallel (ZeRO): parameters, gradients and optimiser "
            "state split across ranks",
            impls={
                "native": apply_native_fsdp,
                "reference": apply_reference_fsdp,
                "native_fsdp1": apply_native_fsdp1,
            },
            options={
                "sharding_strategy": "FULL_SHARD",
                "shard_size": None,
                "mixed_precision": "none",
                **FSDP1_DEFAULTS,
            },
            default_impls=("native", "native_fsdp1", "reference"),
            replicated=fsdp_full_parameters,
            expected_state_bytes=_fsdp_expected_state_bytes,
            expected_comm_bytes=_fsdp_expected_comm_bytes,
            mesh_shape=_fsdp_mesh_shape,
        ),
        Strategy(
            name="accelerate",
            description="data parallel prepared by Hugging Face Accelerate (optional extra), "
            "next to plain DDP with the same autocast",
            impls={"native": apply_ddp_autocast, "accelerate": apply_accelerate},
            options={"mixed_precision": "none"},
            default_impls=("native", "accelerate"),
            expected_state_bytes=lambda psi, n, **_: zero_state_bytes(psi, n, "NO_SHARD"),
            expected_comm_bytes=lambda psi, n, **_: 4 * psi,  # fp32 gradients, all-reduced once
        ),
        Strategy(
            name="tp",
            description="tensor parallel (Megatron column/row layers) over a (dp, tp) mesh, "
            "data parallel (DDP, or FSDP with dp_shard) over the rest of the ranks",
            impls={
                "native": apply_native_tp,
                "reference": apply_reference_tp,
                # The seed's column layer that all-gathers its output: what pairing saves.
                "naive": partial(apply_reference_tp, naive=True),
            },
            options={"tp_degree": 1, "dp_shard": False},
            default_impls=("native", "reference", "naive"),
            replicated=lambda m: list(m.full_state().values()),
            expected_state_bytes=mesh_state_bytes,
            expected_comm_bytes=mesh_comm_bytes,
            mesh_shape=lambda n, tp_degree=1, dp_shard=False, **_: (
                MeshDims(world=n, tp=tp_degree, dp_shard=dp_shard).shape
            ),
        ),
    )
}
