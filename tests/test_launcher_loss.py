"""No rank outlives its launcher: a launcher killed with SIGKILL (as the OOM killer does) gives
its ranks no signal; each notices within a poll, ends its running point as an error row that
says the launcher was lost, and leaves within 15 s. ``--resume`` then completes the run."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.test_end_to_end import launch
from tests.test_faults import descendants, rows

REPO = Path(__file__).resolve().parents[1]
LEAVE_S = 15  # the bound, from the launcher's death to its last rank's

TRAIN = shlex.split(
    "--sweep bucket_cap_mb --values 1,25 --model mlp --impl native --steps 800 --max-steps 800 "
    "--max-point-s 60 --rounds 1 --interleave off --warmup-steps 2 --profile-steps 1 "
    "--point-timeout 60 --nproc-per-node 2 --no-report"
)
COLLECTIVES = shlex.split(
    "--sweep message_size --collectives all_reduce --impl native -b 64K -e 64M -f 2 "
    "--iters 200 --max-steps 200 --warmup-iters 2 --nproc-per-node 2 --no-report"
)


def alive(pid: int) -> bool:
    """Running (a zombie has left: only its parent's wait is missing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def kill_the_launcher(
    argv: list[str], out: Path, after_rows: int, started: str | None = None
) -> tuple[float, str]:
    """Start ``argv`` (self-launched: this process's child is torchrun's agent), SIGKILL the
    agent while a point runs, and time until every rank it started is gone. ``started``: what
    the console says once the next point runs (a fixed second after a row was once still
    between two points on a loaded machine)."""
    log = out.parent / f"{out.name}.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "bench/run.py", *argv, "--out", str(out)],
            cwd=REPO,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + 150
        while rows(out / "results.csv") < after_rows or (
            started and not re.search(started, log.read_text(errors="replace"))
        ):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # into the next point
        ranks = descendants(proc.pid)
        assert len(ranks) >= 2, ranks
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        while any(alive(p) for p in ranks) and time.monotonic() - t0 < 60:
            time.sleep(0.1)
        return time.monotonic() - t0, log.read_text()
    finally:
        for p in ranks:  # a failed test leaves nothing behind either
            if alive(p):
                os.kill(p, signal.SIGKILL)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_ranks_leave_when_their_launcher_is_killed_and_resume_completes_the_run(tmp_path):
    out = tmp_path / "run"
    seconds, log = kill_the_launcher(TRAIN, out, after_rows=1, started=r" 2/2\] .*: warm-up")
    print(f"training sweep: ranks gone {seconds:.1f} s after SIGKILL of the launcher")
    assert seconds < LEAVE_S, log[-3000:]
    assert "the launcher (pid" in log and "is gone" in log, log[-3000:]
    done = pd.read_csv(out / "results.csv")
    assert (done["status"] == "ok").sum() == 1, done[["point", "status", "error"]]
    lost = done[done["status"] == "error"]  # the point that was running
    assert len(lost) == 1, done[["point", "status", "error"]]
    assert "the launcher (pid" in lost["error"].iloc[0], lost["error"].tolist()

    resumed = launch(
        [sys.executable, "bench/run.py", *TRAIN, "--out", str(out), "--resume"], timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:] + resumed.stdout[-3000:]
    assert resumed.stdout.count("already done, skipped (--resume)") == 1
    final = pd.read_csv(out / "results.csv")
    ok = final[final["status"] == "ok"]
    assert len(ok) == 2 and ok["point"].is_unique


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_collective_sweep_leaves_with_its_launcher(tmp_path):
    out = tmp_path / "run"
    seconds, log = kill_the_launcher(COLLECTIVES, out, after_rows=4)
    print(f"collective sweep: ranks gone {seconds:.1f} s after SIGKILL of the launcher")
    assert seconds < LEAVE_S, log[-3000:]
    done = pd.read_csv(out / "results.csv")
    assert (done["status"] == "ok").sum() >= 4
    # A size is short: the one running when the launcher died ends as it would have (its row
    # ok), or, cut short, as an error row naming the loss; the sweep goes no further.
    lost = done[done["status"] == "error"]
    assert len(lost) <= 1, done[["point", "status", "error"]]
    assert all("the launcher (pid" in e for e in lost["error"].astype(str)), lost["error"].tolist()
    assert len(done) < 2 * 11, done[["point", "status"]]  # 11 sizes, in and out of place
    assert "the launcher (pid" in log and "is gone" in log, log[-3000:]


