"""The user's commands, for real: torchrun, the data contract, refusing to overwrite, resume."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.runfolder import columns
from bench.runfolder.schema import read_run, read_verdicts
from bench.runner import cli

pytestmark = pytest.mark.e2e

TRAINING_COLUMNS = columns.contract(columns.TRAINING)


REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
# A short sweep's steps: one round of 3 timed steps after one warm-up, 2 of them traced.
SHORT = ["--steps", "3", "--max-steps", "3", "--rounds", "1", "--warmup-steps", "1"]
SHORT += ["--profile-steps", "2"]
SMALL = ["--sweep", "bucket_cap_mb", "--values", "0.25,5", "--model", "mlp", *SHORT]
SMALL += ["--point-timeout", "30"]


def launch(cmd: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


@pytest.mark.timeout(400)
def test_sweep_writes_the_data_contract_and_resumes(tmp_path, capsys, no_torchrun):
    """Two rounds of two values and two implementations: a row per visit, the samples of each
    round, the noise floor between visits, the answers on the console; resume skips them."""
    out, reports = tmp_path / "run", tmp_path / "reports"
    rounds = ["--rounds", "2", "--max-steps", "6", "--interleave", "off"]  # 3 steps a round
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node=2",
        "bench/run.py",
        *SMALL,
        *rounds,
        "--out",
        str(out),
        "--reports-dir",
        str(reports),
    ]
    proc = launch(cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"results: {out}  report: {reports / 'run.html'}"
    assert proc.stdout.count(": ok, step ") == 8 and "[round 2/2 4/4] " in proc.stdout
    assert "USDT" not in proc.stderr + proc.stdout  # the profiler's start/stop lines: silenced
    # the console carries the answer per model and implementation, with its confidence
    assert "mlp, native: " in proc.stdout and "mlp, reference: " in proc.stdout
    assert "typical_ms_low" in proc.stdout

    meta = json.loads((out / "meta.json").read_text())
    for key in (
        "run_id",
        "sweep",
        "argv",
        "torch_version",
        "backend",
        "device",
        "world_size",
        "nodes",
        "host",
        "git_commit",
        "start_time",
        "end_time",
    ):
        assert key in meta, key
    assert meta["world_size"] == 2 and meta["backend"] == "gloo" and meta["end_time"]

    visits = pd.read_csv(out / "results.csv")
    assert list(visits.columns[: len(TRAINING_COLUMNS)]) == TRAINING_COLUMNS
    assert len(visits) == 8 and sorted(visits["round"]) == [1] * 4 + [2] * 4
    orders = meta["round_orders"]
    assert len(orders) == 2 and all(sorted(o) == sorted(visits["point"].unique()) for o in orders)
    df = read_run(out).results  # a row per point: its last round, pooling both
    assert len(df) == 4 and set(df["status"]) == {"ok"} and (df["rounds"] == 2).all()
    assert (df["steps"] == 6).all() and set(df["stop"]) <= {"target", "max_steps"}
    assert (df["step_ms_ci_low"] <= df["step_ms_median"]).all()
    assert (df["step_ms_median"] <= df["step_ms_ci_high"]).all()
    noise = pd.read_csv(out / "noise.csv")
    assert len(noise) == 8 and (noise["ms"] > 0).all()
    assert df["gpu_util_pct"].isna().all()  # does not apply on CPU: empty, never zero
    assert df["nvml_util_pct"].isna().all() and (df["cpu_busy_pct"] > 0).all()
    assert (out / "traces" / "sweep_scalars").is_dir()  # the sweep's TensorBoard scalars
    samples = pd.read_csv(out / "samples.csv")  # every timed step, for comparisons
    assert samples.groupby("point").size().to_dict() == dict.fromkeys(df["point"], 6)
    assert (samples.groupby(["point", "round"]).size() == 3).all()
    verdicts = read_verdicts(out)  # the answers, machine-readable
    assert sorted(verdicts["impl"]) == ["native", "reference"] and set(verdicts["model"]) == {"mlp"}
    assert set(verdicts["best"].astype(str)) <= {"0.25", "5"} and set(verdicts["method"]) == {
        "rounds"
    }
    assert (df["comm_bytes_per_step"] == df["grad_bytes"]).all()
    assert (df["comm_bytes_expected"] == df["grad_bytes"]).all()
    for point in df["point"]:
        traces = list((out / "traces" / point).glob("rank*.pt.trace.json"))
        assert len(traces) == 2, point
    html = (reports / "run.html").read_text()
    assert "data:image/png;base64," in html and "tensorboard --logdir" in html

    # the same command again is refused before anything starts (in this process: the check
    # a launcher and each rank make alike, bench/runner/cli.py's _check_out)
    with pytest.raises(SystemExit) as again:
        cli.main(cmd[cmd.index("bench/run.py") + 1 :])
    assert again.value.code == 2 and "already holds results" in capsys.readouterr().err
    assert len(pd.read_csv(out / "results.csv")) == 8  # untouched

    # Resume through the built-in launcher (no torchrun): every finished point is skipped.
    resumed = launch(
        [
            sys.executable,
            "bench/run.py",
            *SMALL,
            *rounds,
            "--out",
            str(out),
            "--resume",
            "--nproc-per-node",
            "2",
            "--no-report",
        ]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("already done, skipped (--resume)") == 8
    assert len(pd.read_csv(out / "results.csv")) == 8


@pytest.mark.timeout(300)
def test_world_size_sweep_without_torchrun(tmp_path):
    """`python bench/run.py --sweep world_size --nproc-per-node 4`: the ranks start through
    PyTorch's elastic launcher, points run on 1, 2 and 4 of them inside the one launch, and
    the report draws throughput and efficiency."""
    out, reports = tmp_path / "ws", tmp_path / "reports"
    proc = launch(
        [
            sys.executable,
            "bench/run.py",
            "--sweep",
            "world_size",
            "--model",
            "mlp",
            "--impl",
            "native",
            "--steps",
            "6",
            "--max-steps",
            "6",
            "--rounds",
            "1",
            "--warmup-steps",
            "1",
            "--profile-steps",
            "1",
            "--batch-size",
            "16",
            "--point-timeout",
            "60",
            "--nproc-per-node",
            "4",
            "--out",
            str(out),
            "--reports-dir",
            str(reports),
        ],
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out / "results.csv")
    assert set(df["status"]) == {"ok"}
    assert sorted(zip(df["scaling"], df["world_size"], df["batch_per_replica"], strict=True)) == [
        ("strong", 1, 64),
        ("strong", 2, 32),
        ("strong", 4, 16),
        ("weak", 1, 16),
        ("weak", 2, 16),
        ("weak", 4, 16),
    ]
    html = (reports / "ws.html").read_text()
    assert "<h2>Scaling</h2>" in html
    # the efficiency with its interval (one round: the steps' and the noise floor's)
    assert re.search(r"efficiency</b> \[\d+, \d+\] at 4 ranks", html)


@pytest.mark.timeout(300)
def test_a_grid_of_two_knobs_is_one_row_per_combination(tmp_path):
    """``--sweep bucket_cap_mb,precision``: the cross product, each row naming both values,
    each point's record its knobs; the report draws a panel per precision."""
    out, reports = tmp_path / "grid", tmp_path / "reports"
    proc = launch(
        [
            sys.executable,
            "bench/run.py",
            "--sweep",
            "bucket_cap_mb,precision",
            "--values",
            "1,25",
            "--values2",
            "fp32,bf16",
            "--model",
            "mlp",
            "--impl",
            "reference",
            "--steps",
            "3",
            "--max-steps",
            "3",
            "--rounds",
            "1",
            "--warmup-steps",
            "1",
            "--profile-steps",
            "1",
            "--nproc-per-node",
            "2",
            "--out",
            str(out),
            "--reports-dir",
            str(reports),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out / "results.csv")
    assert (df["status"] == "ok").all(), df["error"].tolist()
    assert sorted(zip(df["value"], df["value2"], strict=True)) == [
        (1.0, "bf16"),
        (1.0, "fp32"),
        (25.0, "bf16"),
        (25.0, "fp32"),
    ]
    assert set(df["sweep"]) == {"bucket_cap_mb,precision"}
    records = [json.loads(line) for line in (out / "points.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in records}
    for row in df.itertuples():
        rec = by_id[row.point]
        assert rec["knobs"]["bucket_cap_mb"] == row.value
        assert rec["knobs"]["precision"] == row.value2
        assert rec["autocast"] == (None if row.value2 == "fp32" else "bf16")
    html = (reports / "grid.html").read_text()
    assert "one panel per model and precision" in html
    assert "precision=bf16" in html  # the headline per precision


@pytest.mark.timeout(300)
def test_a_budget_measures_every_point_once_and_says_what_it_left_out(tmp_path):
    """--budget: the first round runs whole, the later rounds' visits that do not fit are not
    run and are named; the sweep says how long it will take, and each line its time left."""
    out = tmp_path / "run"
    cmd = [sys.executable, "bench/run.py", "--nproc-per-node", "2", *SMALL, "--impl", "native"]
    cmd += ["--rounds", "3", "--budget", "1s", "--interleave", "off"]  # last wins
    cmd += ["--out", str(out), "--no-report"]
    proc = launch(cmd, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out / "results.csv")
    assert len(df) == 2 and set(df["round"]) == {1} and (df["status"] == "ok").all()
    assert proc.stdout.count(": not run: the budget (1 s) is spent") == 4
    # how long, in human units: a loaded machine's first visit can make it minutes
    took = r"\d+(\.\d)? (s|min|h)"
    assert re.search(rf"sweep: about {took} in all \(6 visits", proc.stdout), proc.stdout
    assert "drops the later rounds' visits that no longer fit" in proc.stdout
    assert re.search(rf"\[round 1/3 1/2\] .*: ok, .*, about {took} left\)", proc.stdout)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["budget_s"] == 1.0 and len(meta["visits_not_run"]) == 4


@pytest.mark.timeout(300)
def test_an_interleaved_sweep_pairs_its_candidates_and_says_so(tmp_path):
    """--interleave on: one model's candidates timed in cycles, a row each with its cycles,
    samples indexed by cycle, paired verdicts in verdicts.csv, the report and the console."""
    out, reports = tmp_path / "run", tmp_path / "reports"
    cmd = [sys.executable, "bench/run.py", "--nproc-per-node", "2", *SMALL, "--impl", "native"]
    cmd += ["--values", "1,25", "--steps", "6", "--max-steps", "40", "--max-point-s", "4"]
    cmd += ["--interleave", "on", "--out", str(out), "--reports-dir", str(reports)]
    proc = launch(cmd, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 points interleaved in 1 cohort(s), 0 points x 1 round(s)" in proc.stdout
    run = read_run(out)
    df = run.results
    assert len(df) == 2 and (df["status"] == "ok").all() and (df["method"] == "paired").all()
    n = int(df["cycles"].iloc[0])
    assert 6 <= n <= 40 and (df["cycles"] == n).all() and (df["steps"] == n).all()
    assert set(df["stop"]) <= {"decided", "max_steps", "max_point_s"}
    assert df["alone_ms"].gt(0).all() and df["interleave_cost_pct"].notna().all()
    per_point = run.samples.groupby("point")["index"].apply(sorted)
    assert all(idx == list(range(n)) for idx in per_point)  # sample i: cycle i
    assert [set(c) for c in run.meta["interleaved"]] == [set(df["point"])]
    v = read_verdicts(out).iloc[0]
    assert v["method"] == "paired" and v["cycles"] == n
    assert f"paired over {n} cycles" in proc.stdout
    html = (reports / "run.html").read_text()
    assert "2 point(s) were interleaved" in html and f"paired over {n} cycles" in html
