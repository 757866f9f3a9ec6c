"""What a process of the suite pays that it need not: full garbage collections during a point
(``bench.runner.measure.collector.settled``: what was alive when a point started, and what the
FLOP counter's first use imports, stays out of the point's collections, and is the collector's
again once the point ends), and scipy.stats
imported by a process of the running side (a launcher, a replay's ranks, a rank that times its
steps and decides its verdicts: their distributions come from scipy.special,
``bench/stats/distributions.py``)."""

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from bench.runner.measure.collector import settled

pytestmark = pytest.mark.unit


class Node:
    """A reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


def test_what_was_alive_is_set_aside_and_the_blocks_own_garbage_is_collected():
    before = Node()
    kept = weakref.ref(before)
    with settled():
        assert gc.get_freeze_count() > 0  # the objects alive at the start, set aside
        inside = Node()
        made = weakref.ref(inside)
        del inside, before
        gc.collect()
        assert made() is None  # the block's own cycle: collected inside the block
        assert kept() is not None  # set aside: not collected while the block runs
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert kept() is None  # the collector's again: not leaked past the block


def test_nested_blocks_give_everything_back_once_the_outermost_ends():
    with settled():
        with settled():
            pass
        assert gc.get_freeze_count() > 0  # the inner block did not end the outer one's
    assert gc.get_freeze_count() == 0


def test_what_prepare_makes_is_set_aside_too_and_prepare_runs_once():
    """``settled(prepare)``: a lazy import's objects (here a cache of cycles that a module
    would keep) made before the block's collection, so the collections inside skip them."""
    cache, calls = [], []

    def prepare():
        calls.append(1)
        cache.extend(Node() for _ in range(5000))

    with settled(prepare):
        # every one of them frozen: out of the generations a collection walks (a count against
        # an earlier block's would also see what other tests left die in between)
        walked = {id(o) for o in gc.get_objects()}
        assert len(cache) == 5000 and not any(id(n) in walked for n in cache)
        with settled(prepare):  # an inner block neither prepares nor collects again
            pass
    assert len(calls) == 1 and gc.get_freeze_count() == 0


def test_a_block_that_raises_still_gives_everything_back():
    with pytest.raises(RuntimeError), settled():
        raise RuntimeError("a failed point")
    assert gc.get_freeze_count() == 0


def test_the_launcher_the_replay_and_every_interval_import_no_scipy_stats():
    code = (
        "import sys, numpy as np, bench.runner.cli, bench.replay.__main__; "
        "from bench.runner.measure.timing import summarize_times; "
        "from bench.stats.estimates import estimates, paired_cycles_ratio, paired_ratio; "
        "s = summarize_times(np.arange(20.0), np.zeros(20)); "
        "r = paired_cycles_ratio(np.arange(1.0, 21.0) * 1.1, np.arange(1.0, 21.0)); "
        "t = paired_ratio([1.0, 1.2, 1.1], [1.0, 1.0, 1.05]); "
        "print('scipy.stats' in sys.modules, s['step_ms_ci_low'] < 9.5 < s['step_ms_ci_high'], "
        "r.low <= 1.1 <= r.high and r.p < 0.05, t.low < t.ratio < t.high)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["False", "True", "True", "True"], out
