"""Activation checkpointing applied to a plain model, per transformer block, in the modes users
choose (the ``activation_checkpointing`` knob's values):

- ``off``: every activation kept for backward.
- ``full`` (``on`` is another spelling): each block's forward runs under
  ``torch.utils.checkpoint`` (non-reentrant, as PyTorch recommends); its activations are dropped
  after forward and recomputed in backward, trading compute for memory.
- ``selective:op``: each block checkpointed with a per-op policy
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs of the expensive
  ops, matmuls and attention (``SAVED_OPS``), are kept (``MUST_SAVE``) and the rest recomputed
  (``PREFER_RECOMPUTE``), as torchtitan's op mode does. Backward then reruns only the cheap
  element-wise ops: less memory than ``off``, less recomputation than ``full``.
- ``selective:layer=N``: every N-th block checkpointed in full (blocks N, 2N, ... counted from
  1, torchtitan's layer mode); N=1 is ``full``, N above the block count is ``off``.

The forward method is wrapped in place rather than the block replaced by a wrapper module, so
module names (FSDP units, tensor-parallel plans) stay as they were, and wrappers that hook the
block (DDP, FSDP1, FSDP2) still see it: they gather parameters before backward reaches the
block, which is when the recomputation runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from parallel_kernels.workload import repeated_blocks, workload_of

# The ops whose outputs ``selective:op`` keeps (torch.ops.aten names; those the installed torch
# lacks are left out): the matmuls (nn.Linear dispatches addmm or mm, batched matmuls bmm) and
# scaled-dot-product attention's fused kernels, on every device.
SAVED_OPS = (
    "mm",
    "addmm",
    "bmm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
MODES = "off, full (or on), selective:op, selective:layer=N (N >= 1)"  # as messages name them


@dataclass(frozen=True)
class Mode:
    """One value of the knob: which blocks are checkpointed and how."""

    label: str  # the knob's value as rows say it
    every: int = 0  # blocks N, 2N, ... (counted from 1) checkpointed; 0: none
    per_op: bool = False  # the per-op policy (SAVED_OPS kept) instead of the whole block

    def checkpoints(self, index: int) -> bool:
        """Whether the block at ``index`` (from 0) is checkpointed."""
        return self.every > 0 and (index + 1) % self.every == 0


OFF = Mode("off")
FULL = Mode("full", every=1)
SELECTIVE_OP = Mode("selective:op", every=1, per_op=True)
_NAMED = {"off": OFF, "full": FULL, "on": FULL, "selective:op": SELECTIVE_OP}
LAYER = "selective:layer="


def checkpoint_mode(value: bool | str | Mode) -> Mode:
    """The mode ``value`` names (a bool: full or off, as the planner switches a build); a
    ValueError in one line for anything else."""
    if isinstance(value, Mode):
        return value
    if isinstance(value, bool):
        return FULL if value else OFF
    text = str(value).strip().lower()
    if text in _NAMED:
        return _NAMED[text]
    if text.startswith(LAYER):
        n = text[len(LAYER) :]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"{value!r}: the layer interval N must be an integer >= 1")
        return FULL if int(n) == 1 else Mode(f"{LAYER}{int(n)}", every=int(n))
    raise ValueError(f"{value!r} is not a checkpointing mode ({MODES})")


def checkpointed(value: bool | str | Mode) -> bool:
    """Whether ``value`` checkpoints any block (whichever its spelling: ``on`` or ``full``)."""
    return checkpoint_mode(value).every > 0


def parse_checkpointing(text: str) -> str:
    """The knob's parser: the mode's label (``on`` reads ``full``, ``selective:layer=1``
    too)."""
    return checkpoint_mode(text).label


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """Recompute each block of the workload's ``checkpoint_units`` (default: its FSDP units)
    in backward; a model with neither is refused, naming the missing fact."""
    return set_checkpointing(model, FULL)


def set_checkpointing(model: nn.Module, mode: bool | str | Mode) -> nn.Module:
    """The blocks checkpointed as ``mode`` says (a Mode, the knob's value, or a bool: full or
    off), those it leaves out as they were before: the planner steps one wrapped model both
    ways (bench/plan/memory.py); the wrappers hook the blocks themselves, which either way stay
    the same modules. ``off`` undoes what an earlier call did, and asks nothing of a model
    without blocks."""
    m = checkpoint_mode(mode)
    if m.every == 0:
        for block in model.modules():
            _restore(block)
        return model
    for i, block in enumerate(_blocks(model)):
        if vars(block).get("checkpoint_mode") != (m.label if m.checkpoints(i) else None):
            _restore(block)
            if m.checkpoints(i):
                _wrap(block, m)
    return model


def _wrap(block: nn.Module, mode: Mode) -> None:
    block.plain_forward = block.forward
    options = {"context_fn": _keep_saved_ops} if mode.per_op else {}
    block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False, **options)
    block.checkpoint_mode = mode.label
    block.activation_checkpointed = True  # for wrappers that cannot work with it


def _restore(block: nn.Module) -> None:
    # the block's own attribute only: FSDP1's wrapper hands a missing attribute on to the
    # module it wraps, and restoring the wrapper's forward to that module's would skip FSDP
    if vars(block).get("activation_checkpointed", False):
        block.forward = block.plain_forward
        block.activation_checkpointed = False
        block.checkpoint_mode = None


@functools.cache
def saved_ops() -> tuple[torch._ops.OpOverload, ...]:
    """``SAVED_OPS`` as the installed torch's default overloads."""
    packets = (getattr(torch.ops.aten, name, None) for name in SAVED_OPS)
    return tuple(p.default for p in packets if p is not None and hasattr(p, "default"))


def _keep_saved_ops():
    """The per-op policy's two contexts (forward, recomputation), fresh for each call."""
    return create_selective_checkpoint_contexts(list(saved_ops()))


def _blocks(model: nn.Module) -> list[nn.Module]:
    blocks = repeated_blocks(model)
    if not blocks:
        wl = workload_of(model)
        name = wl.name if wl is not None else type(model).__name__
        raise ValueError(
            f"activation checkpointing works per block; {name} has none (a workload names its "
            f"blocks in checkpoint_units or fsdp_units)"
        )
    return list(blocks)
