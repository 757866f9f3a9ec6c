"""Replicas that should be identical after training are: every rank's digest of the exact
bytes of its replicated parameters, compared (a silent divergence is no valid result)."""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist


class DivergedError(RuntimeError):
    """Replicas that should be identical are not."""


def param_digest(tensors: list[torch.Tensor]) -> str:
    """SHA-256 of the tensors' exact bytes: equal digests mean bit-identical replicas."""
    h = hashlib.sha256()
    for t in tensors:
        # flattened first: a 0-dim tensor (a learned scalar gate) cannot be viewed as bytes
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_replicas_agree(tensors: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    digests: list[str | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, param_digest(tensors), group=group)
    if len(set(digests)) > 1:
        differing = [r for r, d in enumerate(digests) if d != digests[0]]
        raise DivergedError(
            f"replicated parameters differ across ranks after training (ranks {differing} "
            f"differ from rank 0): the run diverged silently and is not a valid result"
        )
