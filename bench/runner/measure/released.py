"""A CPU memory build's collectives made to let go of their tensors when the program does.

ProcessGroupGloo's worker thread keeps the call it ran (and so the call's tensors) until it next
takes its queue's lock, after the call's waiter has woken. On a loaded machine that is often
after the waiter has dropped the tensors and gone on allocating, and the storage is freed only
then, on the worker, so that a step's peak can hold a collective's tensors the program let go
of (docs/benchmarks.md, "Measured memory"). The figure would then say how the scheduler ran the
worker, not what the configuration holds, which is what the planner predicts and a user sizes
for.

Inside ``released_collectives()`` the Python API's collectives used by DDP's, FSDP's and the
reference's step (``torch.distributed.<name>``, looked up by their callers at each call) hand
back their work wrapped: its ``wait()`` waits, drops the work, then waits until no one but the
caller's own references holds the call's tensors (their storages' use counts back to what they
were before the call), for at most ``LIMIT_S``: a count that does not come back (the caller kept
another view) costs that bound, not a hang. A call made without ``async_op`` waits so before it
returns. Only the memory build runs inside it: the timed steps run as they are.

A copy the backend made that only its call holds (gloo's reduce-scatter works on a clone of
its input) is freed when the worker drops the call: the wait also lasts until the process's
other threads sleep (``workers_idle``), within the same bound. What it cannot see: the
functional collectives (TP's), which do not go through these names; under load those still
move a peak by up to one unit's tensors (docs/plan.md, "Memory per rank").
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

LIMIT_S = 0.05  # how long a wait for gloo to let go may take, per call
NAMES = (  # the API's collectives; those this torch lacks are skipped
    "all_reduce",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_all_gather_base",
    "_reduce_scatter_base",
    "broadcast",
)


def _storages(args, kwargs) -> list:
    counted, out = set(), []
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            s = v.untyped_storage()
            if s.data_ptr() not in counted:
                counted.add(s.data_ptr())
                out.append(s)
    return out


def _uses(storages: list) -> list[int]:
    return [torch._C._storage_Use_Count(s._cdata) for s in storages]


def _let_go(storages: list, before: list[int]) -> None:
    """Until each storage's use count is back to ``before`` (or ``LIMIT_S`` has passed), and
    gloo's workers asleep: a copy only the call held (gloo's reduce-scatter works on a clone
    of its input) is freed once the worker drops the call (``workers_idle``)."""
    end = time.perf_counter() + LIMIT_S
    while any(u > b for u, b in zip(_uses(storages), before, strict=True)):
        if time.perf_counter() > end:
            return
        time.sleep(0)  # lets the worker run
    workers_idle(max(0.0, end - time.perf_counter()))


class _Work:
    """The call's work, whose ``wait()`` also waits for the backend to let go of its tensors."""

    def __init__(self, work, storages: list, before: list[int]) -> None:
        self._work, self._storages, self._before = work, storages, before

    def wait(self, *args, **kwargs):
        if self._work is None:
            return True
        done = self._work.wait(*args, **kwargs)
        self._work = None  # the caller's handle no longer keeps the call
        _let_go(self._storages, self._before)
        self._storages = []
        return done

    def __getattr__(self, name):  # is_completed, get_future, ... as the work's own
        return getattr(self._work, name)


def _released(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        storages = _storages(args, kwargs)
        before = _uses(storages)
        work = fn(*args, **kwargs)
        if work is None:  # a call without async_op: waited already
            _let_go(storages, before)
            return None
        return _Work(work, storages, before)

    return call


@contextlib.contextmanager
def released_collectives(device: torch.device) -> Iterator[None]:
    """The API's collectives wrapped as the module says, on the CPU (gloo's worker threads);
    a GPU's calls are left as they are."""
    if device.type != "cpu" or not dist.is_initialized():
        yield
        return
    saved = {n: getattr(dist, n) for n in NAMES if hasattr(dist, n)}
    for name, fn in saved.items():
        setattr(dist, name, _released(fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _asleep(task: Path) -> bool:
    """Whether a thread of this process is waiting (Linux's ``S``, ``D``, ``I`` states) or
    gone; its state is the field after the command name's closing parenthesis."""
    try:
        stat = (task / "stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "SDI"


def workers_idle(limit_s: float = LIMIT_S) -> None:
    """Until every other thread of this process has been asleep at two looks in a row (or
    ``limit_s`` has passed; off Linux, at once).

    gloo runs a call on its worker thread under the caller's thread-local state, the
    profiler's included, and drops the call (freeing its tensors, which c10 reports to that
    profiler) only when it next takes its queue's lock: native DDP's bucket all-reduces,
    issued from C++, are not seen by the wrappers above. Waiting here before a memory-profiled
    session stops keeps a worker's late report out of the session as torch collects it:
    native DDP on gloo crashed there (docs/outputs.md, "peak_mem_mb")."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return
    me, end, quiet = str(threading.get_native_id()), time.perf_counter() + limit_s, 0
    while quiet < 2 and time.perf_counter() < end:
        others = [t for t in tasks.iterdir() if t.name != me]
        quiet = quiet + 1 if all(_asleep(t) for t in others) else 0
        time.sleep(0.0005)
