"""What a process of the suite pays that it need not: full garbage collections during a point
(``bench.runner.measure.collector.settled``: what was alive when a point started stays out of
the point's collections, and is the collector's again once the point ends), and scipy.stats
imported by a process that makes no interval (a launcher, a replay's ranks)."""

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


def test_a_block_that_raises_still_gives_everything_back():
    with pytest.raises(RuntimeError), settled():
        raise RuntimeError("a failed point")
    assert gc.get_freeze_count() == 0


def test_the_launcher_and_the_replay_import_no_scipy_stats_until_an_interval_is_made():
    code = (
        "import sys, bench.runner.cli, bench.replay.__main__; "
        "before = 'scipy.stats' in sys.modules; "
        "from bench.stats.intervals import median_interval; "
        "lo, hi = median_interval(range(20)); "
        "print(before, 'scipy.stats' in sys.modules, lo < 9.5 < hi)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["False", "True", "True"], out
