"""Facts every side needs, once, torch-free: the bus factor of each collective and the dtype
each precision name computes in.

The registry (``collectives.py``), the trace analysis, the cost model's report and the replay
all read these; the analysis may import this module alone of ``parallel_kernels`` (its layer
contract in pyproject.toml says so), so nothing here imports torch or the running side.
"""

from __future__ import annotations

from collections.abc import Callable

# Bus bandwidth factor per collective, as nccl-tests defines it (doc/PERFORMANCE.md; the
# alltoall and sendrecv tests' own factors for those two): busbw = algbw x factor(n). An op
# missing here has no busbw (NaN where one is asked), never a guessed factor: NCCL runs
# all-to-all, gather, scatter and point-to-point alike as SendRecv kernels, whose name does
# not say which.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,  # gloo's point-to-point spans: one tensor, one way
    "recv": lambda n: 1.0,
}

# The dtype (torch's name) each precision name of the knobs computes in; tf32 keeps float32
# storage; "none" (no mixed precision) has none.
PRECISION_DTYPES: dict[str, str | None] = {
    "fp32": "float32",
    "tf32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "none": None,
}


def torch_dtype(precision: str):
    """The ``torch.dtype`` of a precision name (None for "none"); torch is imported here,
    when asked, so that the module stays importable without it."""
    import torch

    name = PRECISION_DTYPES[precision]
    return None if name is None else getattr(torch, name)
