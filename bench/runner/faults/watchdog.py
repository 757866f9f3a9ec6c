"""While a point runs, a thread per rank watches for another member's failure, so that every
rank that can still act leaves its flight record and stacks, the stuck ones too.

The members share the job's store (not a process group: a group may be the very thing that is
broken). A rank whose point raises, or whose collective times out, counts a failure there and
dumps (``PointWatch.failed``). Every other member's watchdog sees the count within
``POLL_S`` and dumps its rank as it stands: waiting in a collective, or in its own code. A rank
in its own code (a sleep, a loop, a slow step) is then interrupted (SIGUSR1, whose handler
raises ``PointInterrupted`` in the main thread) so that it leaves the point and the sweep can go
on; a rank waiting in a gloo collective is freed by the failing rank dropping its end of the
point's group (``bench.runner.train.lifecycle``), which closes the connections it waits on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.runner.faults import flight

POLL_S = 0.5
GRACE_S = 8.0  # from SIGTERM or the launcher's loss, the main thread's time to end its point
_INTERRUPT = threading.Event()  # set by a watchdog just before it signals the main thread


class PointInterrupted(RuntimeError):
    """Raised in a rank's own code when another member of its point failed."""


def _on_signal(signum, frame) -> None:
    if _INTERRUPT.is_set():
        _INTERRUPT.clear()
        if _TERMINATE.is_set():
            raise PointInterrupted(_ENDING.why)
        raise PointInterrupted("interrupted by the watchdog: another rank of the point failed")


IN_POINT = threading.Event()  # from a point's start until its row is written
_TERMINATE = threading.Event()
SIGTERM_WHY = "terminated (SIGTERM): the point was cancelled"


@dataclass
class _Ending:
    """Why this rank is ending (SIGTERM, or its launcher lost), the exit code it leaves with,
    and the running point's row: written once, by the main thread when the point ends, or by
    ``end_now`` when the main thread cannot end it in time."""

    why: str = SIGTERM_WHY
    code: int = 128 + signal.SIGTERM
    lock: threading.Lock = field(default_factory=threading.Lock)
    write_error: Callable[[str], None] | None = None  # rank 0: writes the point's error row
    written: bool = False
    record_end: Callable[[str], None] | None = None  # rank 0: meta.json's end (``on_exit``)


_ENDING = _Ending()


SIGINT_WHY = "interrupted (SIGINT): the point was cancelled"


def _on_term(signum, frame) -> None:
    """SIGTERM (or SIGINT, Ctrl-C, which a terminal sends to the launcher and every rank)
    outside a point ends the rank at once, as by default. Inside one, the point is ended as
    failed instead (the watchdog dumps the rank and interrupts it), its row is written, and the
    rank leaves then (``point_done``): a launcher stops the other ranks the moment one dies
    (torchrun does), and the survivors' dumps are what says why. Either way the rank leaves
    with 128 + the signal's number, after ``on_exit``'s record of the run's end."""
    terminate(SIGINT_WHY if signum == signal.SIGINT else SIGTERM_WHY, 128 + signum)


def terminate(why: str, code: int) -> None:
    """End this rank: at once outside a point, else at the point's next step (it leaves when
    the point's row, saying ``why``, is written). The first reason given stands."""
    if not _TERMINATE.is_set():
        _ENDING.why, _ENDING.code = why, code
        _TERMINATE.set()
    if not IN_POINT.is_set():
        _exit(_ENDING.code)


def terminated() -> str | None:
    """Why this rank is ending, or None."""
    return _ENDING.why if _TERMINATE.is_set() else None


def check_terminated() -> None:
    """A point's step calls this first: after SIGTERM (a scheduler's cancel or time limit, a
    launcher stopping the job) or the launcher's loss, the point ends at its next step, in this
    rank's own code. The watchdog's interrupt does not serve here: it leaves alone a rank with a
    collective in flight, which is most of a DDP step."""
    if _TERMINATE.is_set() and IN_POINT.is_set():
        raise PointInterrupted(_ENDING.why)


def on_exit(record: Callable[[str], None] | None) -> None:
    """``record(why)`` runs once before this rank leaves early (rank 0: meta.json's end)."""
    _ENDING.record_end = record


