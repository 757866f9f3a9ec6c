"""Models that hang a point on purpose, one way each, for tests/test_hang_runs.py.

Each factory is a small MLP whose forward, at its ``FAULT_AT``-th call, breaks the rules of
collectives in one known way, through the point's group (``parallel_kernels.groups.
point_group``) and a second group of its own (``aux``). The tests check that the point's
diagnosis names the rank, the call, its sequence number and the line below that did it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from parallel_kernels import Workload
from parallel_kernels.groups import point_group, timeout_of

FAULT_AT = 3  # the forward call that misbehaves (1: the warm-up step)
DIM = 16


class Faulty(nn.Module):
    def __init__(self, fault: str) -> None:
        super().__init__()
        self.fault = fault
        self.net = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU(), nn.Linear(DIM, 1))
        self.calls = 0
        self.aux = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if type(x).__name__ != "FakeTensor" and not x.is_meta:  # not when FLOPs are counted
            self.calls += 1
            getattr(self, f"_{self.fault}")(dist.get_rank(point_group()), self.calls)
        return self.net(x)

    def _aux_group(self) -> dist.ProcessGroup:
        if self.aux is None:  # every rank's first real forward: all create it, in step
            group = point_group()
            self.aux = dist.new_group(
                dist.get_process_group_ranks(group), timeout=timeout_of(group), group_desc="aux"
            )
        return self.aux

    def _none(self, rank: int, call: int) -> None:
        pass

    def _skip(self, rank: int, call: int) -> None:
        stat = torch.ones(1000)
        if rank != 1 or call < FAULT_AT:  # rank 1 skips it at FAULT_AT
            dist.all_reduce(stat, group=self._aux_group())  # SKIP

    def _order(self, rank: int, call: int) -> None:
        if call != FAULT_AT:
            return
        t, g = torch.ones(1000), point_group()
        if rank == 0:
            dist.all_reduce(t, group=g)  # ORDER-0
            dist.broadcast(t, group_src=0, group=g)
        else:
            dist.broadcast(t, group_src=0, group=g)  # ORDER-1
            dist.all_reduce(t, group=g)

    def _order_groups(self, rank: int, call: int) -> None:
        aux = self._aux_group()
        if call != FAULT_AT:
            return
        t, g = torch.ones(1000), point_group()
        if rank == 0:
            dist.all_reduce(t, group=g)  # GROUPS-0
            dist.all_reduce(t, group=aux)
        else:
            dist.all_reduce(t, group=aux)  # GROUPS-1
            dist.all_reduce(t, group=g)

    def _sizes(self, rank: int, call: int) -> None:
        if call == FAULT_AT:
            dist.all_reduce(torch.ones(1000 if rank == 0 else 999), group=point_group())  # SIZES

    def _sleep(self, rank: int, call: int) -> None:
        if call == FAULT_AT and rank == 1:
            time.sleep(3 * timeout_of(point_group()).total_seconds())  # SLEEP

    def _raises(self, rank: int, call: int) -> None:
        if call == FAULT_AT and rank == 1:
            raise RuntimeError("injected failure on rank 1")  # RAISES


def _batch(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def _workload(fault: str) -> Workload:
    return Workload(
        name=f"deadlock_{fault}",
        build=lambda: Faulty(fault),
        batch=_batch,
        loss=nn.functional.mse_loss,
    )


def none() -> Workload:
    return _workload("none")


def skip() -> Workload:
    return _workload("skip")


def order() -> Workload:
    return _workload("order")


def order_groups() -> Workload:
    return _workload("order_groups")


def sizes() -> Workload:
    return _workload("sizes")


def sleep() -> Workload:
    return _workload("sleep")


def raises() -> Workload:
    return _workload("raises")
