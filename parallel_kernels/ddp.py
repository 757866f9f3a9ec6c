"""Reference data parallelism: gradient buckets all-reduced while backward still runs.

What it does, so that every byte it moves is known:

1. At construction, rank 0's parameters and buffers are broadcast (one flat tensor per dtype), so
   all replicas start equal.
2. Trainable parameters are packed, in reverse registration order (the order backward usually
   produces their gradients), into buckets of at most ``bucket_cap_mb`` megabytes (1 MB = 2**20
   bytes, as ``torch.nn.parallel.DistributedDataParallel`` counts). A parameter larger than the
   cap gets a bucket of its own; parameters are never split.
3. A post-accumulate-grad hook per parameter copies its gradient into its bucket; when the last
   gradient of a bucket arrives the bucket is divided by the world size and an asynchronous
   all-reduce (sum) is launched, so communication overlaps the rest of backward. Buckets are
   launched strictly in index order, so every rank issues the same collectives in the same order
   even when gradients arrive in a different order.
4. An autograd-engine callback at the end of backward launches whatever is left, waits for every
   bucket and copies the averaged gradients back into ``param.grad``: when ``loss.backward()``
   returns, gradients are synchronised and the optimiser can step.

``overlap=False`` keeps the hooks but launches every bucket only at the end of backward, so the
benefit of overlap can be measured rather than assumed. ``no_sync()`` skips synchronisation for
gradient accumulation; the next synchronised backward all-reduces the accumulated gradients.

Bytes moved per synchronised step (payload, as counted in ``comm_stats``): the gradient bytes of
all trainable parameters, once. With a ring all-reduce each rank sends 2(n-1)/n of that.
``compress=torch.bfloat16`` (or float16) all-reduces each bucket cast down: half the bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from weakref import WeakMethod

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from parallel_kernels.accelerate_ddp import autocast_forward
from parallel_kernels.facts import torch_dtype
from parallel_kernels.knobs import COMM_HOOKS, KNOBS

# The knob row holds the default (DistributedDataParallel's own, 25 MB); the wrappers here take
# it from there, so that it is written once.
BUCKET_CAP_MB = KNOBS["bucket_cap_mb"].default

MB = 2**20


@dataclass
class CommStats:
    """Cumulative count of what an implementation asked the backend to move (payload bytes)."""

    calls: int = 0
    bytes: int = 0

    def add(self, tensor: torch.Tensor) -> None:
        self.calls += 1
        self.bytes += tensor.numel() * tensor.element_size()


@dataclass
class _Bucket:
    params: list[nn.Parameter]
    offsets: list[int]
    buffer: torch.Tensor
    pending: int = 0
    work: dist.Work | None = None
    wire: torch.Tensor | None = None  # the compressed copy in flight, when compressing
    ready: set[int] = field(default_factory=set)  # ids of params whose grad was copied in

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def plan_buckets(params: list[nn.Parameter], bucket_cap_mb: float) -> list[list[nn.Parameter]]:
    """Group parameters (already in launch order) into buckets of at most ``bucket_cap_mb``.

    A bucket closes before the parameter that would push it over the cap; a parameter larger than
    the cap sits alone. Parameters of different dtype or device never share a bucket.
    """
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
    cap = bucket_cap_mb * MB
    buckets: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        compatible = not current or (current[0].dtype == p.dtype and current[0].device == p.device)
        if current and (size + nbytes > cap or not compatible):
            buckets.append(current)
            current, size = [], 0
        current.append(p)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def _gone(param: nn.Parameter) -> None:
    """A gradient's hook once its wrapper is gone: nothing to synchronise it with."""
    del param


