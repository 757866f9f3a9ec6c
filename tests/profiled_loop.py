"""A user's plain profiler loop the suite did not write: a tiny MLP trained a few steps under
``torch.profiler``, its trace file what the waterfall tests read."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def model() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 32))
    return m, torch.optim.SGD(m.parameters(), lr=0.1), torch.randn(16, 64)


def train_step(m, opt, x) -> None:
    opt.zero_grad()
    m(x).sum().backward()
    opt.step()


def profiled(folder: Path, record_shapes: bool = True) -> Path:
    """The trace of 3 active steps after one of warm-up."""
    m, opt, x = model()
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=record_shapes,
        with_stack=False,
        schedule=schedule(wait=0, warmup=1, active=3),
        on_trace_ready=tensorboard_trace_handler(str(folder)),
    ) as p:
        for _ in range(4):
            train_step(m, opt, x)
            p.step()
    (trace,) = Path(folder).glob("*.pt.trace.json")
    return trace
