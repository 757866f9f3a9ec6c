"""The GPU check's behaviour where there is no GPU (CI): one line, exit 0; and the backend it
uses to put two ranks on one GPU refuses a machine without CUDA in one line."""

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