STUCK_RANK = """
import sys, time
from pathlib import Path
from bench.runner.faults import launcher
from bench.runner.faults import watchdog
watchdog.GRACE_S = 1.0
row = Path(sys.argv[1])
watchdog.point_started(lambda why: row.write_text(why))  # rank 0's error-row writer
launcher.watch(0)
Path(sys.argv[2]).write_text("ready")
time.sleep(120)  # a main thread that never reaches its next step (a long native call)
"""


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_a_rank_that_cannot_end_its_point_writes_its_row_and_leaves(tmp_path):
    """The main thread stuck: after the grace the watch writes the point's error row itself
    and the rank leaves, with the launcher's loss as the reason."""
    row, ready = tmp_path / "row", tmp_path / "ready"
    script = tmp_path / "rank.py"
    script.write_text(STUCK_RANK)
    # a stand-in launcher: starts the rank as its child, then waits forever
    start = f"[sys.executable, {str(script)!r}, {str(row)!r}, {str(ready)!r}]"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen({start}); time.sleep(600)",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 40
        while not ready.exists():
            assert agent.poll() is None and time.monotonic() < deadline, "rank did not start"
            time.sleep(0.1)
        (rank,) = descendants(agent.pid)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        t0 = time.monotonic()
        while alive(rank) and time.monotonic() - t0 < 20:
            time.sleep(0.05)
        seconds = time.monotonic() - t0
    finally:
        agent.kill()
    assert not alive(rank)
    assert 1.0 <= seconds < 10, seconds  # the poll, then the grace (1 s), then out
    assert row.read_text().startswith(f"the launcher (pid {agent.pid}) is gone"), row.read_text()


class DeadStore:
    def check(self, keys):
        raise ConnectionResetError("Connection reset by peer")


class LiveStore:
    def check(self, keys):
        return False


@pytest.mark.unit
def test_a_store_that_stops_answering_is_a_lost_launcher_after_two_misses():
    from bench.runner.faults.launcher import STORE_MISSES, lost

    parent = os.getppid()
    assert lost(parent, LiveStore(), 1) == (None, 0)  # an answer resets the count
    why, misses = lost(parent, DeadStore(), 0)
    assert why is None and misses == 1  # one miss is not yet a loss
    why, misses = lost(parent, DeadStore(), STORE_MISSES - 1)
    assert why.startswith("the job's store is gone (ConnectionResetError: Connection reset")
    why, _ = lost(parent + 1, None, 0)  # a new parent: the launcher that started us is gone
    assert why.startswith(f"the launcher (pid {parent + 1}) is gone")
    assert lost(1, None, 0) == (None, 0)  # started by init itself: no launcher to lose


class SlowStore:
    """A store whose probe takes a while: ``entered`` is set once a probe is in flight."""

    def __init__(self):
        import threading

        self.entered = threading.Event()

    def check(self, keys):
        self.entered.set()
        time.sleep(0.5)
        return False


@pytest.mark.unit
def test_stop_returns_once_the_watch_thread_is_out_of_the_store(monkeypatch):
    """A daemon thread still inside a store call at the interpreter's exit aborts the rank
    after its work is done ("terminate called without an active exception"): ``stop`` (also
    run at exit) waits for the probe in flight."""
    from bench.runner.faults import flight, launcher

    store = SlowStore()
    monkeypatch.setattr(flight, "default_store", lambda: store)
    monkeypatch.setattr(launcher, "POLL_S", 0.01)
    monkeypatch.setattr(launcher, "STORE_EVERY", 1)
    launcher.watch(0)
    assert store.entered.wait(10)
    launcher.stop()
    assert not launcher._thread.is_alive()
