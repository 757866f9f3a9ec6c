"""What a training step asks of a wrapped model, whatever the strategy: clip the gradient's
global norm, and skip gradient synchronisation in the micro-batches before the last."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import nn


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the gradient of the whole model to ``max_norm`` however it is split across ranks:
    the wrapper's own method where it has one (FSDP1, the reference), else PyTorch's, which
    handles DTensor shards (FSDP2) and replicated gradients (DDP)."""
    own = getattr(model, "clip_grad_norm_", None)
    if own is not None:
        return own(max_norm)
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def unsynced(
    model: nn.Module, skip_sync: str | None
) -> Callable[[], contextlib.AbstractContextManager]:
    """A context manager factory under which backward skips gradient synchronisation, by the
    implementation's ``skip_sync`` fact: the wrapper's ``no_sync`` (DDP, FSDP1), or FSDP2's
    ``set_requires_gradient_sync`` switch."""
    if skip_sync == "no_sync":
        return model.no_sync
    if skip_sync == "set_requires_gradient_sync":

        @contextlib.contextmanager
        def switched_off():
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return switched_off
    raise ValueError(f"{type(model).__name__} has no way to skip gradient synchronisation")
