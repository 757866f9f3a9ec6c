"""A few steps under torch.profiler, written where TensorBoard's profiler plugin looks, and
the process's peak resident memory (a step's peak memory: ``memory.py``)."""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from bench.runner.measure.quiet import without_lines
from bench.runner.measure.released import workers_idle
from bench.runner.session.distenv import synchronize

# Room left under which a filesystem counts as full: below one block of a trace's writes.
FULL_BELOW_BYTES = 64 << 10


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

    The session stops only once the process's other threads sleep (``workers_idle``, at most
    50 ms): gloo's worker finishes a call (its profiled range, the caller's thread-local state
    it ran under) after the call's waiter has gone on, and native DDP's ranks died in a later
    session's stop, the C heap found corrupt, until this one waited (docs/outputs.md,
    "trace_overhead_pct").
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
            if i == wait + warmup + active - 1:  # this step() stops the session
                workers_idle()
            prof.step()
    return written_trace(trace_dir, worker_name), active_ms


def written_trace(trace_dir: Path, worker_name: str) -> Path:
    """The trace the session just wrote for ``worker_name``; a full disk's fragment taken back
    and said as ENOSPC, a missing trace as an error."""
    traces = sorted(
        trace_dir.glob(f"{worker_name}.*.pt.trace.json"), key=lambda p: p.stat().st_mtime
    )
    if disk_full(trace_dir):
        # Kineto says only "Failed to write to log file!" and leaves what it wrote: take the
        # fragment back, so that the point's error row still has room to be written.
        for partial in traces:
            partial.unlink(missing_ok=True)
        raise OSError(
            errno.ENOSPC,
            f"cannot write {worker_name}'s trace in {trace_dir}: {os.strerror(errno.ENOSPC)}",
        )
    if not traces:
        raise RuntimeError(f"profiler wrote no trace for {worker_name} in {trace_dir}")
    return traces[-1]


def disk_full(folder: Path) -> bool:
    """Whether the filesystem of ``folder`` has less room left than a trace's smallest write."""
    try:
        return shutil.disk_usage(folder).free < FULL_BELOW_BYTES
    except OSError:
        return False
