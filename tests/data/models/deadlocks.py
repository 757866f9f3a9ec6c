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


# -- a pipeline's deadlock: the stages disagree on the micro-batch count -----------------------
def _fewer_microbatches(model) -> object:
    """torch's schedule for this rank built over one micro-batch fewer than the point's (the
    last stage, rank 1): it takes the same micro-batches, of the same size, but stops one short,
    so the first stage's last send has no receive. ``parallel_kernels.pipeline`` is patched by
    the workload's build, on rank 1 only: the product holds no such knob."""
    import dataclasses

    from parallel_kernels import pipeline

    plan, m = model.plan, model.plan.microbatches
    model.plan = dataclasses.replace(plan, microbatches=m - 1)
    try:
        schedule = _NATIVE_SCHEDULE(model)
    finally:
        model.plan = plan
    step = schedule.step

    def shorter(*args, target=None, losses=None):
        cut = None if target is None else target[: target.shape[0] // m * (m - 1)]  # MICROBATCHES
        return step(*args, target=cut, losses=losses)

    schedule.step = shorter
    del pipeline
    return schedule


_NATIVE_SCHEDULE = None


def _pipeline_lm():
    """The tied 4-block language model; on rank 1 of a run, its pipeline's schedule is built
    one micro-batch short (``_fewer_microbatches``)."""
    global _NATIVE_SCHEDULE
    from parallel_kernels import pipeline
    from tests.data.models.pipeline_models import TiedLM

    if dist.is_initialized() and dist.get_rank() == 1 and _NATIVE_SCHEDULE is None:
        _NATIVE_SCHEDULE = pipeline._native_schedule
        pipeline._native_schedule = _fewer_microbatches
    return TiedLM()


def microbatches() -> Workload:
    """A pipeline whose stages disagree on the micro-batch count (run it with ``--sweep
    pp_microbatches --impl native``)."""
    from dataclasses import replace

    from tests.data.models.pipeline_models import tied

    return replace(tied(), name="deadlock_microbatches", build=_pipeline_lm)
