"""The fake world a configuration is tracked in (``memory.py``): torch's fake process group,
the shims that let the native wrappers run on fake tensors, what a backend allocates that the
fake process group does not, and torch's ``MemTracker`` as the planner reads it.

Two shims let the native wrappers run on fake tensors, neither changing what is allocated:
DistributedDataParallel checks its parameters' shapes across ranks by reading their data (one
process here: nothing to check), and its all-reduce's future holds nothing under the fake
process group (the bucket is reduced in place, so the bucket itself is the result). A third
lets the reference pipeline schedules run there (``fake_pipeline``), and a pipeline rank's
stage, called once per micro-batch, is tracked as each call's own (``StageTracker``).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as ddp_module
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._pytree import tree_map_only

from parallel_kernels import pipeline_schedule
from parallel_kernels.facts import BACKEND_COPIES, op_name
from parallel_kernels.groups import forget_groups


class PeakTracker(MemTracker):
    """Torch's ``MemTracker`` keeping the process's peak and not each module's: after every op
    it walks every module it has tracked to raise their own peaks, which the planner does not
    read and which cost a third of a tracking's time (docs/benchmarks.md, "Planning time")."""

    _paused = 0  # inside DTensor's sharding propagation (``untracked_propagation``)

    def _track(self, reftype, t: torch.Tensor) -> None:
        if not self._paused:
            super()._track(reftype, t)

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        # FSDP1's original parameters are views of its flat one, and a view takes no gradient
        # hook ("post accumulate grad hooks cannot be registered on non-leaf tensors"). The
        # hooks only relabel a gradient's storage, counted once either way, as GRAD (torch's
        # ``_update_and_maybe_create_winfos``): without them the peak is the same.
        leaves = all(p.is_leaf for p in module.parameters())
        return super()._track_module_params_and_buffers(module, install_grad_hooks and leaves)

    def restart_peak(self) -> dict:
        """The peak's snapshot so far, and the peak started again from what is live now, as
        entering the tracker starts it (torch's ``__enter__``): a step's stages apart."""
        peak = self.get_tracker_snapshot("peak")
        self._peak_mem_snap = self.get_tracker_snapshot()
        self._peak_mem = {dev: snap[_TOTAL_KEY] for dev, snap in self._peak_mem_snap.items()}
        return peak

    def _update_peak_stats(self, peak_state) -> None:
        if not hasattr(self, "_peak_mem_snap"):  # a torch whose tracker is not as read here
            return super()._update_peak_stats(peak_state)
        del peak_state
        for dev, snap in self._curr_mem_snap.items():
            if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)  # category -> bytes: ints to copy


class StageTracker(PeakTracker):
    """``PeakTracker`` for a pipeline rank, whose schedule calls its stage, a root module, once
    per micro-batch in one step: torch's tracker takes a root's second forward for the next
    iteration's and refuses it. Each call is tracked as a call of its own (the module's own
    statistics, which the planner does not read, start again); what is live is counted as
    ever. And a later stage's input is a leaf that requires its gradient (what the schedule
    receives): torch's module tracker hangs a hook on each module's inputs whose closure holds
    their gradient nodes, and through them the leaf's gradient accumulator, which holds the
    leaf: a cycle through C++ that no collection frees, each received activation live in every
    later step (no run holds it). The module tracker is shown the inputs detached (the same
    storage), and closes each module's backward by the engine's callback at the end of
    backward, as it does a first stage's, whose input needs no gradient."""

    def __init__(self) -> None:
        super().__init__()
        modules = self._mod_tracker
        pre_hook = modules._fw_pre_hook

        def seen_detached(module, inputs):
            def detached(t: torch.Tensor) -> torch.Tensor:
                return t.detach() if t.requires_grad else t

            return pre_hook(module, tree_map_only(torch.Tensor, detached, inputs))

        modules._fw_pre_hook = seen_detached  # what its __enter__ registers

    def _pre_fw_hook(self, module, inputs) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        again = module in self.memory_tracking and not self._mod_tracker.is_bw
        if again and set(self._mod_tracker.parents) - {name} == {"Global"}:
            del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)


