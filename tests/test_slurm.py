"""``launch/slurm/sweep.sbatch`` under a real SLURM: a one-node cluster started on this machine
(tests/slurm_cluster.py: Debian's munge and slurm packages, as root), then

1. ``sbatch --wait`` runs a 2-rank bucket sweep to its end: every point ok, the job in
   meta.json, the report written;
2. a second job cancelled mid-sweep (``scancel``) keeps its finished rows and records the running
   point as ``error`` (cancelled); the same script resubmitted finishes the run by itself
   (--resume), no point run twice;
3. a job that outlasts its time limit gets the script's early SIGTERM in the middle of a point
   and records it as cancelled (submitted first: it waits for its signal, 30 to 90 s, on one of
   the node's CPUs while the other tests' jobs run on the other);
4. bad input (outside SLURM, a node count that is not the job's, an --out no node can write)
   is one line and exit 2, before torchrun starts.
"""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.rank_pool import free_port
from tests.slurm_cluster import Cluster, why_not

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "launch" / "slurm" / "sweep.sbatch"

pytestmark = [
    pytest.mark.ci_needs("a SLURM test cluster (munge and slurm packages, as root)"),
    pytest.mark.slurm,
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = why_not()
    if why:
        pytest.skip(why)
    c = Cluster(tmp_path_factory.mktemp("slurm")).start()
    yield c
    c.stop()


# A point that waits for the signal instead of computing until it comes.
IDLE = str(REPO / "tests" / "data" / "models" / "idle_model.py") + ":idle"


def sweep_args(out: Path, values: str, steps: int, model: str = "mlp") -> list[str]:
    n = str(steps)
    return [
        "--sweep",
        "bucket_cap_mb",
        "--values",
        values,
        "--model",
        model,
        "--impl",
        "native",
        "--steps",
        n,
        "--max-steps",
        n,
        "--rounds",
        "1",
        "--interleave",  # rows visit by visit: a cancelled job keeps what finished
        "off",
        "--warmup-steps",
        "1",
        "--profile-steps",
        "1",
        "--out",
        str(out),
        "--reports-dir",
        str(out.parent / "reports"),
    ]


def submit(
    cluster: Cluster,
    log: Path,
    args: list[str],
    *,
    wait: bool = True,
    extra_env: dict | None = None,
    sbatch: list[str] = (),
) -> tuple[str, int | None]:
    """sbatch the script from the repository's root, this Python as the suite's, 2 ranks;
    return the job id and, with ``wait``, its exit code."""
    env = {
        "PYTHON": sys.executable,
        "NPROC": "2",
        "OMP_NUM_THREADS": "1",
        "PORT": str(free_port()),  # its own rendezvous port: two jobs share the node
        **(extra_env or {}),
    }
    exports = ",".join(["ALL", *(f"{k}={v}" for k, v in env.items())])
    cmd = [
        "sbatch",
        "--parsable",
        "--nodes=1",  # a CPU of the node: the time-limit job waits on one, the others run beside
        f"--output={log}",
        f"--export={exports}",
        *sbatch,
        str(SCRIPT),
        *args,
    ]
    proc = cluster.run(cmd, cwd=REPO)
    jid = proc.stdout.strip().splitlines()[0].split(";")[0]
    return jid, wait_job(cluster, jid) if wait else None


def wait_job(cluster: Cluster, jid: str, timeout_s: float = 100) -> int:
    """The job's exit code, once it has ended (polled: ``sbatch --wait`` polls every 10 s)."""
    end = time.monotonic() + timeout_s
    while cluster.run(["squeue", "-h", "-j", jid], check=False).stdout.strip():
        assert time.monotonic() < end, f"job {jid} did not end within {timeout_s:.0f} s"
        time.sleep(0.3)
    shown = cluster.run(["scontrol", "show", "job", jid]).stdout  # kept MinJobAge=300 s
    return int(re.search(r"\bExitCode=(\d+):", shown).group(1))


@pytest.fixture(scope="module")
def time_limited(cluster, tmp_path_factory):
    """The time-limit test's job (``test_the_time_limit_signal_...``), submitted when the first
    job is: it spends its 30 to 90 s waiting beside the other tests' jobs, not after them."""
    root = tmp_path_factory.mktemp("time_limit")
    out, log = root / "run", root / "job.out"
    jid, _ = submit(
        cluster,
        log,
        [*sweep_args(out, "1,5", 100_000, IDLE), "--no-report"],
        wait=False,
        sbatch=["--time=2", "--signal=TERM@30"],
    )
    return jid, out, log


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("time_limited")  # submitted first, to run beside this file's jobs
def test_a_cancelled_job_keeps_its_rows_and_a_resubmitted_one_finishes_the_run(cluster, tmp_path):
    """A sweep job cancelled keeps its finished rows; submitted again, it resumes the run to
    its report, the run's meta naming both jobs and the node they ran on."""
    out = tmp_path / "run"
    args = sweep_args(out, "1,5,25", 300)
    jid, _ = submit(cluster, tmp_path / "job1.out", args, wait=False)
    results, log = out / "results.csv", tmp_path / "job1.out"
    end = time.monotonic() + 80
    while time.monotonic() < end:  # cancel once a point is done and the next one runs
        # the second point's warm-up begun (a fixed second after the first row was once still
        # between the points on a loaded machine: no point was running to cancel)
        said = log.read_text(errors="replace") if log.exists() else ""
        if (
            results.exists()
            and len(pd.read_csv(results)) >= 1
            and re.search(r" 2/3\] .*: warm-up", said)
        ):
            time.sleep(0.5)  # into its steps: 300 of them outlast the cancel
            break
        time.sleep(0.3)
    else:
        pytest.fail("no point finished within 80 s: " + log.read_text()[-2000:])
    cluster.run(["scancel", jid])
    wait_job(cluster, jid, 60)
    assert "JobState=CANCELLED" in cluster.run(["scontrol", "show", "job", jid]).stdout
    cancelled = pd.read_csv(results)
    ok = cancelled[cancelled["status"] == "ok"]
    # the finished point(s) kept, the one running when the job was cancelled an error row
    running = cancelled[cancelled["status"] != "ok"]
    assert len(ok) >= 1 and len(running) == 1, cancelled[["point", "status", "error"]]
    assert running["status"].iloc[0] == "error" and running.index[0] == len(cancelled) - 1
    assert "cancelled" in running["error"].iloc[0], running["error"].tolist()
    jid2, rc = submit(cluster, tmp_path / "job2.out", args)
    log2 = (tmp_path / "job2.out").read_text()
    assert rc == 0, log2[-3000:]
    assert "continuing it (--resume)" in log2
    final = pd.read_csv(results)
    done = final[final["status"] == "ok"]
    # every point ok exactly once: the ones finished before the cancel were not run again
    assert sorted(done["point"]) == sorted(set(final["point"])) and len(done) == 3, final
    assert final.iloc[: len(cancelled)]["point"].tolist() == cancelled["point"].tolist()
    meta = json.loads((out / "meta.json").read_text())
    assert [j["job_id"] for j in meta["slurm_jobs"]] == [jid, jid2]
    assert meta["slurm"]["job_id"] == jid2
    assert meta["slurm"]["nodelist"] == cluster.host and meta["world_size"] == 2
    assert list((tmp_path / "reports").glob("*.html")), log2[-2000:]


def test_outside_slurm_is_one_line_and_exit_2(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--out", str(tmp_path / "x")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "not inside a SLURM job" in proc.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", ["nodes", "unwritable", "no_out"])
def test_bad_input_in_a_job_is_one_line_and_exit_2(cluster, tmp_path, case):
    out = {"unwritable": Path("/proc/pbtest/run")}.get(case, tmp_path / "run")
    args = [] if case == "no_out" else sweep_args(out, "1", 2)
    env = {"NODES": "2"} if case == "nodes" else {}
    _, rc = submit(cluster, tmp_path / "job.out", args, extra_env=env)
    log = (tmp_path / "job.out").read_text()
    said = [line for line in log.splitlines() if line.startswith("sweep.sbatch:")]
    assert len(said) == 1, log
    assert re.search(
        {
            "nodes": r"NODES=2 but the job has 1 nodes",
            "unwritable": r"is not a folder every node can write",
            "no_out": r"--out FOLDER is required",
        }[case],
        said[0],
    ), said
    assert rc == 2
    assert "torchrun ended" not in log and not (out / "meta.json").exists()


# Last: its job has waited for its signal beside the other tests' jobs.
@pytest.mark.timeout(240)
def test_the_time_limit_signal_ends_the_running_point_as_cancelled(cluster, time_limited):
    """The script asks SLURM for SIGTERM before the time limit (--signal); a 2-minute job told
    to signal 30 s early gets it in the middle of a long point and ends before its limit.
    SLURM may send the signal up to 60 s earlier than asked (sbatch(1), --signal), so here at
    30 to 90 s into the job: a 1-minute job's signal could come before torch had even started,
    and did once in CI."""
    jid, out, job_log = time_limited
    wait_job(cluster, jid, 200)
    shown = cluster.run(["scontrol", "show", "job", jid]).stdout
    runtime = re.search(r"RunTime=(\d+):(\d+):(\d+)", shown).groups()
    seconds = int(runtime[0]) * 3600 + int(runtime[1]) * 60 + int(runtime[2])
    log = job_log.read_text()
    assert seconds < 120, shown + log[-3000:]  # the signal ended it, not the limit
    assert (out / "results.csv").exists(), f"no row after {seconds} s:\n{log[-3000:]}"
    rows = pd.read_csv(out / "results.csv")
    assert len(rows) >= 1 and (rows.iloc[:-1]["status"] == "ok").all(), rows
    last = rows.iloc[-1]
    assert last["status"] == "error" and "cancelled" in last["error"], last.to_dict()
