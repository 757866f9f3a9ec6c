"""No rank outlives its launcher.

SIGINT or SIGTERM to torchrun reaches its ranks (``watchdog`` ends the running point as
cancelled). A launcher that dies without a word (SIGKILL, the kernel's OOM killer, a crash of
a node's agent) leaves its ranks running: they go on timing a point nobody will read, then fail
on the store the launcher hosted, minutes later. So each rank watches, in a thread:

- its parent process: torchrun's agent starts the ranks as its children, so a rank whose parent
  changed (re-parented to init or a subreaper) has lost its launcher;
- the job's store, every few polls: a store that no longer answers (a refused or reset
  connection, not a slow answer: a slow one only delays the probe) went with the launcher, or
  the rank, that hosted it, possibly on another node.

Then the rank ends as under SIGTERM, with the loss as the reason (``watchdog.terminate``):
outside a point at once, inside one at its next step, its row an error saying the launcher
was lost, so that ``--resume`` runs it again. A main thread that cannot end the point within
``watchdog.GRACE_S`` (a long step, a collective whose peer has left) is not waited for: the
row is written from here and the rank leaves (``watchdog.end_now``).
"""

from __future__ import annotations

import atexit
import os
import threading

from bench.runner.faults import flight, watchdog

POLL_S = 0.5
STORE_EVERY = 4  # polls between two probes of the store (2 s)
STORE_MISSES = 2  # failed probes in a row that mean the store is gone
EXIT_CODE = 1
_PROBE_KEY = "bench.launcher/probe"  # never set: ``check`` only asks whether it exists
JOIN_S = 10.0  # the most ``stop`` waits for a probe in flight (a refused store answers at once)

_stop = threading.Event()
_thread: threading.Thread | None = None


def lost(parent: int, store, misses: int) -> tuple[str | None, int]:
    """Why the launcher counts as lost (None: it does not), and the store's misses so far."""
    if parent > 1 and os.getppid() != parent:
        return (
            f"the launcher (pid {parent}) is gone: it died without stopping its ranks "
            "(SIGKILL, the OOM killer, a crash of its node's agent)",
            misses,
        )
    if store is None:
        return None, misses
    try:
        store.check([_PROBE_KEY])
        return None, 0
    except Exception as e:  # noqa: BLE001  (any failure to reach the store is a miss)
        misses += 1
        if misses < STORE_MISSES:
            return None, misses
        first = str(e).splitlines()[0][:200] if str(e) else ""
        return (
            f"the job's store is gone ({type(e).__name__}: {first}): its launcher, or the rank "
            "that hosted it, was lost",
            misses,
        )


def _watch(rank: int, parent: int, store) -> None:
    misses, polls = 0, 0
    while not _stop.wait(POLL_S):
        polls += 1
        probe = store if polls % STORE_EVERY == 0 else None
        why, misses = lost(parent, probe, misses)
        if why is None:
            continue
        watchdog.print_to_stderr(f"rank {rank}: {why}; leaving (--resume continues the run)")
        watchdog.terminate(why, EXIT_CODE)  # outside a point: the rank has left here
        if _stop.wait(watchdog.GRACE_S):  # the run finished meanwhile
            return
        watchdog.end_now()


def watch(rank: int) -> None:
    """Start watching this rank's launcher and the job's store (once per process)."""
    _stop.clear()
    try:
        store = flight.default_store()
    except Exception:  # noqa: BLE001  (no default store: the parent alone is watched)
        store = None
    global _thread
    _thread = threading.Thread(
        target=_watch, args=(rank, os.getppid(), store), name="bench-launcher-watch", daemon=True
    )
    _thread.start()
    atexit.register(stop)  # whichever way the rank leaves, the thread is out of torch first


def stop() -> None:
    """The run is over: the ranks leave one by one, and a store hosted by one that left first
    is no loss. Waits for the thread to leave: at the interpreter's exit, a daemon thread that
    returns from a store call (which released the GIL) is ended by ``pthread_exit``, whose
    unwinding through pybind11's GIL guard calls ``std::terminate``: the rank aborts (SIGABRT,
    "terminate called without an active exception") after its work is done."""
    _stop.set()
    if _thread is not None and _thread is not threading.current_thread():
        _thread.join(timeout=JOIN_S)
