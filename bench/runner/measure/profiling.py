"""A few steps under torch.profiler, written where TensorBoard's profiler plugin looks, and
the memory of one step."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from bench.analysis.breakdown import load_trace, memory_peak_delta
from bench.analysis.reader import TraceError
from bench.runner.measure.kept import OwnState
from bench.runner.measure.quiet import without_lines
from bench.runner.session.distenv import synchronize


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _load_mallinfo2()


def _load_cpu_report_flag():
    """c10's ``caffe2_report_cpu_memory_usage`` flag (c10/core/CPUAllocator.cpp), or None."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
        return ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage")
    except (OSError, ValueError):
        return None


_CPU_REPORT_FLAG = _load_cpu_report_flag()


@contextlib.contextmanager
def every_thread_counted() -> Iterator[None]:
    """The profiler's CPU allocation counter kept by every thread, not only profiled ones.

    c10's CPU allocator adds to the counter the profiler's memory events carry only on a
    thread whose profiler state is on, and takes a free off it likewise. gloo's worker
    threads run a call's work with the caller's state but drop their hold on the work after
    it, outside that state: where theirs is the last hold, the tensors the work kept (a
    reduce-scatter's input) are freed unseen and the counter stays high for the rest of the
    step. A ResNet FSDP FULL_SHARD step read 10.0 to 12.9 MiB above its start over twelve
    steps, 10.0 to 10.3 with this flag on, which makes the allocator count on every thread."""
    if _CPU_REPORT_FLAG is None:
        yield
        return
    before = _CPU_REPORT_FLAG.value
    _CPU_REPORT_FLAG.value = True
    try:
        yield
    finally:
        _CPU_REPORT_FLAG.value = before


def host_bytes_in_use() -> int | None:
    """Bytes the C heap has handed out and not taken back (glibc mallinfo2), or None.

    This counts every tensor on the CPU, ours and the ones native code keeps (DDP's buckets),
    which Python-side accounting would miss.
    """
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith(field + ":"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1])


