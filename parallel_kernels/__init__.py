"""Distributed training kernels: native and reference implementations side by side."""
