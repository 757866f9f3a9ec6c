"""A real CUDA trace whose answer is known: every step the host sleeps 20 ms before it launches
anything (tests/data/gpu/README.md), so the GPU idles at least that long in every step. The
per-step table must see that idle time, not only the gaps between one step's kernels."""

from pathlib import Path

import pytest

from bench.analysis import breakdown as analysis

pytestmark = pytest.mark.unit

TRACE = Path(__file__).parent / "data" / "gpu" / "host_bound_rank0.pt.trace.json.gz"


def test_host_side_gaps_are_the_steps_idle_time():
    trace = analysis.load_trace(TRACE)
    assert trace.is_gpu
    steps = analysis.breakdown(trace)
    assert steps["step"].tolist() == [2, 3, 4]
    assert (steps["idle_us"] > 20_000).all(), steps
    # the GPU is busy under 1 ms of a ~27 ms step (it was 13 % to 29 % when each step's window
    # ran from its first kernel to its last)
    assert (steps["gpu_util_pct"] < 5).all(), steps
    assert (steps["memory_us"] > 0).all()  # the batch's copy and loss.item()
    # host-bound: the device windows are the host's steps, end to end
    cpu = analysis.step_windows(trace.events)
    assert steps["window_us"].sum() == pytest.approx(cpu["end"].iloc[-1] - cpu["start"].iloc[0])
    # HTA's filter leaves out the host's last ProfilerStep, not the device-side copy of a step
    # that Kineto also writes (a gpu_user_annotation without a stream)
    assert analysis.hta_summary(trace)["steps"] == 2
