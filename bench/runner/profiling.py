"""A few steps under torch.profiler, written where TensorBoard's profiler plugin looks."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from bench.runner.quiet import without_lines


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
) -> tuple[Path, int | None]:
    """Profile ``active`` steps after ``wait + warmup``; return the trace and the host heap in
    use when the first active step began (the baseline for the CPU memory peak)."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace_dir.mkdir(parents=True, exist_ok=True)
    for stale in trace_dir.glob(f"{worker_name}.*.pt.trace.json"):  # an earlier, failed attempt
        stale.unlink()
    heap_at_active = None
    with (
        without_lines(),
        profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name=worker_name),
            record_shapes=True,
            profile_memory=True,
        ) as prof,
    ):
        for i in range(wait + warmup + active):
            if i == wait + warmup:
                heap_at_active = host_bytes_in_use()
            step()
            prof.step()
    traces = sorted(
        trace_dir.glob(f"{worker_name}.*.pt.trace.json"), key=lambda p: p.stat().st_mtime
    )
    if not traces:
        raise RuntimeError(f"profiler wrote no trace for {worker_name} in {trace_dir}")
    return traces[-1], heap_at_active