def reset_peak_rss() -> None:
    """Start the process's peak resident memory (VmHWM) afresh (Linux ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_rss_bytes() -> int | None:
    """Peak resident memory of this process since the last ``reset_peak_rss``, or None."""
    kb = _status_kb("VmHWM")
    return None if kb is None else kb * 1024


def profile_steps(
    step: Callable[[], object],
    *,
    trace_dir: Path,
    worker_name: str,
    device: torch.device,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
) -> tuple[Path, list[float]]:
    """Profile ``active`` steps after ``wait + warmup``; return the trace and each active
    step's wall time in ms (device synchronised), to weigh the tracing's overhead.

    The settings are the lightest the breakdown allows: shapes on (gloo's collectives carry
    their sizes only in the ops' input shapes), memory profiling off (it allocates per tensor
    and would slow every op: ``step_memory`` measures memory in a step of its own), no stacks.
    """
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace_dir.mkdir(parents=True, exist_ok=True)
    for stale in trace_dir.glob(f"{worker_name}.*.pt.trace.json"):  # an earlier, failed attempt
        stale.unlink()
    active_ms: list[float] = []
    with (
        without_lines(),
        profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name=worker_name),
            record_shapes=True,
            profile_memory=False,
        ) as prof,
    ):
        for i in range(wait + warmup + active):
            synchronize(device)
            t0 = time.perf_counter()
            step()
            synchronize(device)
            if i >= wait + warmup:
                active_ms.append((time.perf_counter() - t0) * 1e3)
            prof.step()
    traces = sorted(
        trace_dir.glob(f"{worker_name}.*.pt.trace.json"), key=lambda p: p.stat().st_mtime
    )
    if not traces:
        raise RuntimeError(f"profiler wrote no trace for {worker_name} in {trace_dir}")
    return traces[-1], active_ms


@dataclass(frozen=True)
class MemoryBaseline:
    """What the process held before a point was built: its memory figures are above this."""

    device: torch.device
    allocated: float  # CUDA: the caching allocator's live bytes; CPU: the C heap's
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
        heap = host_bytes_in_use()
        return cls(device, math.nan if heap is None else heap, math.nan)

    def held_above(self) -> float:
        """Bytes in use now above the baseline: once a point's objects are released, what it
        left in the process (caches it filled, which its release does not give back)."""
        gc.collect()
        if self.device.type == "cuda":
            synchronize(self.device)
            return torch.cuda.memory_allocated(self.device) - self.allocated
        heap = host_bytes_in_use()
        return math.nan if heap is None else heap - self.allocated


@dataclass(frozen=True)
class StepMemory:
    peak_bytes: float  # most bytes live at once during the step, above the baseline
    reserved_bytes: float  # CUDA: most bytes the allocator held, above the baseline; CPU: NaN


def own_memory(metrics: dict, baseline: MemoryBaseline, *, data_bytes: int, own: OwnState) -> None:
    """A point's memory figures in ``metrics`` (``step_memory``'s, above its baseline) made
    its own, once its objects are released: less what stays in use above the baseline after
    the release (the process's caches it filled: oneDNN's kernels and the autograd engine's
    threads, 5.7 MiB on a process's first ResNet point here; and, in a cohort, what the
    candidates measured before it left) but for what is still alive of its own state
    (``own``, watched before the release: an implementation's leak, its memory during the
    step), and less ``data_bytes``, the harness's synthetic data set where it lies on the
    measured device (on a GPU it lies on the host; on the CPU it is eight steps' batches,
    ResNet's 6 MiB). Both are the harness's and the process's, not the configuration's: the
    peak becomes the step's highest use over what its release gives back of the process's,
    data aside, whatever the baseline held."""
    if "peak_mem_mb" not in metrics:
        return
    # Not clamped at 0: a cohort's candidate dropped after this one's baseline leaves less in
    # use than the baseline held, and the step's highest use over the release's is the figure.
    left = baseline.held_above()  # NaN where there is no heap figure, as the peak is then
    kept = own.kept_bytes(baseline.device)
    for key in ("peak_mem_mb", "peak_reserved_mb"):
        metrics[key] -= (left - kept + data_bytes) / 2**20
    # Said, so that a leak shows: the reference DDP's hooks once kept its whole model (115 MiB
    # of wide_mlp) after its point, which this figure would otherwise have hidden.
    metrics["mem_left_mb"] = left / 2**20
    metrics["mem_kept_mb"] = kept / 2**20


# Steps whose highest peak is a point's: one step's peak varies here from step to step (a CPU
# FSDP2 step of the custom example peaked 4.5 to 7.4 MiB above its start, over consecutive
# identical steps: what Python's collector has not yet freed, and the gloo threads'
# allocations, fall differently on each), and running out of memory is the highest one's doing.
MEMORY_STEPS = 3


def step_memory(
    step: Callable[[], object],
    *,
    baseline: MemoryBaseline,
    release: Callable[[], object],
    scratch_dir: Path,
    steps: int = MEMORY_STEPS,
) -> StepMemory:
    """The peak memory of a step, one definition on both devices: the most bytes live at
    once during ``steps`` steps, above what the process held before the point was built.

    ``release`` frees what a step would free first (``zero_grad``) before each, so that the
    step starts from its own low point. That matters on the CPU: the peak there is the C
    heap in use at the step's start plus the rise of the profiler's allocation counter during
    the step, and the counter cannot subtract a free of memory allocated before profiling began
    (the previous step's gradients would count twice). On CUDA the caching allocator's own peak
    counter is reset before the first step. Not counted: memory outside the allocator (NCCL's
    buffers, the CUDA context) and, in ``peak_bytes``, fragmentation (``reserved_bytes`` holds
    it on CUDA).
    """
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
    with every_thread_counted():
        # A step first, unmeasured, so that the state a measured step starts from was made
        # counted: the counter takes off only a free of what it counted, so a step's free
        # of state made before was never taken off (FSDP1 keeps its flat gradients through
        # ``zero_grad`` and frees them in its next forward: llama:tiny's first measured step
        # read 1.19 MiB, those gradients, over the next two).
        release()
        step()
        peaks = [_host_step_peak(step, baseline, release, scratch_dir) for _ in range(steps)]
    return StepMemory(max(peaks), math.nan)  # NaN where there is no heap figure


def _host_step_peak(
    step: Callable[[], object],
    baseline: MemoryBaseline,
    release: Callable[[], object],
    scratch_dir: Path,
) -> float:
    """``_one_host_step_peak``, a second step measured where the first one's trace cannot be
    read: torch's export once wrote a byte that is not UTF-8 into a native DDP memory step's
    trace on gloo (a clean-clone CI run's test_two_node_sweep, 2026-12-04). A second failure
    is the point's."""
    try:
        return _one_host_step_peak(step, baseline, release, scratch_dir)
    except TraceError:
        return _one_host_step_peak(step, baseline, release, scratch_dir)


def _one_host_step_peak(
    step: Callable[[], object],
    baseline: MemoryBaseline,
    release: Callable[[], object],
    scratch_dir: Path,
) -> float:
    """One step's peak on the host, above the baseline, in a profiling session of its own.
    One session over the steps reads FSDP's steps 4 to 24 % higher, rising step by step:
    the counter misses frees it should see (on CPU, gloo's threads free what the step's
    collectives were given). The profiler's first session in a process grows the heap by
    some 23 MiB that stay: a point's traced steps come first, and its release leaves them
    (``own_memory``)."""
    release()
    # A profiled step leaves what it made in reference cycles until the collector runs (the
    # traced steps before, or the last of these: a memory-profiled llama:tiny step, 6.3 MiB).
    gc.collect()
    at_start = host_bytes_in_use()
    scratch_dir.mkdir(parents=True, exist_ok=True)
    path = scratch_dir / "memory.pt.trace.json"
    with without_lines(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    prof.export_chrome_trace(str(path))
    rise = memory_peak_delta(load_trace(path))
    path.unlink()
    if at_start is None or math.isnan(baseline.allocated):
        return math.nan
    # NaN: no memory event, nothing allocated through c10 in the step
    return at_start - baseline.allocated + (0.0 if math.isnan(rise) else max(rise, 0.0))
