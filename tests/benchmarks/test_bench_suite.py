"""The suite itself: the trace analyser on the shared traces, and report generation."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.analysis import breakdown as analysis
from bench.analysis.trace_folder import analyse, load_trace_dir
from bench.report.page import write_report
from tests.report_fixtures import make_training_run

pytestmark = pytest.mark.bench

HTA = Path(__file__).resolve().parents[1] / "data" / "hta"
REPO = Path(__file__).resolve().parents[2]
# Seconds added to each analyser round: the regression test below slows it on purpose.
SLOW_S = float(os.environ.get("PARALLEL_BENCH_SLOW_ANALYSER_S", "0"))


@pytest.mark.parametrize("trace", ["nccl_data.json.gz", "sampled_rank-0.json.gz"])
def test_analyse_one_trace(benchmark, trace):
    """Read, classify and break down one trace (HTA's nccl_data: 4 GPUs' worth of kernels)."""
    benchmark.group = "analyser"

    def run():
        time.sleep(SLOW_S)
        return analysis.summarize(analysis.breakdown(analysis.load_trace(HTA / trace)))

    summary = benchmark(run)
    benchmark.extra_info.update(trace=trace, size_bytes=(HTA / trace).stat().st_size)
    assert summary["compute_ms"] > 0


def test_analyse_trace_folder(benchmark, tmp_path):
    """A run's folder of per-rank traces, end to end (load every rank, tables per folder)."""
    benchmark.group = "analyser"
    for name in ("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"):
        shutil.copy(HTA / name, tmp_path / name)
    tables = benchmark(lambda: analyse(load_trace_dir(tmp_path)))
    # every table, for both ranks: the two complete steps of each, a collective row per rank,
    # a straggler row per step
    assert set(tables) == {"ranks", "steps", "collectives", "stragglers"}
    assert sorted(tables["ranks"]["rank"]) == [0, 1]
    assert tables["steps"].groupby("rank").size().to_dict() == {0: 2, 1: 2}
    assert (tables["steps"]["window_us"] > 0).all()
    assert sorted(tables["collectives"]["rank"]) == [0, 1] and len(tables["stragglers"]) == 2


def test_report_of_a_100_point_sweep(benchmark, tmp_path):
    benchmark.group = "report"
    points = {
        ("wide_mlp", float(v), impl): 100.0 + v % 7
        for v in range(1, 51)
        for impl in ("native", "reference")
    }
    run = make_training_run(tmp_path / "run", points)
    out = benchmark.pedantic(
        lambda: write_report(run, tmp_path / "reports")[0], rounds=3, warmup_rounds=0
    )
    benchmark.extra_info.update(points=len(points))
    assert out.stat().st_size > 10_000


def test_cost_model_profile_and_simulation(benchmark):
    """The cost model on a real trace: the computation profile of HTA's NCCL rank (161
    gradients), then a DDP step simulated at eight bucket sizes and FSDP at three shardings."""
    from bench.model import schedule as sch
    from bench.model.compute import from_trace_dir

    benchmark.group = "model"

    def run():
        p = from_trace_dir(HTA, pattern="nccl_data.json.gz")
        sizes = [1 << 16] * len(p.grad_ready_ms)  # the trace records no gradient shapes
        steps = []
        for cap in (0.25, 1, 5, 10, 25, 50, 100, 250):
            buckets = sch.native_buckets(sizes, int(cap * 2**20))
            prog = sch.ddp_program(
                forward_ms=p.forward_ms,
                backward_ms=p.backward_ms,
                after_ms=p.after_ms,
                ready_ms=list(p.grad_ready_ms),
                buckets=buckets,
                bucket_ms=[0.1 * len(b) for b in buckets],
            )
            steps.append(sch.simulate(prog, share=0.5).end_ms)
        units = [sch.Unit(1.0, 2.0, 0.5, 0.5)] * 48
        for reshard in (True, False):
            prog = sch.fsdp_program(units, after_ms=1.0, reshard_after_forward=reshard)
            steps.append(sch.simulate(prog).end_ms)
        return steps

    steps = benchmark(run)
    assert len(steps) == 10 and all(s > 0 for s in steps)


@pytest.mark.timeout(240)
def test_autosave_then_compare_fails_on_a_regression(tmp_path):
    """pytest-benchmark as its users drive it: save a baseline, compare against it, and fail
    when the median regresses by more than 15 % (here: the analyser slowed by 100 ms)."""
    storage = f"file://{tmp_path / 'store'}"
    base = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        f"{Path(__file__).relative_to(REPO)}::test_analyse_one_trace[sampled_rank-0.json.gz]",
        "--benchmark-enable",
        f"--benchmark-storage={storage}",
        "--benchmark-min-rounds=3",
        "--benchmark-max-time=0.2",
    ]

    def pytest_run(*extra, slow="0"):
        # Under an xdist worker of make test, pytest-benchmark would read the worker's variables
        # and disable itself in the inner pytest: that one runs alone.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        env["PARALLEL_BENCH_SLOW_ANALYSER_S"] = slow
        return subprocess.run(
            [*base, *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=200
        )

    saved = pytest_run("--benchmark-autosave")
    assert saved.returncode == 0, saved.stdout[-2000:]
    assert list((tmp_path / "store").rglob("0001_*.json"))
    compared = pytest_run("--benchmark-compare")
    assert compared.returncode == 0 and "0001" in compared.stdout, compared.stdout[-2000:]
    slowed = pytest_run("--benchmark-compare", "--benchmark-compare-fail=median:15%", slow="0.1")
    assert slowed.returncode != 0
    assert "Performance has regressed" in slowed.stdout + slowed.stderr
