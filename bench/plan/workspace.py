"""What a kernel allocates inside itself, which no op's output shows the tracker: measured
here, once per op and shapes, by running the op on real tensors of those shapes, and made
visible to the tracker as a scratch tensor beside the op's outputs.

On the CPU, oneDNN's convolutions reorder their input, weight and output into blocked
layouts inside the kernel (``aten::mkldnn_convolution`` and ``aten::convolution_backward``
allocate and free them before they return), enough to move a convolutional model's peak
(docs/benchmarks.md, "Planned memory"). Which ops do this is a fact of the
kernels (``WORKSPACE_OPS``); how much is measured, not modelled: a reorder's size depends on
the layout oneDNN picks for the shapes and the machine. Only a target whose kernels run here
(a ``cpu`` plan) is measured; a GPU's (cuDNN's workspaces) is the allowance's part.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map_only

from bench.analysis.breakdown import load_trace, memory_peak_delta
from parallel_kernels.workload import tensor_bytes

# Ops whose CPU kernels allocate working buffers inside (oneDNN's reorders).
WORKSPACE_OPS = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)

_measured: dict[tuple, int] = {}  # an op's signature -> its workspace, bytes


def _signature(func, args, kwargs) -> tuple:
    def key(x):
        if isinstance(x, torch.Tensor):
            return ("T", tuple(x.shape), tuple(x.stride()), str(x.dtype))
        if isinstance(x, list | tuple):
            return tuple(key(v) for v in x)
        return repr(x)

    return (str(func), torch.get_num_threads(), key(args), key(sorted(kwargs.items())))


def _real(t: torch.Tensor) -> torch.Tensor:
    """A real tensor of ``t``'s shape, strides and dtype, its storage as large as they need;
    left unwritten: values do not choose a kernel, and so not its buffers."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)


def workspace_bytes(func, args, kwargs) -> int:
    """Most bytes ``func`` holds at once inside itself beyond its outputs, on real tensors
    of these shapes here: the peak of the profiler's allocation counter during one call
    (after a first, which sets up what a kernel keeps), less the outputs it returns."""
    sig = _signature(func, args, kwargs)
    if sig not in _measured:
        with _disable_current_modes():  # real tensors: neither the fake mode nor the tracker
            real_args, real_kwargs = tree_map_only(torch.Tensor, _real, (args, kwargs))
            func(*real_args, **real_kwargs)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                out = func(*real_args, **real_kwargs)
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "op.json"
                prof.export_chrome_trace(str(path))
                rise = memory_peak_delta(load_trace(path))  # NaN: it allocated nothing
            _measured[sig] = 0 if math.isnan(rise) else max(0, int(rise) - tensor_bytes(out))
    return _measured[sig]


class _Workspaces(TorchDispatchMode):
    """Each ``WORKSPACE_OPS`` call followed by a scratch tensor of its workspace, made while
    its outputs are live and dropped at once: the tracker beneath sees the op's moment at
    its inputs, outputs and working buffers, as the allocator does."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in WORKSPACE_OPS:
            scratch = workspace_bytes(func, args, kwargs)
            if scratch:
                torch.empty(scratch, dtype=torch.uint8)  # made and dropped beneath this mode
        return out


@contextlib.contextmanager
def kernel_workspaces(measured: bool) -> Iterator[None]:
    """Inside a tracked step: ``WORKSPACE_OPS``' working buffers shown to the tracker, where
    ``measured`` (the kernels are this machine's)."""
    if not measured:
        yield
        return
    with _Workspaces():
        yield
