"""Activation checkpointing applied to a plain model, per transformer block.

Each block's forward runs under ``torch.utils.checkpoint`` (non-reentrant, as PyTorch
recommends): its activations are dropped after forward and recomputed in backward, trading
compute for memory. The forward method is wrapped in place rather than the block replaced by a
wrapper module, so module names (FSDP units, tensor-parallel plans) stay as they were, and
wrappers that hook the block (DDP, FSDP1, FSDP2) still see it: they gather parameters before
backward reaches the block, which is when the recomputation runs.
"""

from __future__ import annotations

import functools

from torch import nn
from torch.utils.checkpoint import checkpoint

from parallel_kernels.workload import modules_of_types, workload_of


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """Recompute each block of the workload's ``checkpoint_units`` (default: its FSDP units)
    in backward; a model with neither is refused, naming the missing fact."""
    return set_checkpointing(model, True)


def set_checkpointing(model: nn.Module, on: bool) -> nn.Module:
    """Each block's forward checkpointed (``on``) or as it was before again: the
    planner steps one wrapped model both ways (bench/plan/memory.py); the wrappers hook the
    blocks themselves, which either way stay the same modules."""
    for block in _blocks(model):
        if on and not getattr(block, "activation_checkpointed", False):
            block.plain_forward = block.forward
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
            block.activation_checkpointed = True  # for wrappers that cannot work with it
        elif not on and getattr(block, "activation_checkpointed", False):
            block.forward = block.plain_forward
            block.activation_checkpointed = False
    return model


def _blocks(model: nn.Module) -> list[nn.Module]:
    wl = workload_of(model)
    if wl is not None and wl.block_types:
        blocks = modules_of_types(model, wl.block_types)
    else:
        blocks = getattr(model, "blocks", None)
    if not blocks:
        name = wl.name if wl is not None else type(model).__name__
        raise ValueError(
            f"activation checkpointing works per block; {name} has none (a workload names its "
            f"blocks in checkpoint_units or fsdp_units)"
        )
    return list(blocks)
