"""The planner's kernel working buffers (``bench/plan/workspace.py``): a convolution net's
step tracked under fake tensors, with them, against the allocator's own count on real ones."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker
from torch.profiler import ProfilerActivity, profile

from bench.analysis.breakdown import load_trace, memory_peak_delta
from bench.plan.workspace import kernel_workspaces, workspace_bytes

pytestmark = pytest.mark.unit


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 8, 3, padding=1),
    )


def _step(net: torch.nn.Module, x: torch.Tensor) -> None:
    net(x).square().mean().backward()


def _real_rise() -> float:
    """The step's peak above its start on real tensors, as the harness reads a CPU's."""
    net, x = _net(), torch.randn(8, 3, 32, 32)
    _step(net, x)  # a first step: what the kernels keep, and the gradients' storage
    net.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        _step(net, x)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        prof.export_chrome_trace(str(path))
        return memory_peak_delta(load_trace(path))


def _tracked_rise(workspaces: bool) -> float:
    """The same step's peak above its start, tracked under fake tensors by torch's tracker."""
    x = torch.randn(8, 3, 32, 32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        net = _net()
        tracker = MemTracker()
        tracker.track_external(net)
        with tracker:
            start = tracker.get_tracker_snapshot("current")
            with kernel_workspaces(workspaces):
                _step(net, x)
        peak = tracker.get_tracker_snapshot("peak")
    total = lambda snap: sum(v["Total"] for v in snap.values())  # noqa: E731
    return total(peak) - total(start)


def test_a_convolutions_working_buffers_are_measured_and_tracked():
    real = _real_rise()
    without, with_ = _tracked_rise(False), _tracked_rise(True)
    assert with_ == pytest.approx(real, rel=0.03), (real, without, with_)
    assert without < 0.97 * real  # what the buffers are there for


def test_an_ops_workspace_is_measured_once_per_shapes():
    from bench.plan import workspace

    conv = torch.ops.aten.convolution.default
    w = torch.randn(16, 16, 3, 3)

    def args(batch: int) -> tuple:
        return (torch.randn(batch, 16, 16, 16), w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)

    before = len(workspace._measured)
    first = workspace_bytes(conv, args(2), {})
    assert workspace_bytes(conv, args(2), {}) == first
    assert len(workspace._measured) == before + 1
    workspace_bytes(conv, args(4), {})
    assert len(workspace._measured) == before + 2
