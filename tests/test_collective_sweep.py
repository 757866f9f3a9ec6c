"""The message_size sweep: error rows instead of crashes, blocks of calls back to back, both
placements checked, and the whole command for real."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from bench.runfolder import columns
from bench.runner.collectives.message_sweep import (
    UNSUPPORTED,
    CollectivePlan,
    MessagePoint,
    _run_size,
)
from bench.runner.measure import timing
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


def message(coll, count: int = 1024, op: str = "sum", impl: str = "native", in_place=False):
    """A point of ``count`` float32 elements."""
    return MessagePoint(
        coll=coll, impl=impl, op=op, size=count * 4, count=count, itemsize=4, in_place=in_place
    )


def _unsupported(inp, out, op, group):
    raise RuntimeError("this backend does not implement it")


def unsupported_then_fine() -> list[dict]:
    env = pool_env()
    broken = dataclasses.replace(COLLECTIVES["all_reduce"], native=_unsupported)
    group = dist.new_group()
    rows = [_run_size(message(broken), PLAN, env, group, LIMITS, "message_size")[0]]
    rows.append(
        _run_size(message(COLLECTIVES["all_reduce"]), PLAN, env, group, LIMITS, "message_size")[0]
    )
    dist.destroy_process_group(group)
    return rows


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_an_unsupported_collective_is_an_error_row(pool):
    broken, fine = pool(2).run(unsupported_then_fine)[0]
    assert broken["status"] == "error"
    assert broken["error"] == "rank 0: RuntimeError: this backend does not implement it"
    assert fine["status"] == "ok" and fine["wrong"] == 0 and fine["busbw_GBps"] > 0


@pytest.mark.unit
def test_blocks_follow_the_budget():
    """Blocks of -n calls (nccl-tests' -n), fewer where the budget (--max-steps calls) would
    then hold fewer than six blocks, too few for the median's interval."""
    plan = dataclasses.replace(PLAN, iters=20, max_iters=60)  # the command line's defaults
    assert plan.block_calls == 10
    assert (plan.budget().min_steps, plan.budget().max_steps) == (2, 6)
    plan = dataclasses.replace(PLAN, iters=20, max_iters=120)
    assert plan.block_calls == 20 and (plan.budget().min_steps, plan.budget().max_steps) == (1, 6)
    plan = dataclasses.replace(PLAN, iters=5, max_iters=0)  # no budget beyond -n
    assert plan.block_calls == 1 and (plan.budget().min_steps, plan.budget().max_steps) == (5, 5)


CALLS_PLAN = dataclasses.replace(PLAN, iters=4, warmup=2, max_iters=24)  # 6 blocks of 4 calls


def calls_and_barriers() -> tuple[str, dict]:
    """The order of collective calls (C) and the timing's barriers (B) while one size is
    measured, and its row."""
    env = pool_env()
    log = []
    ar = COLLECTIVES["all_reduce"]

    def counted(inp, out, op, group):
        log.append("C")
        ar.native(inp, out, op, group)

    barrier = timing.dist.barrier

    def counted_barrier(*args, **kwargs):
        log.append("B")
        return barrier(*args, **kwargs)

    group = dist.new_group()
    timing.dist.barrier = counted_barrier
    try:
        row, _ = _run_size(
            message(dataclasses.replace(ar, native=counted)),
            CALLS_PLAN,
            env,
            group,
            LIMITS,
            "message_size",
        )
    finally:
        timing.dist.barrier = barrier
    dist.destroy_process_group(group)
    return "".join(log), row


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_calls_are_timed_back_to_back_in_blocks(pool):
    """nccl-tests' timed loop: warm-up, then per block one barrier and block_calls calls with
    nothing between them, then one checked call; a sample per block."""
    for log, row in pool(2).run(calls_and_barriers):
        assert log == "CC" + "BCCCC" * 6 + "C"
        assert row["block_calls"] == 4 and row["iters"] == 24 and len(row["samples_ms"]) == 6
        assert row["status"] == "ok" and row["wrong"] == 0


SLEEP_S = 0.02
BLOCK = 10  # calls per block: a per-block time would be at least 10 x the sleep


def _slow_all_reduce(inp, out, op, group):
    COLLECTIVES["all_reduce"].native(inp, out, op, group)
    time.sleep(SLEEP_S)


def slowed_call() -> dict:
    env = pool_env()
    slow = dataclasses.replace(COLLECTIVES["all_reduce"], native=_slow_all_reduce)
    plan = dataclasses.replace(PLAN, iters=BLOCK, warmup=1, max_iters=6 * BLOCK)  # 6 blocks
    group = dist.new_group()
    row, _ = _run_size(message(slow), plan, env, group, LIMITS, "message_size")
    dist.destroy_process_group(group)
    return row


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_the_time_is_per_call(pool):
    """A collective slowed by a known sleep per call: each block's time over its calls is at
    least the sleep, and less than a block's worth of it (time_us, its extremes and its
    samples). Both bounds are floors of what they tell apart: load only adds to a call, and a
    time per block could not be under the block's sleeps however idle the machine."""
    row = pool(2).run(slowed_call)[0]
    assert row["block_calls"] == BLOCK and len(row["samples_ms"]) == 6
    for t_us in (row["time_us"], row["time_us_min"], *(1e3 * ms for ms in row["samples_ms"])):
        assert SLEEP_S * 1e6 <= t_us < BLOCK * SLEEP_S * 1e6, row


def _writes_nothing(inp, out, op, group):
    pass


def both_placements() -> list[dict]:
    """A row per collective, implementation and placement, and those of a collective that
    writes nothing (the check must count it, in place too)."""
    env = pool_env()
    group = dist.new_group()
    idle = dataclasses.replace(COLLECTIVES["all_gather"], name="idle", native=_writes_nothing)
    rows = []
    for coll in [*COLLECTIVES.values(), idle]:
        op = PLAN.op if PLAN.op in coll.ops else "none"
        count = coll.align(1000, env.world_size)
        for impl in ("native", "reference") if coll is not idle else ("native",):
            for in_place in (False, True):
                point = message(coll, count, op, impl, in_place)
                row, _ = _run_size(point, PLAN, env, group, LIMITS, "message_size")
                rows.append(row)
    dist.destroy_process_group(group)
    return rows


@pytest.mark.ranks
@pytest.mark.timeout(180)
def test_in_place_and_out_of_place_are_both_checked(pool):
    rows = pool(2).run(both_placements)[0]
    got = {(r["collective"], r["impl"], r["inplace"]): r for r in rows}
    assert len(got) == len(COLLECTIVES) * 2 * 2 + 2
    for (name, _, in_place), r in got.items():
        if name == "idle":  # summed over 2 ranks: the other rank's block, out of place its own
            assert r["status"] == "ok" and r["wrong"] == (1000 if in_place else 2000), r
        elif name == "all_to_all" and in_place:
            assert r["status"] == UNSUPPORTED and "two buffers" in r["error"], r
            assert "time_us" not in r and "wrong" not in r
        else:
            assert r["status"] == "ok" and r["wrong"] == 0 and r["time_us"] > 0, r


@pytest.mark.e2e
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
    assert len(df) == 5 * 3 * 2 * 2  # collectives x sizes x implementations x placements
    assert df["inplace"].dtype == bool and df["inplace"].sum() == len(df) / 2
    missing = df["status"] == UNSUPPORTED  # in-place all-to-all: none
    assert (df.loc[missing, "collective"] == "all_to_all").all()
    assert df.loc[missing, "inplace"].all()
    assert missing.sum() == 3 * 2 and df.loc[missing, "time_us"].isna().all()
    df = df[~missing]
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
    # blocks of min(-n, --max-steps / 6) = 2 calls: at least -n calls, then more blocks until
    # +-2 % or --max-steps; every block kept, its time per call
    assert (df["block_calls"] == 2).all()
    samples = pd.read_csv(out / "samples.csv")
    assert samples.groupby("point").size().to_dict() == dict(
        zip(df["point"], df["iters"] // 2, strict=True)
    )
    assert df["iters"].between(6, 12).all()
    assert (df.loc[df["iters"] < 12, "stop"] == "target").all()
    assert (df["time_us_ci_low"] <= df["time_us"]).all()
    assert (df["time_us"] <= df["time_us_ci_high"]).all()
    assert (df["busbw_GBps_ci_low"] <= df["busbw_GBps"]).all()
    assert (df["busbw_GBps"] <= df["busbw_GBps_ci_high"]).all()
    assert "+-%" in proc.stdout  # the console's table carries the interval
    assert "blocks of 2 calls back to back" in proc.stdout and "in-place" in proc.stdout
    page = next(reports.glob("*.html")).read_text()
    assert re.search(r"best busbw \w+ [\d.]+ GB/s \[[\d.]+, [\d.]+\]", page)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["limits"]["p2p_GBps"] > 0 and meta["limits"]["memcpy_GBps"] > 0
    assert "# Avg bus bandwidth" in proc.stdout
    assert "reference / native busbw per size" in proc.stdout
    html = (reports / "coll.html").read_text()
    assert "blocks of 2 calls issued back to back" in html and "nccl-tests' method" in html
    assert "Bus bandwidth" in html and "data:image/png;base64," in html
