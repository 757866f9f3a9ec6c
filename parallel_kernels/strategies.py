"""One registry: strategy name -> the functions that apply it to a plain model.

Every strategy has implementations (``native``: PyTorch's own; ``reference``: ours in this
package), each a function ``apply(model, *, group, device, **options) -> nn.Module``. The model
passed in is plain (see ``models.py``) and already on ``device``; the returned module is what the
training loop calls forward/backward on and gives to the optimiser. Options are keyword-only and
listed per strategy with their defaults, so the sweep layer can validate them before any work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from parallel_kernels.ddp import ReferenceDDP

ApplyFn = Callable[..., nn.Module]


def all_parameters(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


def apply_native_ddp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    bucket_cap_mb: float = 25.0,
) -> nn.Module:
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(
        model, process_group=group, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb
    )


def apply_reference_ddp(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    bucket_cap_mb: float = 25.0,
    overlap: bool = True,
) -> nn.Module:
    del device  # buckets live where the parameters live
    return ReferenceDDP(model, group=group, bucket_cap_mb=bucket_cap_mb, overlap=overlap)


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    description: str
    impls: Mapping[str, ApplyFn]
    options: Mapping[str, Any]  # option name -> default
    default_impls: tuple[str, ...]
    # Tensors every rank must hold bit-identically after a step; the harness checksums them to
    # catch a run whose replicas silently diverged.
    replicated: Callable[[nn.Module], list[torch.Tensor]] = lambda m: all_parameters(m)

    def apply(self, impl: str, model: nn.Module, **kwargs: Any) -> nn.Module:
        if impl not in self.impls:
            raise KeyError(f"strategy {self.name!r} has no implementation {impl!r}")
        return self.impls[impl](model, **kwargs)


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="ddp",
            description="data parallel: replicated model, gradients all-reduced in buckets",
            impls={
                "native": apply_native_ddp,
                "reference": apply_reference_ddp,
                # Same buckets, all-reduced only after backward: the no-overlap baseline.
                "reference_nooverlap": partial(apply_reference_ddp, overlap=False),
            },
            options={"bucket_cap_mb": 25.0},
            default_impls=("native", "reference"),
        ),
    )
}
