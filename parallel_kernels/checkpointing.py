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


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise ValueError(
            f"activation checkpointing works per transformer block; {type(model).__name__} has none"
        )
    for block in blocks:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
        block.activation_checkpointed = True  # for wrappers that cannot work with it
    return model
