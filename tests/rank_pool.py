"""A pool of rank processes with a gloo process group, started once and reused by many tests.

Starting ranks costs seconds (spawn, ``import torch``, rendezvous); running a check inside live
ranks costs milliseconds. ``RankPool.run(fn, *args)`` calls the module-level function ``fn`` on
every rank and returns the per-rank results. A rank that raises, or a run that outlasts its
timeout, fails the call with every rank's error, and the pool is marked broken so that the next
user starts a fresh one instead of inheriting a half-finished collective.

A rank whose process dies (a crash, a kill) is named at once with its exit status and the end of
its log: each rank writes its stderr there, C++ messages and faulthandler's report of a fatal
signal included. The call is then made once more on fresh ranks, with a warning that carries the
report. CI once lost rank 1 of the 4-rank pool without a word, 19 minutes into the session and
after the rank had done its point's collectives; the same test alone, and the whole suite here,
passed. A second death in one session fails the call (``tests/test_rank_pool.py``).
"""

from __future__ import annotations

import faulthandler
import io
import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int, world_size: int, port: int, tasks: mp.Queue, results: mp.Queue, log: str
) -> None:
    # fd 2 itself, so that what C++ writes (gloo, an abort) lands in the log too
    out = open(log, "a", buffering=1)  # noqa: SIM115  (open for the process's life)
    os.dup2(out.fileno(), 2)
    faulthandler.enable(file=out, all_threads=True)
    os.environ["OMP_NUM_THREADS"] = "1"
    import datetime

    import torch
    import torch.distributed as dist

    from bench.runner.measure.collector import for_the_run

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    parent = os.getppid()
    while True:
        try:
            task = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the test session is gone (killed): leave with it
                os._exit(1)
            continue
        if task is None:
            break
        fn, args, kwargs = task
        try:
            with for_the_run():  # a call's points share what they set aside, as a sweep's do
                value = fn(*args, **kwargs)
            results.put((rank, True, _pack(value)))
        except BaseException:  # noqa: BLE001  (report everything, SystemExit included)
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


def _pack(value: Any) -> bytes:
    """A rank's result as ``torch.save`` bytes. A tensor put on a multiprocessing queue as it is
    travels as a shared-memory file descriptor (torch.multiprocessing's reductions), held open
    as long as the received tensor lives: the zoo tests' cached parameters held 1,400 of them in
    one session, and a later ``select`` refused a descriptor numbered past 1023."""
    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _unpack(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


class RankDied(RuntimeError):
    """A rank's process ended during a call (the message says how, and the end of its log)."""


class RankPool:
    reruns_left = 1  # for the whole session: a crash that recurs is a failure, not noise

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.broken = False
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._results = ctx.Queue()
        port = free_port()
        folder = Path(tempfile.mkdtemp(prefix="rank-pool-"))
        self.logs = [folder / f"rank{r}.log" for r in range(self.world_size)]
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, self.world_size, port, self._tasks[r], self._results, str(self.logs[r])),
                daemon=True,
            )
            for r in range(self.world_size)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn: Callable, *args: Any, timeout: float = 120.0, **kwargs: Any) -> list:
        """``fn(*args, **kwargs)`` on every rank; the list of results in rank order."""
        try:
            return self._run(fn, args, kwargs, timeout)
        except RankDied as e:
            if RankPool.reruns_left <= 0:
                raise
            RankPool.reruns_left -= 1
            warnings.warn(
                f"{e}\n(a rank died: {fn.__name__} runs once more on fresh ranks)", stacklevel=2
            )
            self._start()
            return self._run(fn, args, kwargs, timeout)

    def _run(self, fn: Callable, args: tuple, kwargs: dict, timeout: float) -> list:
        if self.broken:
            raise RuntimeError("rank pool is broken")
        for q in self._tasks:
            q.put((fn, args, kwargs))
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while len(results) + len(errors) < self.world_size:
            if errors or self._dead(results, errors):
                # peers of a failed or dead rank may wait in a collective: grant them a moment
                deadline = min(deadline, time.monotonic() + 5)
            try:
                rank, ok, value = self._results.get(
                    timeout=min(1.0, max(0.1, deadline - time.monotonic()))
                )
            except queue.Empty:
                if time.monotonic() >= deadline:
                    break
                continue
            (results if ok else errors)[rank] = _unpack(value) if ok else value
        if errors or len(results) < self.world_size:
            dead = self._dead(results, errors)  # before close() kills the ranks still waiting
            self.close(force=True)
            lines = [f"--- rank {r} ---\n{e}" for r, e in sorted({**errors, **dead}.items())]
            missing = sorted(set(range(self.world_size)) - set(results) - set(errors) - set(dead))
            if missing:
                lines.append(f"ranks {missing} did not finish within {timeout:.0f} s")
            raise (RankDied if dead else RuntimeError)(
                f"{fn.__name__} failed:\n" + "\n".join(lines)
            )
        return [results[r] for r in range(self.world_size)]

    def _dead(self, results: dict, errors: dict) -> dict[int, str]:
        """The ranks yet to answer whose process has ended: its exit status and log's end."""
        dead = {}
        for r, p in enumerate(self._procs):
            code = p.exitcode
            if r in results or r in errors or code is None:
                continue
            try:
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            except ValueError:
                how = f"signal {-code}"
            try:
                tail = self.logs[r].read_text(errors="replace")[-3000:]
            except OSError:
                tail = ""
            dead[r] = f"the rank's process died ({how}); the end of its log {self.logs[r]}:\n{tail}"
        return dead

    def close(self, force: bool = False) -> None:
        self.broken = True
        if not force:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=10)
            shutil.rmtree(self.logs[0].parent, ignore_errors=True)  # a broken pool's logs stay
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
