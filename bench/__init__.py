"""Benchmark harness, trace analysis and reports for parallel_kernels."""
