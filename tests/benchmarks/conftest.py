"""pytest-benchmark on a pool of live ranks: each round asks the ranks to run N iterations and
the statistics are of the time the ranks measured, not of the pool's messaging."""

from __future__ import annotations

import pytest

from tests.benchmarks import workloads

WORLD = 2


class RankClock:
    """A clock that advances only by the seconds the ranks measured. pytest-benchmark reads
    its timer before and after each round; with this clock in place of ``perf_counter`` a
    round's duration is the ranks' median time per iteration (the fixture's timer hook)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_on_pool(benchmark, pool, fn, *args, rounds: int = 5, **kwargs) -> dict:
    """Benchmark ``fn(*args, **kwargs)`` on every rank of ``pool``; returns rank 0's last
    result (its figures go to ``extra_info``)."""
    clock = RankClock()
    benchmark._timer = clock  # read by every round's runner: see RankClock
    last: dict = {}

    def round_() -> None:
        result = pool.run(fn, *args, **kwargs)[0]
        clock.now += result["seconds"]
        last.update(result)

    benchmark.pedantic(round_, rounds=rounds, warmup_rounds=1, iterations=1)
    benchmark.extra_info.update(world_size=WORLD, backend="gloo", **last)
    return last


@pytest.fixture(scope="module")
def ranks(pool):
    """The session's 2-rank pool; models kept between rounds are closed after the module."""
    p = pool(WORLD)
    yield p
    if not p.broken:
        p.run(workloads.release)
