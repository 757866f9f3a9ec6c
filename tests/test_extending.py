"""docs/extending.md, done as it says: its knob (with its sweep) and its collective registered in
every rank of a real 2-rank torchrun, swept and timed end to end, and read back from the run
folders; the reference and native scatter checked exact (#wrong 0) in both placements."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.runfolder.schema import read_run

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENTRY = REPO / "tests" / "data" / "extending" / "run_with_examples.py"


def _torchrun(args: list[str], record: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if record is not None:
        env["EXTENDING_RECORD"] = str(record)
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(ENTRY), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)


@pytest.mark.timeout(300)
def test_the_pages_knob_sweeps_end_to_end_and_reaches_ddp(tmp_path):
    out, record = tmp_path / "knob", tmp_path / "record"
    record.mkdir()
    args = ["--sweep", "gradient_as_bucket_view", "--impl", "native", "--out", str(out)]
    args += ["--steps", "3", "--max-steps", "3", "--rounds", "1", "--warmup-steps", "2"]
    args += ["--profile-steps", "1", "--reports-dir", str(tmp_path / "reports")]
    proc = _torchrun(args, record)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = read_run(out)
    df = run.results.set_index("value")
    assert sorted(df.index.astype(str)) == ["False", "True"]
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert df["checked"].str.startswith("ok").all()  # each trained as the plain model does
    points = list(run.points.values())
    assert {p.knobs["gradient_as_bucket_view"] for p in points} == {False, True}
    assert {p.defaults["gradient_as_bucket_view"] for p in points} == {False}
    # the value reached DistributedDataParallel on every rank, as the row says it goes
    for rank in (0, 1):
        calls = json.loads((record / f"ddp_options.{rank}.json").read_text())
        assert {c.get("gradient_as_bucket_view") for c in calls} == {False, True}
    # the reading side knows the sweep from the run folder alone
    page = (tmp_path / "reports" / "knob.html").read_text()
    assert "gradient_as_bucket_view" in page and "All points" in page


@pytest.mark.timeout(300)
def test_the_pages_collective_is_timed_and_exact_in_both_placements(tmp_path):
    out = tmp_path / "coll"
    args = ["--sweep", "message_size", "--collectives", "scatter", "-b", "1K", "-e", "16K"]
    args += ["-f", "4", "-n", "6", "-w", "1", "--max-steps", "12", "--out", str(out)]
    args += ["--no-report"]
    proc = _torchrun(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = read_run(out).results
    assert set(df["collective"]) == {"scatter"}
    assert set(df["impl"]) == {"native", "reference"} and set(df["inplace"]) == {False, True}
    assert sorted(set(df["size_bytes"])) == [1024, 4096, 16384]
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert (df["wrong"] == 0).all()
    # busbw = algbw x (n - 1) / n, nccl-tests' scatter factor, at 2 ranks
    np.testing.assert_allclose(df["busbw_GBps"], df["algbw_GBps"] * 0.5, rtol=1e-4)  # CSV digits
    assert "scatter" in proc.stdout  # its console table, as nccl-tests prints one
