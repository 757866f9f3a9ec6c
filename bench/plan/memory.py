"""A configuration's peak memory per rank, predicted without its hardware or its weights.

The configuration is built by the suite's own code (``bench.runner.train.step``: the plain
model, activation checkpointing, the strategy's implementation, AdamW) under torch's
``FakeTensorMode`` over torch's fake process group at the target world size, so no weight is
allocated and no collective moves a byte; torch's ``MemTracker``
(``torch.distributed._tools.mem_tracker``) then follows one training step after a first one
(the optimiser's state exists by then, as in the harness's measured step) and reports the most
bytes live at once: parameters, gradients, optimiser state, activations and temporaries. This
is the method of torchtitan's memory estimator (FSDP2 under ``FakeTensorMode`` with
``FSDPMemTracker``), applied to every strategy the suite runs.

Two shims let the native wrappers run on fake tensors, neither changing what is allocated:
DistributedDataParallel checks its parameters' shapes across ranks by reading their data (one
process here: nothing to check), and its all-reduce's future holds nothing under the fake
process group (the bucket is reduced in place, so the bucket itself is the result).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as ddp_module
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils.flop_counter import FlopCounterMode

from bench.runfolder.points import PointRecord
from bench.runner.session.distenv import DistEnv
from bench.runner.train.data import Batches
from bench.runner.train.step import build_trainer
from parallel_kernels.checkpointing import checkpoint_blocks
from parallel_kernels.groups import forget_groups
from parallel_kernels.models import build_model, workload
from parallel_kernels.workload import block_list, keep_blocks, stamp

CPU = torch.device("cpu")

MiB = 2**20
# MemTracker's categories, as plan.csv names them (its "Total" is the peak).
CATEGORIES = {
    "Parameter": "params",
    "Gradient": "grads",
    "Optstate": "optim",
    "Activation": "activations",
    "Temp": "temporaries",
    "Buffer": "buffers",
    "Other": "other",
}


@dataclass(frozen=True)
class Tracked:
    """One step of a configuration as tracked: the allocator's peak with its breakdown (no
    allowance) and the FLOPs one rank computes; NaN and ``error`` where tracking failed."""

    peak_mib: float
    parts_mib: dict[str, float]
    flops: float
    error: str = ""
    how: str = ""  # how the figures were made (tracked in full, or extrapolated from what)

    def plus(self, other: Tracked, times: float) -> Tracked:
        """``self + times * other``, part by part (an extrapolation's arithmetic)."""
        parts = {k: v + times * other.parts_mib.get(k, 0.0) for k, v in self.parts_mib.items()}
        return Tracked(
            self.peak_mib + times * other.peak_mib,
            parts,
            self.flops + times * other.flops,
            self.error or other.error,
            self.how,
        )

    def minus(self, other: Tracked) -> Tracked:
        return self.plus(other, -1.0)


def failed(error: str) -> Tracked:
    return Tracked(math.nan, {}, math.nan, error)


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """Torch's fake process group as the default group, this process its rank 0 of
    ``world_size``: collectives return at once and move nothing."""
    if dist.is_initialized():
        raise RuntimeError("the planner needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        forget_groups()
        dist.destroy_process_group()


@contextlib.contextmanager
def _fake_ddp() -> Iterator[None]:
    """DistributedDataParallel without its cross-rank shape check and without rebuilding its
    buckets in backward's order after the first step: both agree the ranks on data read back
    from tensors (a fake tensor has none; there is one process, so nothing differs). The
    rebuilt buckets hold the same gradient bytes (their sizes differ), so the peak is the
    same to within a bucket's ordering."""
    reducer = torch._C._distributed_c10d.Reducer
    verify, rebuild = ddp_module._verify_param_shape_across_processes, reducer._rebuild_buckets
    ddp_module._verify_param_shape_across_processes = lambda *a, **k: None
    reducer._rebuild_buckets = lambda self: False
    try:
        yield
    finally:
        ddp_module._verify_param_shape_across_processes = verify
        reducer._rebuild_buckets = rebuild


def _in_place_buckets(state, bucket):  # DDP accepts no annotation but its own, unstringified
    """DDP's all-reduce as the fake process group runs it: the bucket, reduced in place."""
    del state
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def _resolve_ddp_hooks(wrapped: torch.nn.Module) -> None:
    for module in wrapped.modules():
        if isinstance(module, ddp_module.DistributedDataParallel) and not module._comm_hooks:
            module.register_comm_hook(None, _in_place_buckets)


def _plan_env(world_size: int, gpus_per_node: int) -> DistEnv:
    return DistEnv(
        rank=0,
        world_size=world_size,
        local_rank=0,
        local_world_size=min(world_size, gpus_per_node),
        backend="fake",
        device=torch.device("cpu"),
        host="plan",
        nnodes=math.ceil(world_size / gpus_per_node),
    )


def _inputs(point: PointRecord) -> list:
    """One step's micro-batches, real (a few samples' ids or pixels, not weights): made
    outside the fake mode, which the data loader's sampler cannot run in."""
    accum = int(point.knobs["grad_accum"])
    batch = point.batch_per_replica
    data = workload(point.model).dataset(batch * accum, 0)
    batches = Batches(data, batch_size=batch, rank=0, world_size=1, device=torch.device("cpu"))
    return [next(batches) for _ in range(accum)]


def _blocks_of(model: str) -> int:
    """How many repeated blocks the model has (0: none to shorten), from its meta twin."""
    with torch.device("meta"):
        twin = stamp(workload(model).build(), workload(model))
    blocks = block_list(twin)
    return 0 if blocks is None else len(blocks)


def track(point: PointRecord, *, gpus_per_node: int = 8) -> Tracked:
    """The point's step at its world size, tracked under fake tensors. A model of more than two
    repeated blocks is tracked with one and with two and extrapolated to all of them (each block
    adds the same parameters, gradients, state, activations and FLOPs; the peak's transient,
    one block's, is in both); a point whose build or step fails is its error, in one line."""
    with warnings.catch_warnings():
        # torch's warnings on the way to a failure (FSDP1's views under the tracker) say less
        # than the row's error does
        warnings.simplefilter("ignore")
        return _track_extrapolated(point, gpus_per_node)


def _track_extrapolated(point: PointRecord, gpus_per_node: int) -> Tracked:
    try:
        n = _blocks_of(point.model)
        if n <= 2:
            return replace(_track(point, gpus_per_node, None), how="tracked in full")
        one = _track(point, gpus_per_node, 1)
        two = _track(point, gpus_per_node, 2)
        return replace(
            one.plus(two.minus(one), n - 1),
            how=f"tracked with 1 and 2 of its {n} blocks, extrapolated",
        )
    except Exception as e:  # noqa: BLE001 - any failure is this configuration's row
        line = " ".join(str(e).split()) or type(e).__name__
        return failed(f"{type(e).__name__}: {line[:300]}")


def _track(point: PointRecord, gpus_per_node: int, blocks: int | None) -> Tracked:
    inputs = _inputs(point)
    env = _plan_env(point.world_size, gpus_per_node)
    tracker = MemTracker()
    with fake_world(point.world_size), _fake_ddp(), FakeTensorMode(allow_non_fake_inputs=True):
        # The build is tracked: what a wrapper allocates as it wraps (DDP's buckets) lives
        # through every step, and the harness counts it too.
        with tracker:
            trainer = build_trainer(point, env, dist.group.WORLD, batches=iter(()), blocks=blocks)
            _resolve_ddp_hooks(trainer.wrapped)
        _optimiser_state(trainer)
        if len(inputs) > 1:
            # Accumulating: the micro-batches before the last leave their gradients live for
            # it; the tracker follows one call of each module, so they run before it.
            for x, y in inputs[:-1]:
                trainer.micro_step(x, y, last=False)
        tracker.track_external(trainer.wrapped, trainer.opt)
        tracker.reset_mod_stats()
        with tracker:  # entering again starts the peak from what is live
            if len(inputs) > 1:
                trainer.micro_step(*inputs[-1], last=True)
                trainer.finish_step()
            else:
                trainer.step(inputs)
        peak = tracker.get_tracker_snapshot("peak")
    cpu = next(iter(peak.values())) if peak else {}
    parts = {CATEGORIES[str(k.value)]: v / MiB for k, v in cpu.items() if k != "Total"}
    ckpt = point.knobs["activation_checkpointing"] == "on"
    flops = _flops(point.model, point.batch_per_replica, ckpt, blocks)
    return Tracked(cpu.get("Total", 0.0) / MiB, parts, flops * int(point.knobs["grad_accum"]))


def _optimiser_state(trainer) -> None:
    """AdamW's state, made as its first step makes it, without a forward and backward (the
    measured step is one after the first): a step over zero gradients, which are then
    dropped as the step's ``zero_grad`` drops them."""
    for p in trainer.wrapped.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    trainer.opt.step()
    trainer.opt.zero_grad(set_to_none=True)


@functools.cache
def _flops(model: str, micro_batch: int, checkpointed: bool, blocks: int | None) -> float:
    """FLOPs of one micro-batch's forward and backward (recomputation included), counted by
    torch's ``FlopCounterMode`` on the plain model under fake tensors: the same for every
    layout of it (a TP rank's share is the planner's division), so counted once. Counted apart
    from the tracked step: both modes at once change what activation checkpointing keeps (the
    peak of llama:tiny's read 25 % higher)."""
    wl = workload(model)
    data = wl.dataset(micro_batch, 0)
    x, y = next(iter(Batches(data, batch_size=micro_batch, rank=0, world_size=1, device=CPU)))
    with FakeTensorMode(allow_non_fake_inputs=True):
        plain = build_model(model)
        if blocks is not None:
            keep_blocks(plain, blocks)
        if checkpointed:
            checkpoint_blocks(plain)
        with FlopCounterMode(display=False) as counter:
            wl.compute_loss(wl.forward(plain, x), y).backward()
    return float(counter.get_total_flops())
