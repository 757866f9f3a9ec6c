"""The memory stage's builds tracked in a pool of processes, each its own fake world: forked
where the planner runs one thread, with the garbage collector tuned to a tracked step's many
short-lived objects."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

# The garbage collector's first generation collected every GEN0 allocations, not every 700
# (Python's default): a tracked step allocates hundreds of thousands of short-lived objects
# (fake tensors, their metadata, pytree specs), which young collections scan again and again.
# The objects made before the pool are frozen (``gc.freeze``: torch and the models), so that
# no collection scans them again nor copies them into a worker's pages (docs/benchmarks.md,
# "Planning time").
GEN0 = 20_000

# (builds done, builds in all, the first job of the build that finished): a progress line
Progress = Callable[[int, int, Any], None]


def map_builds(fn, items: list[tuple], workers: int, progress: Progress | None) -> list:
    """``fn`` over ``items`` (builds: tuples of jobs) in order; in a pool of processes
    (``_start_method``) where there are enough of them to repay a worker's start."""
    if workers <= 1 or len(items) < 4 * workers:
        out = []
        with _fewer_collections():
            for i, build in enumerate(items):
                if progress:
                    progress(i, len(items), build[0].config)
                out.append(fn(build))
        return out
    with contextlib.ExitStack() as stack:
        gc.collect()
        gc.freeze()  # what is here now (torch, the models) is not scanned again, here or forked
        stack.callback(gc.unfreeze)
        pool = ProcessPoolExecutor(workers, mp_context=_start_method(), initializer=_collect_less)
        stack.enter_context(pool)
        # the builds of most steps first, so that no worker is left with a long one at the end
        order = sorted(range(len(items)), key=lambda i: -len(items[i]))
        futures = {pool.submit(fn, items[i]): i for i in order}
        for n, done in enumerate(as_completed(futures)):
            if progress:
                progress(n, len(items), items[futures[done]][0].config)
        got = {futures[f]: f.result() for f in futures}
        return [got[i] for i in range(len(items))]


def _collect_less() -> None:
    gc.set_threshold(GEN0, *gc.get_threshold()[1:])


@contextlib.contextmanager
def _fewer_collections():
    before = gc.get_threshold()
    _collect_less()
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _start_method():
    """Workers forked where this process runs one thread (they start with its imports, torch
    and the models: seconds each if spawned), spawned afresh where it runs more (a fork copies
    a lock another thread may hold: a worker could hang)."""
    tasks = Path("/proc/self/task")
    single = tasks.is_dir() and len(list(tasks.iterdir())) == 1
    fork = single and "fork" in multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if fork else "spawn")
