"""Data parallelism through Hugging Face Accelerate, next to plain DDP.

``Accelerator.prepare`` wraps the model in DistributedDataParallel over the job's default group
(from torchrun's environment) and, for mixed precision, runs its forward under autocast;
``Accelerator.backward`` is the backward the training step calls. The harness sees the
prepared model and calls ``model.accelerator.backward``. Accelerate is an optional extra
(``pip install -e '.[accelerate]'``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parallel_kernels.facts import torch_dtype

ACCELERATE_PRECISION = {"none": "no", "bf16": "bf16", "fp16": "fp16"}


def check_precision(mixed_precision: str) -> None:
    if mixed_precision not in ACCELERATE_PRECISION:
        known = ", ".join(ACCELERATE_PRECISION)
        raise ValueError(f"unknown mixed precision {mixed_precision!r} (known: {known})")


def apply_accelerate(
    model: nn.Module,
    *,
    group: dist.ProcessGroup | None,
    device: torch.device,
    mixed_precision: str = "none",
) -> nn.Module:
    """The model as ``Accelerator(mixed_precision=...).prepare`` returns it."""
    check_precision(mixed_precision)
    if dist.get_world_size(group) != dist.get_world_size():
        raise ValueError("Accelerate runs on the whole job (its default group), not on part of it")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    # One Accelerator per point: its state is a process-wide singleton, reset between points.
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(
        mixed_precision=ACCELERATE_PRECISION[mixed_precision], cpu=device.type == "cpu"
    )
    prepared = accelerator.prepare(model)
    prepared.accelerator = accelerator
    return prepared


def _autocast_fp32_out(forward, device: torch.device, dtype: torch.dtype):
    """``forward`` under autocast, its floating output returned in fp32 (Accelerate's
    ``convert_outputs_to_fp32``), so that the loss is computed in fp32."""

    def wrapped(*args, **kwargs):
        with torch.autocast(device.type, dtype=dtype):
            out = forward(*args, **kwargs)
        return out.float() if torch.is_tensor(out) and out.is_floating_point() else out

    return wrapped


def autocast_forward(model: nn.Module, device: torch.device, mixed_precision: str) -> nn.Module:
    """Run ``model``'s forward under autocast with fp32 outputs, as Accelerate prepares it, so
    that plain DDP can be compared with the same arithmetic."""
    check_precision(mixed_precision)
    if mixed_precision != "none":
        model.forward = _autocast_fp32_out(model.forward, device, torch_dtype(mixed_precision))
    return model
