"""What of a point's own state outlives the point: its parameters, gradients, buffers and
optimiser state still alive once the harness has released every object of the point.

The harness takes what a point leaves in use off its peak (``own_memory``), because most of
it is the process's: caches the point filled (oneDNN's kernels, the autograd engine's
threads). But an implementation can keep its own state alive past its release, held from
native code: torch's FSDP1 with NO_SHARD keeps its flat parameters and AdamW's state for
them (no Python object refers to them) after its module and optimiser are gone, through a
collective, its group's destruction and a barrier. That memory was the point's during its
steps, so it stays in the point's peak; counted apart, ``mem_kept_mb``, it is a leak a user
of that implementation would meet once per model built.

Weak references see it whoever holds it: they keep nothing alive, and a tensor whose weak
reference still answers after the release is alive. Counted by storage (a view's whole
storage is alive with it, and FSDP's original parameters are views of one flat one), each
storage once. Not seen: native buffers without a tensor Python ever saw (DDP's reducer
allocates a block in its forward that CUDA's allocator can hold after the point). The sizes:
docs/benchmarks.md, "Planned memory".
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch

from bench.runner.measure.trained import shard, trained_tensors


class OwnState:
    """Weak references to a point's state, taken while it lives; ``kept_bytes()`` after
    its release says how much of it is still alive."""

    def __init__(self, tensors: Iterable[torch.Tensor]):
        self._refs = [weakref.ref(shard(t)) for t in tensors]

    @classmethod
    def of(cls, trainer) -> OwnState:
        """A trainer's model (wrapped: its parameters, buffers and their gradients) and what
        its optimiser trains (``trained.trained_tensors``)."""
        held = (*trainer.wrapped.parameters(), *trainer.wrapped.buffers())
        grads = (t.grad for t in held if t.grad is not None)
        return cls([*held, *grads, *(t for _, t in trained_tensors(trainer.opt))])

    def kept_bytes(self, device: torch.device) -> int:
        """Bytes of the storages on ``device``'s kind still alive of the state watched, each
        storage once (the memory figures are of one kind of device)."""
        storages: dict[int, int] = {}
        for ref in self._refs:
            t = ref()
            if t is not None and t.device.type == device.type:
                s = t.untyped_storage()
                storages[s.data_ptr()] = s.nbytes()
        return sum(storages.values())
