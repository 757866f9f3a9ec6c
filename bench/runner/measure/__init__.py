"""Measuring: timed steps on a common clock, the noise floor, the profiler, NVML, model FLOPs
and the measured peak."""
