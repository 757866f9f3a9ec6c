"""The GPU check's behaviour where there is no GPU (CI): one line, exit 0; and the backend it
uses to put two ranks on one GPU refuses a machine without CUDA in one line."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.runner.session.distenv import pick_backend

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the whole check")
def test_without_cuda_the_gpu_check_says_so_and_exits_0():
    env = {"PATH": "/usr/bin:/bin", "PY": sys.executable}
    r = subprocess.run(
        ["bash", "scripts/gpu_check.sh"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "gpu-check: torch sees no CUDA device here; nothing to check"


@pytest.mark.unit
def test_gloo_on_cuda_tensors_needs_cuda():
    if torch.cuda.is_available():
        assert pick_backend("gloo-cuda") == ("gloo", "cuda")
    else:
        with pytest.raises(ValueError, match="backend gloo-cuda needs CUDA"):
            pick_backend("gloo-cuda")


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_the_planners_memory_check_measures_predictions_made_beforehand(tmp_path):
    """What ``make gpu-check`` runs on a GPU (bench/selftime/plan_memory.py), here on one gloo
    rank: predictions written without the hardware, then read and measured through the
    harness; the table prints predicted over measured, and the device memory outside the
    allocator only where there is a device (NaN here)."""
    saved = tmp_path / "predictions.json"
    script = [sys.executable, "bench/selftime/plan_memory.py", "--models", "bert:tiny"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> str:
        r = subprocess.run(
            [*script, *args], cwd=REPO, capture_output=True, text=True, timeout=200, env=env
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    said = run(
        "--ranks", "1", "--layouts", "ddp,fsdp2 FULL_SHARD", "--save-predictions", str(saved)
    )
    assert said.strip() == f"2 predictions in {saved}"
    table = run("--predictions", str(saved))
    # the columns: model (36), layout (20), predicted, measured, ratio, reserved, outside, left
    rows = {
        line[37:57].strip(): [float(x) for x in line[58:].split()[:6]]
        for line in table.splitlines()
        if line.startswith("bert:tiny")
    }
    assert sorted(rows) == ["ddp", "fsdp2 FULL_SHARD"], table
    for layout, (_, _, ratio, reserved, outside, left) in rows.items():
        assert 0.9 < ratio < 1.1, (layout, ratio)  # 0.989 and 0.977 measured
        assert math.isnan(reserved) and math.isnan(outside)
        # the heap a released point left in use (the process's caches), taken off its peak:
        # on a CPU a fraction of it (an H200 left a block of DDP's, docs/benchmarks.md)
        assert abs(left) < 0.5 * rows[layout][1], (layout, left)
    # a file that is not there: one line, exit 2
    r = subprocess.run(
        [*script, "--predictions", str(tmp_path / "none.json")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert (r.returncode, r.stderr.strip()) == (
        2,
        f"plan_memory: no predictions file {tmp_path}/none.json",
    )


@pytest.mark.unit
def test_the_memory_check_measures_every_layout_or_those_named():
    """Every layout of a model by default (FSDP1's NO_SHARD too, since the harness keeps in its
    peak what it leaves alive), and the named ones alone, in the table's order."""
    from bench.selftime.plan_memory import _configs

    default = [c.label for c in _configs(["llama:tiny"], 8, 2, ())]
    assert {"fsdp1 NO_SHARD", "fsdp1 FULL_SHARD", "ddp", "tp2"} <= set(default)
    assert len(default) == 8, default
    named = _configs(["llama:tiny"], 8, 2, ("fsdp1 NO_SHARD", "ddp"))
    assert [(c.label, c.impl, c.knobs.get("sharding_strategy")) for c in named] == [
        ("ddp", "native", None),
        ("fsdp1 NO_SHARD", "native_fsdp1", "NO_SHARD"),
    ]