@contextlib.contextmanager
def untracked_propagation(tracker: PeakTracker) -> Iterator[None]:
    """DTensor's sharding propagation kept out of ``tracker``'s count. The first time an op
    meets its shapes, DTensor runs it under the fake mode it finds active, the planner's, to
    learn its output's shape, and the tracker would count those tensors as the step's, so that
    a step tracked first in a process read more than one tracked once the propagation's cache
    holds its shapes, as the real step does (docs/benchmarks.md, "Planned memory")."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    original = getattr(ShardingPropagator, "_propagate_tensor_meta_non_cached", None)
    if original is None:  # a torch whose propagation is not as read here
        yield
        return

    def propagate(self, *args, **kwargs):
        tracker._paused += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            tracker._paused -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original


@contextlib.contextmanager
def fake_world(world_size: int, rank: int = 0) -> Iterator[None]:
    """Torch's fake process group as the default group, this process its rank ``rank`` of
    ``world_size``: collectives return at once and move nothing."""
    if dist.is_initialized():
        raise RuntimeError("the planner needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        forget_groups()
        dist.destroy_process_group()


@contextlib.contextmanager
def fake_ddp() -> Iterator[None]:
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


class _Sent:
    """A point-to-point operation's work under the fake pipeline: done."""

    def wait(self, *args, **kwargs) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


@contextlib.contextmanager
def fake_pipeline() -> Iterator[None]:
    """The reference pipeline schedules as the fake process group can run them: without their
    first agreement (every stage learns the others' micro-batch counts by reading an
    all-reduced tensor back; a fake one has no value, and one process here has nothing to
    disagree on), and with their sends and receives done at once: the fake group's
    point-to-point works keep their tensors for ever, which a tracker would count in every
    later step (gloo's are freed once waited for). The schedule's own tensors, its receive
    buffers and the sends it keeps, are made and held as in a run."""
    agree = getattr(pipeline_schedule, "_agree", None)
    exchange = dist.batch_isend_irecv
    dist.batch_isend_irecv = lambda ops: [_Sent() for _ in ops]
    if agree is not None:  # else a schedule that agrees otherwise: left as it is
        pipeline_schedule._agree = lambda *args, **kwargs: None
    try:
        yield
    finally:
        dist.batch_isend_irecv = exchange
        if agree is not None:
            pipeline_schedule._agree = agree


@contextlib.contextmanager
def action_marks(tracker: PeakTracker) -> Iterator[list[tuple[dict, dict]]]:
    """The reference schedule's steps marked for ``tracker``: before its first action, after
    each action and after its sends are waited for, (the peak since the last mark, what is
    live now), MemTracker's snapshots, the peak started again from there. What a pipeline
    rank's memory is composed from over any schedule (``pipeline_memory.StageMemory``)."""
    run = pipeline_schedule._StageRun
    act, finish = run.act, run.finish
    marks: list[tuple[dict, dict]] = []

    def mark() -> None:
        marks.append((tracker.restart_peak(), tracker.get_tracker_snapshot()))

    def marked_act(self, action) -> None:
        if not marks:
            mark()
        act(self, action)
        mark()

    def marked_finish(self) -> None:
        finish(self)
        mark()

    run.act, run.finish = marked_act, marked_finish
    try:
        yield marks
    finally:
        run.act, run.finish = act, finish


# torch.distributed's calls that gather or scatter whole tensors, (output, input) first.
_TENSOR_CALLS = (
    "all_gather_single",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
)


class _HeldCopy:
    """An asynchronous call's work, holding the backend's copy until it is waited for."""

    def __init__(self, work, copy: torch.Tensor) -> None:
        self._work, self._copy = work, copy

    def wait(self, *args, **kwargs):
        self._copy = None
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._work, name)


@contextlib.contextmanager
def backend_copies(backend: str) -> Iterator[None]:
    """The collectives as ``backend`` runs them, memory-wise: where it copies a call's output
    or input whole (``BACKEND_COPIES``: gloo's all-gather and reduce-scatter), a tensor of that
    size is made beside the call, under the fake mode the tracker counts, and held until the
    call's work is waited for (at once, for a blocking call). The fake process group moves
    nothing, and the copy is the backend's, not the wrapper's: without it FSDP's rows on the
    CPU read under the harness's peak (docs/benchmarks.md, "Planned memory")."""
    copies = BACKEND_COPIES.get(backend, {})
    saved = {}
    for name in _TENSOR_CALLS:
        which = copies.get(op_name(name))
        if which is None:
            continue
        saved[name] = original = getattr(dist, name)

        def call(*args, _original=original, _which=which, **kwargs):
            bound = inspect.signature(_original).bind(*args, **kwargs)
            output, input_ = list(bound.arguments.values())[:2]
            copy = torch.empty_like(output if _which == "output" else input_)
            work = _original(*args, **kwargs)
            return _HeldCopy(work, copy) if work is not None else None

        setattr(dist, name, call)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def _in_place_buckets(state, bucket):  # DDP accepts no annotation but its own, unstringified
    """DDP's all-reduce as the fake process group runs it: the bucket, reduced in place."""
    del state
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def resolve_ddp_hooks(wrapped: torch.nn.Module) -> None:
    for module in wrapped.modules():
        if isinstance(module, ddp_module.DistributedDataParallel) and not module._comm_hooks:
            module.register_comm_hook(None, _in_place_buckets)
