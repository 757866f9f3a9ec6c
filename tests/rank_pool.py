"""A pool of rank processes with a gloo process group, started once and reused by many tests.

Starting ranks costs seconds (spawn, ``import torch``, rendezvous); running a check inside live
ranks costs milliseconds. ``RankPool.run(fn, *args)`` calls the module-level function ``fn`` on
every rank and returns the per-rank results. A rank that raises, or a run that outlasts its
timeout, fails the call with every rank's error, and the pool is marked broken so that the next
user starts a fresh one instead of inheriting a half-finished collective.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, tasks: mp.Queue, results: mp.Queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, args, kwargs = task
        try:
            results.put((rank, True, fn(*args, **kwargs)))
        except BaseException:  # noqa: BLE001  (report everything, SystemExit included)
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class RankPool:
    def __init__(self, world_size: int) -> None:
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.broken = False
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._results = ctx.Queue()
        port = free_port()
        self._procs = [
            ctx.Process(
                target=_worker,
                args=(r, world_size, port, self._tasks[r], self._results),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()

    def run(self, fn: Callable, *args: Any, timeout: float = 120.0, **kwargs: Any) -> list:
        """``fn(*args, **kwargs)`` on every rank; the list of results in rank order."""
        if self.broken:
            raise RuntimeError("rank pool is broken")
        for q in self._tasks:
            q.put((fn, args, kwargs))
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        while len(results) + len(errors) < self.world_size:
            if errors:  # peers of a failed rank may wait in a collective: grant them a moment
                deadline = min(deadline, time.monotonic() + 5)
            try:
                rank, ok, value = self._results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    break
                continue
            (results if ok else errors)[rank] = value
        if errors or len(results) < self.world_size:
            self.close(force=True)
            missing = sorted(set(range(self.world_size)) - set(results) - set(errors))
            lines = [f"--- rank {r} ---\n{e}" for r, e in sorted(errors.items())]
            if missing:
                lines.append(f"ranks {missing} did not finish within {timeout:.0f} s")
            raise RuntimeError(f"{fn.__name__} failed:\n" + "\n".join(lines))
        return [results[r] for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        self.broken = True
        if not force:
            for q in self._tasks:
                q.put(None)
            for p in self._procs:
                p.join(timeout=10)
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
