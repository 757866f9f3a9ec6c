"""The message_size sweep: error rows instead of crashes, and the whole command for real."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from bench.runfolder import columns
from bench.runner.collectives import CollectivePlan, _run_size
from parallel_kernels.collectives import COLLECTIVES
from tests.test_harness import pool_env

COLLECTIVE_COLUMNS = columns.contract(columns.COLLECTIVE)

REPO = Path(__file__).resolve().parents[1]
PLAN = CollectivePlan(
    sizes=[4096],
    collectives=["all_reduce"],
    impls=["native"],
    dtype="float32",
    op="sum",
    iters=2,
    warmup=1,
    check=True,
)
LIMITS = {"p2p_GBps": 1.0}


def _unsupported(inp, out, op, group):
    raise RuntimeError("this backend does not implement it")


def unsupported_then_fine() -> list[dict]:
    env = pool_env()
    broken = dataclasses.replace(COLLECTIVES["all_reduce"], native=_unsupported)
    group = dist.new_group()
    rows = [
        _run_size(broken, "native", 1024, 4, PLAN, "sum", env, group, LIMITS, "message_size", "p")[
            0
        ]
    ]
    rows.append(
        _run_size(
            COLLECTIVES["all_reduce"],
            "native",
            1024,
            4,
            PLAN,
            "sum",
            env,
            group,
            LIMITS,
            "message_size",
            "q",
        )[0]
    )
    dist.destroy_process_group(group)
    return rows


@pytest.mark.timeout(120)
def test_an_unsupported_collective_is_an_error_row(pool):
    broken, fine = pool(2).run(unsupported_then_fine)[0]
    assert broken["status"] == "error"
    assert broken["error"] == "rank 0: RuntimeError: this backend does not implement it"
    assert fine["status"] == "ok" and fine["wrong"] == 0 and fine["busbw_GBps"] > 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_message_size_sweep_end_to_end(tmp_path):
    out, reports = tmp_path / "coll", tmp_path / "reports"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "bench/run.py",
            "--sweep",
            "message_size",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "32",
            "-n",
            "6",
            "--max-steps",
            "12",
            "-w",
            "1",
            "-d",
            "bfloat16",
            "--nproc-per-node",
            "2",
            "--out",
            str(out),
            "--reports-dir",
            str(reports),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns[: len(COLLECTIVE_COLUMNS)]) == COLLECTIVE_COLUMNS
    assert len(df) == 5 * 3 * 2  # collectives x sizes x implementations
    assert set(df["status"]) == {"ok"} and df["wrong"].sum() == 0
    assert (df["dtype"] == "bfloat16").all()
    ar = df[df["collective"] == "all_reduce"]
    expected = ar["algbw_GBps"] * 2 * (2 - 1) / 2
    torch.testing.assert_close(
        torch.tensor(ar["busbw_GBps"].to_numpy()),
        torch.tensor(expected.to_numpy()),
        rtol=1e-4,
        atol=0,
    )
    # adaptive: at least -n, then more until +-2 % or --max-steps; every iteration kept
    samples = pd.read_csv(out / "samples.csv")
    assert samples.groupby("point").size().to_dict() == dict(
        zip(df["point"], df["iters"], strict=True)
    )
    assert df["iters"].between(6, 12).all()
    assert (df.loc[df["iters"] < 12, "stop"] == "target").all()
    assert (df["time_us_ci_low"] <= df["time_us"]).all()
    assert (df["time_us"] <= df["time_us_ci_high"]).all()
    assert (df["busbw_GBps_ci_low"] <= df["busbw_GBps"]).all()
    assert (df["busbw_GBps"] <= df["busbw_GBps_ci_high"]).all()
    assert "+-%" in proc.stdout  # the console's table carries the interval
    page = next(reports.glob("*.html")).read_text()
    assert re.search(r"best busbw \w+ [\d.]+ GB/s \[[\d.]+, [\d.]+\]", page)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["limits"]["p2p_GBps"] > 0 and meta["limits"]["memcpy_GBps"] > 0
    assert "# Avg bus bandwidth" in proc.stdout
    assert "reference / native busbw per size" in proc.stdout
    html = (reports / "coll.html").read_text()
    assert "Bus bandwidth" in html and "data:image/png;base64," in html
