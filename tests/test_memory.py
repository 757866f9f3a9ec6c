"""peak_mem_mb on known answers (CPU: the C heap plus the profiler's allocation counter)."""

from __future__ import annotations

import pytest
import torch

from bench.runner.measure.profiling import MemoryBaseline, step_memory

pytestmark = pytest.mark.unit

MB = 2**20
CPU = torch.device("cpu")


def _measure(tmp_path, extra_mb: int, release: bool) -> tuple[float, int, int]:
    """A training-like step on a model-free state: parameters P held throughout, gradients G
    freed at the step's start (zero_grad) and made again, and ``extra_mb`` more held during the
    step (activations). Returns the peak and P, G in bytes."""
    baseline = MemoryBaseline.now(CPU)
    params = torch.ones(8 * MB // 4)
    state = {"grad": torch.ones(16 * MB // 4)}  # the previous step's gradients

    def step() -> None:
        state["grad"] = None
        activations = torch.ones(extra_mb * MB // 4) if extra_mb else None
        state["grad"] = torch.full((16 * MB // 4,), 2.0)  # the new gradients
        del activations

    def zero_grad() -> None:
        state["grad"] = None

    got = step_memory(
        step,
        baseline=baseline,
        release=zero_grad if release else lambda: None,
        scratch_dir=tmp_path,
    )
    return got.peak_bytes, params.nbytes, 16 * MB


def test_a_step_that_allocates_x_more_peaks_x_higher(tmp_path):
    base, p, g = _measure(tmp_path, 0, release=True)
    for x in (4, 32):
        more, _, _ = _measure(tmp_path, x, release=True)
        assert more - base == pytest.approx(x * MB, rel=0.05), (x, (more - base) / MB)
    # The step's own low point is P; its peak holds the new gradients on top: P + G, not the
    # previous step's gradients a second time (the profiler's counter cannot subtract a free of
    # memory allocated before profiling began: measuring without freeing first gave P + 2G in
    # a fresh process, and wide_mlp's peak_mem_mb 38 MB, its gradients, too high).
    assert base == pytest.approx(p + g, rel=0.05), base / MB


def test_the_baseline_is_the_points_own(tmp_path):
    """Memory held before the point (an earlier point's leftovers) is not in its peak."""
    leftover = torch.ones(24 * MB // 4)
    base, p, g = _measure(tmp_path, 0, release=True)
    assert base == pytest.approx(p + g, rel=0.05), base / MB
    del leftover
