"""Distributed training kernels: native and reference implementations side by side.

``Workload`` is the public interface for benchmarking your own model (``workload.py``)."""

from parallel_kernels.workload import Workload

__all__ = ["Workload"]
