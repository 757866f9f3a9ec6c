"""A model whose steps wait instead of compute, for tests that need a point to run long
(until a signal, a time limit or a kill comes) without taking a core from the tests beside
them: each real forward sleeps ``STEP_S`` (not when FLOPs are counted on fake tensors)."""

from __future__ import annotations

import time

import torch
from torch import nn

from parallel_kernels import Workload

STEP_S = 0.02
DIM = 16


class Idle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x).__name__ != "FakeTensor" and not x.is_meta:
            time.sleep(STEP_S)
        return self.net(x)


def _batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def idle() -> Workload:
    return Workload(
        name="idle",
        description=f"one linear layer whose forward sleeps {STEP_S} s",
        build=Idle,
        batch=_batch,
        loss=nn.functional.mse_loss,
    )
