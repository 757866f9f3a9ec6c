"""Ctrl-C, a second run into the same folder, and a full disk, on real 2-rank sweeps.

- Ctrl-C (SIGINT to the launcher and every rank, as a terminal sends it to its foreground job)
  ends as SIGTERM does: the running point an error row saying it was interrupted, meta.json's
  end recorded, one line, exit 130, no traceback.
- While a run holds its folder, a second run into it is refused in one line naming the first.
- A rank whose main thread is blocked in C++ when SIGTERM comes (a store's wait whose peer has
  gone) writes its point's error row and leaves after the grace, not when torchrun's SIGKILL
  comes 30 s later.
- A full disk (a small tmpfs as ``--out``): each point whose trace cannot be written is an error
  row saying so, the rest of the sweep goes on, and no rank prints a traceback.
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.runner.cli import main
from tests.test_faults import descendants
from tests.test_launcher_loss import alive

REPO = Path(__file__).resolve().parents[1]
TRAIN = shlex.split(
    "--sweep bucket_cap_mb --values 1,25 --model mlp --impl native --steps 800 --max-steps 800 "
    "--max-point-s 60 --rounds 1 --interleave off --warmup-steps 2 --profile-steps 1 "
    "--point-timeout 60 --nproc-per-node 2 --no-report"
)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _wait_for(log: Path, text: str, proc: subprocess.Popen, within_s: float = 150) -> None:
    deadline = time.monotonic() + within_s
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


@pytest.mark.e2e
@pytest.mark.timeout(400)
def test_ctrl_c_ends_the_point_as_a_row_records_the_end_and_a_second_run_is_refused(
    tmp_path, capsys, no_torchrun
):
    """The second run is ``main`` in this process: its refusal comes before any launch, from
    the process that would launch (bench/runner/cli.py ``_check_out``)."""
    out, log = tmp_path / "run", tmp_path / "run.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            [sys.executable, "bench/run.py", *TRAIN, "--out", str(out)],
            cwd=REPO,
            env=ENV,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the terminal's foreground job
        )
    ranks: list[int] = []
    try:
        _wait_for(log, "mlp-bucket_cap_mb=1-native: warm-up", proc)
        time.sleep(1.0)  # into the timed steps
        capsys.readouterr()
        with pytest.raises(SystemExit) as second:
            main([*TRAIN, "--out", str(out)])
        err = capsys.readouterr().err
        said = err.strip().splitlines()
        assert second.value.code == 2 and len(said) == 1, err
        assert "in use by another run" in said[0] and "pid " in said[0], said
        ranks = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        code = proc.wait(timeout=120)
        text = log.read_text(errors="replace")
        assert code == 128 + signal.SIGINT, text[-3000:]
        assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
        assert text.count("interrupted (SIGINT)") >= 1, text[-3000:]
        results = pd.read_csv(out / "results.csv")
        (row,) = results[results["point"] == "mlp-bucket_cap_mb=1-native"].itertuples()
        assert row.status == "error" and "interrupted (SIGINT)" in row.error, row
        meta = json.loads((out / "meta.json").read_text())
        assert meta["end_time"] and meta["ended"].startswith("interrupted (SIGINT)"), meta
        deadline = time.monotonic() + 30
        while any(alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in ranks)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in ranks:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def _small_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


@pytest.mark.e2e
@pytest.mark.ci_needs("root, to mount a small tmpfs as a full disk")
@pytest.mark.timeout(400)
def test_a_full_disk_makes_error_rows_that_say_so_and_no_traceback(tmp_path):
    disk = tmp_path / "disk"
    if not _small_tmpfs(disk, "200k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        out = disk / "run"
        argv = [a if a != "800" else "4" for a in TRAIN]
        done = subprocess.run(
            [sys.executable, "bench/run.py", *argv, "--out", str(out)],
            cwd=REPO,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        text = done.stdout + done.stderr
        assert "Traceback" not in text, text[-4000:]
        results = pd.read_csv(out / "results.csv")
        assert len(results) >= 1 and set(results["status"]) == {"error"}, results
        assert results["error"].str.contains("No space left on device").all(), results["error"]
        # A row that no longer fits (the disk fills in pages: how much is left after the traces
        # depends on when each write failed) is taken back and the run ends saying so, as is a
        # run whose end cannot be written: one line, exit 74.
        if len(results) < 2 or done.returncode != 0:
            assert done.returncode == 74, text[-3000:]
            assert "error: cannot write" in text and "No space left on device" in text
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


BLOCKED_RANK = """
import datetime, sys
from pathlib import Path
import torch.distributed as dist
from bench.runner.faults import watchdog
watchdog.GRACE_S = 1.0
row = Path(sys.argv[1])
watchdog.install()
watchdog.on_exit(lambda why: Path(sys.argv[3]).write_text(why))  # rank 0's record of the end
watchdog.point_started(lambda why: row.write_text(why))  # rank 0's error-row writer
store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
Path(sys.argv[2]).write_text("ready")
store.wait(["never"], datetime.timedelta(seconds=120))  # C++: no Python handler runs meanwhile
"""


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_sigterm_to_a_rank_blocked_in_a_native_wait_writes_its_row_after_the_grace(tmp_path):
    row, ready, end = tmp_path / "row", tmp_path / "ready", tmp_path / "end"
    script = tmp_path / "rank.py"
    script.write_text(BLOCKED_RANK)
    rank = subprocess.Popen(
        [sys.executable, str(script), str(row), str(ready), str(end)],
        cwd=REPO,
        env={**ENV, "PYTHONPATH": str(REPO), "RANK": "0"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 40
        while not ready.exists():
            assert rank.poll() is None and time.monotonic() < deadline, rank.stderr.read()
            time.sleep(0.1)
        time.sleep(0.3)  # into the wait
        rank.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, err = rank.communicate(timeout=30)
        seconds = time.monotonic() - t0
    finally:
        rank.kill()
    assert rank.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert 1.0 <= seconds < 8, seconds  # the grace (1 s here), then out: not the wait's 120 s
    assert row.read_text() == "terminated (SIGTERM): the point was cancelled"
    assert end.read_text() == row.read_text()  # the run's end recorded with the same reason
    assert err.strip().splitlines()[-1].startswith("terminated (SIGTERM)"), err[-2000:]
