"""A point's peak memory: the most bytes its allocator had handed out at once during a
training step, above what it had handed out before the point was built, measured on a build
of the point's own (``point_memory``), one definition on both devices.

CUDA: the caching allocator's ``max_memory_allocated``. CPU: c10's CPU allocator's live
bytes, the counter torch.profiler's memory events carry ("Total Allocated"), kept on every
thread from the baseline on (``c10_counting``). Both count what torch allocates: parameters,
gradients, optimiser state, activations, temporaries and the collectives' tensors (DDP's
buckets, FSDP's flat buffers), as torch's ``MemTracker`` and so the planner count them. Not
counted: what lies outside the allocator (NCCL's and gloo's own buffers, the CUDA context, the
C heap's other users: the interpreter's objects), and in ``peak_bytes`` fragmentation, which
``reserved_bytes`` holds on CUDA.

Why not the C heap (glibc's ``mallinfo2``): it holds gloo's buffers and the interpreter's
objects, which other points leave differently, so a figure would move with the points run
before it; c10's count does not, and is what ``MemTracker`` counts of the same step.

Why a build of its own: c10 counts a free only of what it counted, so the count must be on from
before the point's first tensor, and on, it makes every allocation take a lock and an entry in
a table, which slows a step. The timed steps run without it, on the point's first build; its
memory is measured on a second build, after the first is released. The measurements behind
both: docs/benchmarks.md, "Measured memory".
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from bench.runner.measure.kept import OwnState
from bench.runner.measure.quiet import without_lines
from bench.runner.measure.released import released_collectives, workers_idle
from bench.runner.session.distenv import synchronize


def _load_cpu_report_flag():
    """c10's ``caffe2_report_cpu_memory_usage`` flag (c10/core/CPUAllocator.cpp), or None."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
        return ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")
    except (OSError, ValueError):
        return None


_CPU_REPORT_FLAG = _load_cpu_report_flag()


@contextlib.contextmanager
def c10_counting(device: torch.device) -> Iterator[None]:
    """On the CPU, c10's CPU allocator counting every allocation and free on every thread.

    Without the flag, c10 counts only on a thread whose profiler state is on, so the counter
    misses what gloo's worker threads allocate and free (a reduce-scatter's input, dropped by
    the worker after the call), and everything made before a profiling session (its free is
    not taken off either). With it, every allocation is entered in c10's table with its size
    and every free of an entered one taken off: from the moment it is set, the counter is the
    bytes live of what was allocated since. c10 logs one warning per thousand frees of what
    it never entered (made before the flag), which are not taken off, as they should not be."""
    if device.type != "cpu" or _CPU_REPORT_FLAG is None:
        yield
        return
    before = _CPU_REPORT_FLAG.value
    _CPU_REPORT_FLAG.value = True
    try:
        yield
    finally:
        _CPU_REPORT_FLAG.value = before


