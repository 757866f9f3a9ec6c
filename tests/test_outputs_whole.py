"""Nothing finished is lost to a full disk or to a second run.

- Every whole output (meta.json, points.jsonl, verdicts, the report and its pages, the plan's
  files) is written beside its place and renamed into it: a write that fails leaves the old
  file as it was, and the command says so in one line naming the path.
- results.csv's rows are appended; an append that fails is taken back to the last whole row.
- A run folder is held by one run at a time (``bench/runfolder/lock.py``): a second is refused
  in one line naming the first; a run killed without a word leaves no lock, only its line.
"""

import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.report.__main__ import main as report_main
from bench.runfolder import atomic, lock
from bench.runfolder.folder import ResultsWriter
from bench.runfolder.points import RunFolderError

REPO = Path(__file__).resolve().parents[1]
BUCKET = REPO / "tests" / "data" / "runs" / "bucket2"


def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.unit
def test_a_failed_write_leaves_the_old_file_whole_and_says_which(tmp_path, monkeypatch):
    page = tmp_path / "page.html"
    atomic.write_text(page, "the old page, whole")
    monkeypatch.setattr(atomic.os, "fsync", _no_space)
    with pytest.raises(atomic.OutputError, match=r"cannot write .*page.html: No space left"):
        atomic.write_text(page, "the new page" * 1000)
    assert page.read_text() == "the old page, whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]  # no fragment left


@pytest.mark.unit
def test_rebuilding_a_report_on_a_full_disk_keeps_the_old_report(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(BUCKET, run)
    reports = tmp_path / "reports"
    argv = [str(run), "--reports-dir", str(reports), "--timelines", "none"]
    assert report_main(argv) == 0
    (page,) = reports.glob("*.html")
    before = page.read_bytes()
    capsys.readouterr()
    monkeypatch.setattr(atomic.os, "fsync", _no_space)
    assert report_main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(page) in err[0] and "No space left on device" in err[0], err
    assert page.read_bytes() == before


@pytest.mark.unit
def test_a_row_a_full_disk_cut_short_is_taken_back(tmp_path, monkeypatch):
    path = tmp_path / "results.csv"
    writer = ResultsWriter(path, ["point", "status", "error"])
    writer.append({"point": "a", "status": "ok"})
    whole = path.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):
        if fd != writes["fd"]:
            return real_write(fd, data)
        real_write(fd, bytes(data)[: len(data) // 2])
        _no_space()

    writes = {"fd": None}
    real_open = os.open

    def tracked_open(p, *args, **kwargs):
        fd = real_open(p, *args, **kwargs)
        if Path(p) == path:
            writes["fd"] = fd
        return fd

    monkeypatch.setattr(os, "open", tracked_open)
    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(atomic.OutputError, match=r"results\.csv: No space left on device"):
        writer.append({"point": "b", "status": "error", "error": "x" * 500})
    monkeypatch.undo()
    assert path.read_bytes() == whole
    writer.append({"point": "c", "status": "ok"})
    assert list(pd.read_csv(path)["point"]) == ["a", "c"]


HOLD = """
import sys, time
from bench.runfolder import lock
lock.hold(sys.argv[1], ["bench/run.py", "--sweep", "bucket_cap_mb"])
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.unit
def test_a_second_run_is_refused_naming_the_first_and_a_killed_ones_lock_is_taken_over(
    tmp_path,
):
    run = tmp_path / "run"
    run.mkdir()
    first = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "held"
        for attempt in (lambda: lock.hold(run, ["second"]), lambda: lock.check_free(run)):
            with pytest.raises(lock.FolderInUse) as refused:
                attempt()
            line = str(refused.value)
            assert (
                "\n" not in line and f"pid {first.pid}" in line and "--sweep bucket_cap_mb" in line
            )
        first.send_signal(signal.SIGKILL)  # no word, no clean-up: the kernel lets go of the lock
        first.wait(timeout=30)
        lock.check_free(run)
        held = lock.hold(run, ["third"])
        assert f"pid {first.pid}" in held.stale  # recognised as a run that did not finish
        held.finished()
        held.release()
        again = lock.hold(run, ["fourth"])
        assert again.stale == ""  # a finished run leaves nothing to take over
        again.release()
    finally:
        if first.poll() is None:
            first.kill()


@pytest.mark.unit
def test_a_folder_that_cannot_hold_a_lock_is_one_line(tmp_path):
    with pytest.raises(RunFolderError, match="cannot create"):
        lock.hold(tmp_path / "missing" / "run", ["x"])
