"""Faults: a rank that dies mid-sweep ends the job loudly and keeps what finished; --resume
completes the run; collectives issued differently on different ranks are an error, not a hang."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from tests.test_end_to_end import launch

REPO = Path(__file__).resolve().parents[1]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc)."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        found += kids
        frontier += kids
    return found


def local_rank_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"LOCAL_RANK="):
            return item.split(b"=", 1)[1].decode()
    return None


def rows(path: Path) -> int:
    try:
        return len(pd.read_csv(path))
    except (OSError, pd.errors.EmptyDataError):
        return 0


SWEEP = [
    "--interleave",  # rows visit by visit: a killed rank keeps what finished
    "off",
    "--sweep",
    "bucket_cap_mb",
    "--values",
    "0.25,1,25",
    "--model",
    "mlp",
    "--steps",
    "10",
    "--max-steps",
    "10",
    "--rounds",
    "1",
    "--warmup-steps",
    "2",
    "--profile-steps",
    "1",
    "--point-timeout",
    "30",
    "--nproc-per-node",
    "2",
    "--no-report",
]


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_a_killed_rank_ends_the_job_loudly_and_resume_completes_it(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "bench/run.py", *SWEEP, "--out", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 150
        while rows(out / "results.csv") < 2:
            if proc.poll() is not None:  # it ended before the kill: say why
                o, e = proc.communicate()
                raise AssertionError(f"sweep ended ({proc.returncode}): {e[-3000:]}{o[-1500:]}")
            assert time.monotonic() < deadline, "sweep did not start"
            time.sleep(0.2)
        victim = next(p for p in descendants(proc.pid) if local_rank_of(p) == "1")
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    # the launcher notices a dead rank and stops the other, which leaves within its grace even
    # when blocked in a native wait (a group's creation) that no handler interrupts
    assert time.monotonic() - t0 < 25
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: rank 1 (pid") and "killed by SIGKILL" in line, err[-2000:]
    done = pd.read_csv(out / "results.csv")
    finished = done[done["status"] == "ok"]
    assert 2 <= len(finished) < 6  # finished points kept
    # the point that was running: lost contact where rank 0 saw it, else ended by the launcher
    lost = done[done["status"] == "error"]
    said = lost["error"].astype(str)
    assert len(lost) <= 1 and said.str.contains("lost contact|terminated \\(SIGTERM\\)").all()

    resumed = launch(
        [sys.executable, "bench/run.py", *SWEEP, "--out", str(out), "--resume"], timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:] + resumed.stdout[-3000:]
    assert resumed.stdout.count("already done, skipped (--resume)") == len(finished)
    final = pd.read_csv(out / "results.csv")
    ok = final[final["status"] == "ok"]
    assert len(ok) == 6 and ok["point"].is_unique  # every point once, failed ones rerun

    other = launch(
        [
            sys.executable,
            "bench/run.py",
            *SWEEP[:-3],
            "--nproc-per-node",
            "2",
            "--steps",
            "3",
            "--out",
            str(out),
            "--resume",
        ],
        timeout=60,
    )
    assert other.returncode == 2
    assert "was made with other settings: steps 10 (now 3)" in other.stderr


def mismatched_point(debug: bool) -> dict:
    """A point whose model all-reduces a rank-dependent number of elements: the seed's classic
    deadlock. With DETAIL debugging the collective is checked across ranks first."""
    from bench.runner.train.lifecycle import PointSettings, run_point
    from parallel_kernels import strategies
    from tests.test_harness import make_point, pool_env

    class Mismatched(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            t = torch.ones(10 + dist.get_rank())  # rank 0: 10 elements, rank 1: 11
            dist.all_reduce(t, group=self.group)
            return self.model(x)

    def apply(model, *, group, device):
        m = Mismatched(model)
        m.group = group
        return m

    strategies.STRATEGIES["mismatch"] = strategies.Strategy(
        name="mismatch",
        description="test only",
        impls={"bad": strategies.Impl(name="bad", apply=apply, native=False)},
        default_impls=("bad",),
        schedule="ddp",
    )
    previous = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL if debug else previous)
    try:
        point = make_point(
            "t", "mlp", 1, "bad", "mismatch", warmup_steps=1, steps=2, profile_steps=1
        )
        cfg = PointSettings(point_timeout_s=10.0)
        t0 = time.monotonic()
        row = run_point(point, pool_env(), cfg, Path("/tmp/unused-traces")).as_dict()
        row["seconds"] = time.monotonic() - t0
        return row
    finally:
        dist.set_debug_level(previous)
        del strategies.STRATEGIES["mismatch"]


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_debug_turns_mismatched_collectives_into_an_error_row(pool):
    row = pool(2).run(mismatched_point, True)[0]
    assert row["status"] == "error"
    assert "mismatch" in row["error"].lower() or "shape" in row["error"].lower(), row["error"]
    assert row["seconds"] < 10  # reported at once, not after the 10 s timeout
    print(row["error"])
