"""While a point runs, a thread per rank watches for another member's failure, so that every
rank that can still act leaves its flight record and stacks, the stuck ones too.

The members share the job's store (not a process group: a group may be the very thing that is
broken). A rank whose point raises, or whose collective times out, counts a failure there and
dumps (``PointWatch.failed``). Every other member's watchdog sees the count within
``POLL_S`` and dumps its rank as it stands: waiting in a collective, or in its own code. A rank
in its own code (a sleep, a loop, a slow step) is then interrupted (SIGUSR1, whose handler
raises ``PointInterrupted`` in the main thread) so that it leaves the point and the sweep can go
on; a rank waiting in a gloo collective is freed by the failing rank dropping its end of the
point's group (``bench.runner.harness``), which closes the connections it waits on.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from bench.runner import flight

POLL_S = 0.5
_INTERRUPT = threading.Event()  # set by a watchdog just before it signals the main thread


class PointInterrupted(RuntimeError):
    """Raised in a rank's own code when another member of its point failed."""


def _on_signal(signum, frame) -> None:
    if _INTERRUPT.is_set():
        _INTERRUPT.clear()
        if _TERMINATE.is_set():
            raise PointInterrupted("terminated (SIGTERM): the point was cancelled")
        raise PointInterrupted("interrupted by the watchdog: another rank of the point failed")


IN_POINT = threading.Event()  # from a point's start until its row is written
_TERMINATE = threading.Event()


def _on_term(signum, frame) -> None:
    """SIGTERM outside a point ends the rank at once, as by default. Inside one, the point is
    ended as failed instead (the watchdog dumps the rank and interrupts it), its row is written,
    and the rank leaves then (``point_done``): a launcher stops the other ranks the moment one
    dies (torchrun does), and the survivors' dumps are what says why."""
    _TERMINATE.set()
    if not IN_POINT.is_set():
        _exit(128 + signum)


def check_terminated() -> None:
    """A point's step calls this first: after SIGTERM (a scheduler's cancel or time limit, a
    launcher stopping the job) the point ends at its next step, in this rank's own code. The
    watchdog's interrupt does not serve here: it leaves alone a rank with a collective in
    flight, which is most of a DDP step."""
    if _TERMINATE.is_set() and IN_POINT.is_set():
        raise PointInterrupted("terminated (SIGTERM): the point was cancelled")


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def point_done() -> None:
    """The point's row is written: leave now if SIGTERM came during it."""
    IN_POINT.clear()
    if _TERMINATE.is_set():
        print("terminated (SIGTERM): every finished row is in results.csv", file=sys.stderr)
        _exit(128 + signal.SIGTERM)


def install() -> bool:
    """The main thread's handlers for the watchdog's signal and for SIGTERM (False where they
    cannot be set)."""
    try:
        signal.signal(signal.SIGUSR1, _on_signal)
        signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread
        return False
    return True


class PointWatch:
    """One visit of one point on this rank: ``with PointWatch(...) as w:`` around the point,
    ``w.failed(error)`` when it raised."""

    def __init__(self, *, key: str, rank: int, folder: Path, store=None, interrupt: bool = True):
        self.key, self.rank, self.folder = key, rank, folder
        self.store = store if store is not None else flight.default_store()
        self.interrupt = interrupt
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[dict] | None = None  # the stacks of this rank's first dump
        self._thread = threading.Thread(target=self._watch, name="bench-watchdog", daemon=True)
        self._main = threading.main_thread().ident
        self.since_ns = time.time_ns()  # the dumps keep this point's collectives only

    def __enter__(self) -> PointWatch:
        IN_POINT.set()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        _INTERRUPT.clear()  # a signal not yet handled must not raise outside the point
        self._thread.join(timeout=30)

    @property
    def dumped(self) -> bool:
        return self._threads is not None

    def _dump(self, reason: str, error) -> dict | None:
        """Dump once; a later failure on this rank adds its error to the first dump's stacks."""
        with self._lock:
            if self._threads is not None:
                flight.write_stacks(self.folder, self.rank, reason=reason, error=error,
                                    threads=self._threads)  # fmt: skip
                return None
            skip = threading.get_ident() if threading.get_ident() != self._main else None
            self._threads = flight.thread_stacks(skip)
            return flight.dump(self.folder, self.rank, reason=reason, error=error,
                               threads=self._threads, since_ns=self.since_ns)  # fmt: skip

    def failed(self, error: BaseException | None, dump: bool = True) -> None:
        """This rank's point raised (or was terminated): tell the others, then dump."""
        try:
            if self.store.add(f"{self.key}/failures", 1) == 1:
                self.store.set(f"{self.key}/first", f"rank {self.rank}")
        except Exception:  # noqa: BLE001  (the store is gone with the job: dump anyway)
            pass
        if dump:
            self._dump("error", error)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            if self.dumped:
                return
            if _TERMINATE.is_set():
                self.failed(None, dump=False)
                rec = self._dump("terminated", "terminated (SIGTERM)")
            else:
                try:
                    if not self.store.check([f"{self.key}/failures"]):
                        continue
                    first = self.store.get(f"{self.key}/first").decode()
                except Exception:  # noqa: BLE001  (no store: nothing to watch)
                    return
                rec = self._dump("watchdog", f"dumped by the watchdog: {first} failed")
            if rec is None or self._stop.is_set():
                return
            # only where the handler is this module's: SIGUSR1's default would kill the rank
            interruptible = signal.getsignal(signal.SIGUSR1) is _on_signal
            if self.interrupt and interruptible and not flight.blocked_in_collective(rec):
                _INTERRUPT.set()
                signal.pthread_kill(self._main, signal.SIGUSR1)
            return
