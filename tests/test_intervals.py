import numpy as np
import pytest

from bench.analysis import interval_sets as iv

pytestmark = pytest.mark.unit


def _mask(sets, n=200):
    m = np.zeros(n, dtype=bool)
    for s, e in np.asarray(sets).reshape(-1, 2):
        m[int(s) : int(e)] = True
    return m


@pytest.mark.parametrize("seed", range(25))
def test_set_algebra_matches_a_brute_force_grid(seed):
    rng = np.random.default_rng(seed)

    def rand_set():
        starts = rng.integers(0, 180, rng.integers(0, 12))
        return np.column_stack([starts, starts + rng.integers(0, 30, len(starts))])

    a, b = rand_set(), rand_set()
    ma, mb = _mask(a), _mask(b)
    assert iv.length(a) == ma.sum()
    assert iv.length(iv.intersect(a, b)) == (ma & mb).sum()
    assert iv.length(iv.subtract(a, b)) == (ma & ~mb).sum()
    assert iv.length(iv.clip(a, 50, 120)) == ma[50:120].sum()
    assert iv.window(iv.union(a), 50, 120).tolist() == iv.clip(a, 50, 120).tolist()
    u = iv.union(a)
    assert np.all(u[1:, 0] > u[:-1, 1])  # canonical: sorted, disjoint, not touching


def test_touching_and_nested_intervals_merge():
    assert iv.union([[0, 5], [5, 7], [1, 2], [10, 10]]).tolist() == [[0, 7]]
    assert iv.length(iv.intersect([[0, 10]], [[10, 20]])) == 0
