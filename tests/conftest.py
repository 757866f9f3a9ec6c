import os

import pytest

from tests.rank_pool import RankPool

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def pool():
    """``pool(n)``: a live gloo process group of n ranks, shared by the whole session."""
    pools: dict[int, RankPool] = {}

    def get(world_size: int) -> RankPool:
        p = pools.get(world_size)
        if p is None or p.broken:
            p = pools[world_size] = RankPool(world_size)
        return p

    yield get
    for p in pools.values():
        p.close()
