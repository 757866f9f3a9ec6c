"""The tensors a rank holds of what an optimiser trains: each parameter, its gradient and the
optimiser's state for it, as this rank's shards. Read for the state's bytes
(``train/figures.py``) and watched for what outlives a point (``kept.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank, the tensor it holds (not ``to_local()``'s view of it,
    which a weak reference would outlive), else the tensor itself."""
    local = getattr(t, "_local_tensor", None)  # DTensor's: FSDP2's and TP's parameters
    return local if isinstance(local, torch.Tensor) else t


def trained_tensors(opt: torch.optim.Optimizer) -> Iterator[tuple[str, torch.Tensor]]:
    """("param" | "grad" | "optim", shard) for the parameters ``opt`` trains (a wrapper may
    swap others into its modules), their gradients and ``opt``'s state."""
    for group in opt.param_groups:
        for p in group["params"]:
            yield "param", shard(p)
            if p.grad is not None:
                yield "grad", shard(p.grad)
    for state in opt.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                yield "optim", shard(v)