class ReferenceDDP(nn.Module):
    """Data parallel wrapper built from ``torch.distributed`` collectives (see module docstring)."""

    def __init__(
        self,
        module: nn.Module,
        *,
        group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float = BUCKET_CAP_MB,
        overlap: bool = True,
        compress: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.compress = compress
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.overlap = overlap
        self.require_sync = True
        self.comm_stats = CommStats()
        self._broadcast_state()

        trainable = [p for p in module.parameters() if p.requires_grad]
        self._buckets: list[_Bucket] = []
        self._bucket_of: dict[int, _Bucket] = {}
        for plist in plan_buckets(list(reversed(trainable)), bucket_cap_mb):
            offsets, total = [], 0
            for p in plist:
                offsets.append(total)
                total += p.numel()
            buffer = torch.zeros(total, dtype=plist[0].dtype, device=plist[0].device)
            bucket = _Bucket(params=plist, offsets=offsets, buffer=buffer, pending=len(plist))
            self._buckets.append(bucket)
            for p in plist:
                self._bucket_of[id(p)] = bucket
        self._offset_of = {
            id(p): off for b in self._buckets for p, off in zip(b.params, b.offsets, strict=True)
        }
        self._next_launch = 0
        self._callback_queued = False
        # The hook holds the wrapper weakly: a parameter's hook lives in autograd's C++ side,
        # where the collector cannot see a cycle through it, so a bound method would keep the
        # whole model (parameters, buckets) alive until the process ends (docs/benchmarks.md,
        # "Measured memory").
        on_ready = WeakMethod(self._on_grad_ready)
        for p in trainable:
            p.register_post_accumulate_grad_hook(lambda param: (on_ready() or _gone)(param))

    # -- set-up -------------------------------------------------------------------------------
    @torch.no_grad()
    def _broadcast_state(self) -> None:
        """Make every replica start from group rank 0's parameters and buffers."""
        tensors = [*self.module.parameters(), *self.module.buffers()]
        by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            by_kind.setdefault((t.dtype, t.device), []).append(t)
        for group_tensors in by_kind.values():
            flat = torch.cat([t.reshape(-1) for t in group_tensors])
            self.comm_stats.add(flat)
            dist.broadcast(flat, group_src=0, group=self.group)
            offset = 0
            for t in group_tensors:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    # -- public API ---------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first backward after the block synchronises."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    @property
    def bucket_sizes(self) -> list[int]:
        """Bytes per bucket, in launch order."""
        return [b.nbytes for b in self._buckets]

    # -- backward machinery -------------------------------------------------------------------
    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if not self.require_sync:
            return
        if not self._callback_queued:
            Variable._execution_engine.queue_callback(self._finish_backward)
            self._callback_queued = True
        bucket = self._bucket_of[id(param)]
        off = self._offset_of[id(param)]
        with torch.no_grad():
            bucket.buffer[off : off + param.numel()].copy_(param.grad.reshape(-1))
        bucket.ready.add(id(param))
        bucket.pending -= 1
        if self.overlap and bucket.pending == 0:
            self._launch_in_order(only_ready=True)

    def _launch_in_order(self, *, only_ready: bool) -> None:
        # Prepare every bucket first, then start them all: in overlap-off mode no arithmetic of
        # a later bucket runs while an earlier one is on the wire, so the baseline is clean.
        first = self._next_launch
        while self._next_launch < len(self._buckets):
            bucket = self._buckets[self._next_launch]
            if only_ready and bucket.pending:
                break
            self._prepare(bucket)
            self._next_launch += 1
        for bucket in self._buckets[first : self._next_launch]:
            self._start(bucket)

    @torch.no_grad()
    def _prepare(self, bucket: _Bucket) -> None:
        with record_function("ReferenceDDP.prepare_bucket"):
            for p, off in zip(bucket.params, bucket.offsets, strict=True):
                if id(p) not in bucket.ready:  # no gradient this step: contribute zeros
                    bucket.buffer[off : off + p.numel()].zero_()
            # Average as native DDP does: divide first, then sum (gloo has no AVG reduction).
            bucket.buffer.div_(self.world_size)

    def _start(self, bucket: _Bucket) -> None:
        # Compression (fp16/bf16) casts the averaged bucket down, all-reduces that, and casts
        # the sum back: half the bytes, after the fp16/bf16 hooks of PyTorch's DDP.
        wire = bucket.buffer if self.compress is None else bucket.buffer.to(self.compress)
        bucket.wire = wire
        self.comm_stats.add(wire)
        bucket.work = dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

    def _finish_backward(self) -> None:
        self._launch_in_order(only_ready=False)
        with torch.no_grad(), record_function("ReferenceDDP.wait_buckets"):
            for bucket in self._buckets:
                bucket.work.wait()
                if bucket.wire is not bucket.buffer:
                    bucket.buffer.copy_(bucket.wire)
                bucket.wire = None
        with torch.no_grad(), record_function("ReferenceDDP.copy_grads_out"):
            for bucket in self._buckets:
                for p, off in zip(bucket.params, bucket.offsets, strict=True):
                    synced = bucket.buffer[off : off + p.numel()].view_as(p)
                    if p.grad is None:
                        p.grad = synced.clone()
                    else:
                        p.grad.copy_(synced)
                bucket.work = None
                bucket.ready.clear()
                bucket.pending = len(bucket.params)
        self._next_launch = 0
        self._callback_queued = False


# -- the strategy's implementations (rows of ``strategies.py``) ---------------------------------
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
    bucket_cap_mb: float = BUCKET_CAP_MB,
    comm_hook: str = "none",
    **ddp_options,
) -> nn.Module:
    """DistributedDataParallel, with one of PyTorch's communication hooks: fp16/bf16
    compression (``default_hooks``) or PowerSGD of rank 1 or 2 with error feedback. Any other
    keyword is DistributedDataParallel's own: a knob row of the ``ddp`` strategy that names
    one of its arguments reaches it with no other code (docs/extending.md)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    _check_hook(comm_hook)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(
        model,
        process_group=group,
        device_ids=device_ids,
        bucket_cap_mb=bucket_cap_mb,
        **ddp_options,
    )
    if comm_hook in ("fp16", "bf16"):
        hook = getattr(default_hooks, f"{comm_hook}_compress_hook")
        ddp.register_comm_hook(group, hook)
    elif comm_hook.startswith("powersgd"):
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if dist.get_backend(group) == "gloo" and grad_bytes > POWERSGD_GLOO_MAX_BYTES:
            # wide_mlp (two buckets) hangs in its first compressed step on gloo; the seed MLP
            # (one bucket) runs.
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
    bucket_cap_mb: float = BUCKET_CAP_MB,
    overlap: bool = True,
    comm_hook: str = "none",
) -> nn.Module:
    """ReferenceDDP; ``comm_hook`` fp16/bf16 casts each bucket down for its all-reduce (it
    works on gloo, where PyTorch's bf16 hook refuses); PowerSGD is native only."""
    del device  # buckets live where the parameters live
    _check_hook(comm_hook)
    if comm_hook.startswith("powersgd"):
        raise ValueError("PowerSGD is implemented by native DDP only (comm_hook=powersgd*)")
    compress = torch_dtype(comm_hook) if comm_hook in ("fp16", "bf16") else None
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
    return apply_native_ddp(
        autocast_forward(model, device, mixed_precision), group=group, device=device
    )


def expected_comm_bytes(
    psi: int, n: int, *, model: nn.Module, comm_hook: str = "none", **_
) -> float:
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
        total += 4 * (
            low_rank if rows * cols >= POWERSGD_MIN_COMPRESSION * low_rank else rows * cols
        )
    return total
