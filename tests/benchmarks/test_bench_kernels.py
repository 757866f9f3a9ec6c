"""Kernels: every collective (native, reference) at a small and a large size, and one training
step of DDP, FSDP FULL_SHARD and TP degree 2, at world size 2 on gloo."""

import math

import pytest

from parallel_kernels.collectives import COLLECTIVES
from tests.benchmarks import workloads
from tests.benchmarks.conftest import run_on_pool

pytestmark = pytest.mark.bench

SIZES = {"64KiB": 64 << 10, "16MiB": 16 << 20}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_collective(benchmark, ranks, name, size, impl):
    benchmark.group = f"{name} {size}"
    iters = 20 if SIZES[size] < 1 << 20 else 5
    result = run_on_pool(benchmark, ranks, workloads.collective, name, impl, SIZES[size], iters)
    benchmark.extra_info.update(collective=name, impl=impl, iters_per_round=iters)
    assert result["wrong"] == 0


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "workload,impl",
    [
        ("ddp", "native"),
        ("ddp", "reference"),
        ("fsdp", "native"),
        ("fsdp", "reference"),
        ("tp", "native"),
        ("tp", "reference"),
        ("tp", "naive"),
    ],
)
def test_training_step(benchmark, ranks, workload, impl):
    benchmark.group = f"train step {workload}"
    strategy, options, _, model = workloads.TRAINING[workload]
    last = run_on_pool(benchmark, ranks, workloads.train_step, workload, impl, 5)
    benchmark.extra_info.update(strategy=strategy, impl=impl, model=model, **options)
    # what was timed is training: after the rounds' steps the loss is below the first step's
    assert math.isfinite(last["loss"]) and last["loss"] < last["first_loss"]
