"""Distributed training kernels: native and reference implementations side by side.

``Workload`` is the public interface for benchmarking your own model (``workload.py``). It is
loaded when first asked for, so that the torch-free facts (``facts.py``) import without torch
(the trace analysis reads them)."""

__all__ = ["Workload"]


def __getattr__(name: str):
    if name == "Workload":
        from parallel_kernels.workload import Workload

        return Workload
    raise AttributeError(f"module 'parallel_kernels' has no attribute {name!r}")