def _exit(code: int) -> None:
    """Leave with ``code``: rank 0 first records the run's end (``on_exit``) and says why in
    one line (the other ranks leave quietly: one line for the job, not one per rank)."""
    record, _ENDING.record_end = _ENDING.record_end, None
    if record is not None:
        try:
            record(_ENDING.why)
        except Exception as e:  # noqa: BLE001  (leaving anyway: say what was not recorded)
            print_to_stderr(f"the run's end was not recorded: {e}")
    if os.environ.get("RANK", "0") == "0":
        print_to_stderr(f"{_ENDING.why}: every finished row is in results.csv")
    for stream in (sys.stdout, sys.stderr):
        # a pipe whose reader (the launcher) is gone must not keep the rank alive
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def print_to_stderr(line: str) -> None:
    """One line on stderr, flushed; a stream whose reader is gone is ignored."""
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)


def point_started(write_error: Callable[[str], None] | None = None) -> None:
    """A point begins on this rank. ``write_error`` (rank 0) writes its row as an error with a
    given reason: ``end_now`` calls it if the rank must leave before the point's own row is
    written."""
    with _ENDING.lock:
        _ENDING.write_error, _ENDING.written = write_error, False
    IN_POINT.set()


def write_row(write: Callable[[], None], last: bool = True) -> None:
    """Write the running point's row (``write()``) unless ``end_now`` wrote its error row.
    ``last=False``: one of an interleaved cohort's rows, more to come."""
    with _ENDING.lock:
        if not _ENDING.written:
            write()
            _ENDING.written = last


def end_now() -> None:
    """Leave at once (the main thread did not end the point in time): the running point's row
    is written as an error first, unless it is already written."""
    if _ENDING.lock.acquire(timeout=5):  # a write in progress (a slow disk) finishes first
        try:
            if IN_POINT.is_set() and not _ENDING.written and _ENDING.write_error is not None:
                _ENDING.write_error(_ENDING.why)
                _ENDING.written = True
        except Exception as e:  # noqa: BLE001  (leaving anyway: say what was not written)
            print_to_stderr(f"the point's error row was not written: {e}")
    _exit(_ENDING.code)


def point_done() -> None:
    """The point's row is written: leave now if SIGTERM or the launcher's loss came during it."""
    IN_POINT.clear()
    with _ENDING.lock:
        _ENDING.write_error = None
    if _TERMINATE.is_set():
        _exit(_ENDING.code)


def install() -> bool:
    """The main thread's handlers for the watchdog's signal, SIGTERM and SIGINT (False where
    they cannot be set), and the thread that ends the rank when the main thread cannot."""
    try:
        signal.signal(signal.SIGUSR1, _on_signal)
        signal.signal(signal.SIGTERM, _on_term)
        signal.signal(signal.SIGINT, _on_term)
    except ValueError:  # not the main thread
        return False
    global _wakeups
    if _wakeups is None:  # one reader for the process, however many runs install
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=_after_grace, args=(read,), name="bench-term", daemon=True).start()
        _wakeups = read
    return True


_wakeups: int | None = None  # the pipe's end ``_after_grace`` reads


def _after_grace(wakeups: int) -> None:
    """Python runs a signal's handler in the main thread between two bytecodes: a main thread
    blocked in C++ (a collective, or a store's wait, whose peer has gone) runs none until the
    call returns, and a launcher stopping the job waits for it (torchrun: 30 s, then SIGKILL,
    no row, no run's end recorded). The signal's number reaches this thread at once (the
    interpreter's wakeup fd): SIGTERM or SIGINT not ended by the main thread within
    ``GRACE_S`` ends the rank from here, the running point's row written as its error."""
    while True:
        try:
            received = os.read(wakeups, 64)
        except OSError:
            return
        for signum in received:
            if signum in (signal.SIGTERM, signal.SIGINT):
                time.sleep(GRACE_S)
                terminate(SIGINT_WHY if signum == signal.SIGINT else SIGTERM_WHY, 128 + signum)
                end_now()


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
                flight.write_stacks(
                    self.folder, self.rank, reason=reason, error=error, threads=self._threads
                )
                return None
            skip = threading.get_ident() if threading.get_ident() != self._main else None
            self._threads = flight.thread_stacks(skip)
            return flight.dump(
                self.folder,
                self.rank,
                reason=reason,
                error=error,
                threads=self._threads,
                since_ns=self.since_ns,
            )

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
                rec = self._dump("terminated", _ENDING.why)
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
