"""The test pool itself: a rank whose process dies is named at once, with how it died, and the
call runs once more on fresh ranks; a second death fails it."""

import os
import signal
import time
from pathlib import Path

import pytest

from tests.rank_pool import RankDied, RankPool


def die_on_rank_1(marker: str | None = None) -> int:
    """Rank 1 crashes (only while ``marker`` does not exist, when one is given)."""
    import torch.distributed as dist

    if dist.get_rank() == 1 and not (marker and Path(marker).exists()):
        if marker:
            Path(marker).touch()
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()  # rank 0 waits for the dead rank, as in a collective of a real test
    return dist.get_rank()


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_a_dead_rank_is_named_and_the_call_runs_once_more(monkeypatch, tmp_path):
    monkeypatch.setattr(RankPool, "reruns_left", 1)
    pool = RankPool(2)
    try:
        assert pool.run(os.getpid, timeout=60) == [p.pid for p in pool._procs]
        start = time.monotonic()
        with pytest.warns(UserWarning) as warned:
            assert pool.run(die_on_rank_1, str(tmp_path / "died"), timeout=100) == [0, 1]
        # not the 100 s timeout: the death is seen, and rank 0 gets a few seconds to answer
        assert time.monotonic() - start < 40
        msg = str(warned[0].message)
        assert "rank 1 ---\nthe rank's process died (signal SIGSEGV)" in msg
        assert "Fatal Python error: Segmentation fault" in msg  # faulthandler, into the log
        assert "die_on_rank_1" in msg  # its stack says where
        assert "runs once more on fresh ranks" in msg
        assert RankPool.reruns_left == 0 and not pool.broken

        with pytest.raises(RankDied, match=r"rank 1 ---\nthe rank's process died \(signal SIGSEGV"):
            pool.run(die_on_rank_1, timeout=100)  # no rerun left: the second death fails
        assert pool.broken
    finally:
        pool.close(force=True)


SESSION = """
import os, sys, time
sys.path.insert(0, sys.argv[1])
from tests.rank_pool import RankPool
pool = RankPool(2)
print(" ".join(str(p) for p in pool.run(os.getpid)), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_ranks_leave_with_a_session_that_is_killed(tmp_path):
    """A test session killed (SIGKILL: no atexit, no fixture teardown) leaves no rank behind:
    each notices its parent gone within a second of waiting for work."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", SESSION, str(repo)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        ranks = [int(p) for p in proc.stdout.readline().split()]
        assert len(ranks) == 2 and all(_alive(p) for p in ranks), ranks
        proc.kill()
        proc.wait()
        t0 = time.monotonic()
        while any(_alive(p) for p in ranks) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        assert not any(_alive(p) for p in ranks), f"ranks {ranks} outlived the session"
    finally:
        proc.kill()


def many_tensors(n: int) -> list:
    import torch

    return [torch.full((64,), float(i)) for i in range(n)]


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_tensors_come_back_without_holding_a_descriptor_each(pool):
    """A rank's tensors reach the test as plain copies: sent over the queue as they are, each
    would keep a shared-memory file descriptor open for as long as the test held it."""
    before = len(os.listdir("/proc/self/fd"))
    results = pool(2).run(many_tensors, 200)
    held = len(os.listdir("/proc/self/fd")) - before
    assert [float(t[0]) for t in results[1]] == [float(i) for i in range(200)]
    assert held < 20, f"{held} descriptors held by {2 * 200} tensors"