def _profiled(fn: Callable[[], object]) -> tuple[float, float]:
    """``fn`` run under the profiler with memory events: c10's counter before its first
    allocation and the highest value it took, both NaN where nothing was allocated. Read from
    the profiler's own event tree (the allocations' "Total Allocated"), not from an exported
    trace: the export and its parse cost more than a small model's step (docs/benchmarks.md,
    "make test's time")."""
    with without_lines(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
        workers_idle()
    first, peak = (math.inf, math.nan), math.nan
    nodes = list(prof.profiler.kineto_results.experimental_event_tree())
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        if node.tag != _EventType.Allocation:
            continue
        total = float(node.extra_fields.total_allocated)
        peak = total if math.isnan(peak) else max(peak, total)
        if node.start_time_ns < first[0]:
            first = (node.start_time_ns, total - node.extra_fields.alloc_size)
    return first[1], peak


def _c10_bytes() -> float:
    """c10's CPU allocator's live bytes now, as its counter reads them before a profiled 1 KiB
    allocation. The counter is read only through the profiler's memory events."""
    if _CPU_REPORT_FLAG is None or not _CPU_REPORT_FLAG.value:
        raise RuntimeError("c10's CPU count is read inside c10_counting() only")
    before, _ = _profiled(lambda: torch.empty(256))
    return before


@dataclass(frozen=True)
class MemoryBaseline:
    """What the allocator had handed out before a point was built: its figures are above this."""

    device: torch.device
    allocated: float  # CUDA: the caching allocator's live bytes; CPU: c10's count
    reserved: float  # CUDA: bytes the caching allocator holds from the driver; CPU: NaN

    @classmethod
    def now(cls, device: torch.device) -> MemoryBaseline:
        gc.collect()
        if device.type == "cuda":
            synchronize(device)
            # Blocks earlier points left cached would hide this point's own reservations.
            torch.cuda.empty_cache()
            return cls(
                device, torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
            )
        return cls(device, _c10_bytes(), math.nan)

    def held_above(self) -> float:
        """Bytes in use now above the baseline: once a point's objects are released, what it
        left in the process (caches it filled, which its release does not give back)."""
        gc.collect()
        if self.device.type == "cuda":
            synchronize(self.device)
            return torch.cuda.memory_allocated(self.device) - self.allocated
        return _c10_bytes() - self.allocated


@dataclass(frozen=True)
class StepMemory:
    peak_bytes: float  # most bytes live at once during the step, above the baseline
    reserved_bytes: float  # CUDA: most bytes the allocator held, above the baseline; CPU: NaN


def own_memory(metrics: dict, baseline: MemoryBaseline, *, data_bytes: int, own: OwnState) -> None:
    """A point's memory figures in ``metrics`` (``step_memory``'s, above its baseline) made
    its own, once its objects are released: less what stays in use above the baseline after
    the release (the process's caches the point filled) but for what is still alive of its
    own state (``own``, watched before the release: an implementation's leak, its memory
    during the step), and less ``data_bytes``, the harness's synthetic data set where it lies
    on the measured device (on a GPU it lies on the host; on the CPU it is eight steps'
    batches, ResNet's 6 MiB). Both are the harness's and the process's, not the
    configuration's."""
    if "peak_mem_mb" not in metrics:
        return
    left = baseline.held_above()
    kept = own.kept_bytes(baseline.device)
    for key in ("peak_mem_mb", "peak_reserved_mb"):
        metrics[key] -= (left - kept + data_bytes) / 2**20
    # Reported, so that a leak shows, which the figures above would hide: an implementation that
    # keeps its model alive past its point (see the hooks in ``parallel_kernels/ddp.py``).
    metrics["mem_left_mb"] = left / 2**20
    metrics["mem_kept_mb"] = kept / 2**20


# Steps whose highest peak is a point's: running out of memory is the highest one's doing.
# c10's count reads the same peak at every step of a point, so one is enough
# (docs/benchmarks.md, "Measured memory").
MEMORY_STEPS = 1
WARM_STEPS = 2  # a build's steps before its memory is measured (``point_memory``)


def step_memory(
    step: Callable[[], object],
    *,
    baseline: MemoryBaseline,
    release: Callable[[], object],
    steps: int = MEMORY_STEPS,
) -> StepMemory:
    """The most bytes live at once during ``steps`` steps, above the baseline. On the CPU,
    inside ``c10_counting`` since before the baseline.

    ``release`` frees what a step would free first (``zero_grad``) before each, so that the
    step starts from its own low point, not holding the previous step's gradients."""
    device = baseline.device
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(steps):
            release()
            step()
        synchronize(device)
        return StepMemory(
            torch.cuda.max_memory_allocated(device) - baseline.allocated,
            torch.cuda.max_memory_reserved(device) - baseline.reserved,
        )
    peaks = []
    for _ in range(steps):
        release()
        gc.collect()  # a step leaves what it made in reference cycles until the collector runs
        # The step's start is read from its own profile (the counter before its first
        # allocation), not from a session of its own: every memory-profiled session of a native
        # DDP step on gloo is a chance of the crash its runs have met (docs/outputs.md).
        at_start, in_step = _profiled(step)
        if math.isnan(in_step):  # nothing allocated: the step's peak is what it holds
            at_start = in_step = _c10_bytes()
        peaks.append(max(at_start, in_step) - baseline.allocated)
    return StepMemory(max(peaks), math.nan)


def point_memory(
    build: Callable[[], object],
    step: Callable[[object], object],
    *,
    device: torch.device,
    steps: int = MEMORY_STEPS,
) -> dict:
    """A point's memory figures on a build of its own (``build()``, a trainer: ``step(trainer)``
    steps it): ``peak_mem_mb``, ``peak_reserved_mb``, ``mem_left_mb`` and ``mem_kept_mb``.

    The baseline is taken before the build, ``WARM_STEPS`` steps make the gradients, the
    optimiser's state and DDP's final buckets, ``steps`` steps are measured (``step_memory``)
    and the trainer is released for ``own_memory``. The steps' collectives let go of their
    tensors when the program does (``released_collectives``: on a loaded CPU, gloo's threads
    otherwise free some a moment late, and a peak read one buffer high)."""
    gc.collect()  # earlier builds' modules hold reference cycles (hooks): freed first
    with c10_counting(device):
        baseline = MemoryBaseline.now(device)
        trainer = build()
        with released_collectives(device):
            # Two steps first, unmeasured: DDP rebuilds its buckets at the second step's start
            # (a collective and new bucket tensors), which the timed build had long done.
            for _ in range(WARM_STEPS):
                step(trainer)
            got = step_memory(
                lambda: step(trainer),
                baseline=baseline,
                release=lambda: trainer.opt.zero_grad(set_to_none=True),
                steps=steps,
            )
        metrics = {
            "peak_mem_mb": got.peak_bytes / 2**20,
            "peak_reserved_mb": got.reserved_bytes / 2**20,
        }
        data_bytes, own = trainer.batches.held_bytes(device), OwnState.of(trainer)
        trainer = None  # released (the step's closures hold it through this name)
        own_memory(metrics, baseline, data_bytes=data_bytes, own=own)
    return metrics
