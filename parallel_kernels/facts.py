"""Facts every side needs, once, torch-free: the one name of each collective however a trace
spells it, the bus factor of each, how its nccl-tests size relates to the bytes a trace records,
which are point-to-point, and the dtype each precision name computes in.

The registry (``collectives.py``), the trace analysis, the cost model's report and the replay
all read these; the analysis may import this module alone of ``parallel_kernels`` (its layer
contract in pyproject.toml says so), so nothing here imports torch or the running side.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# Bus bandwidth factor per collective (by its one name, ``op_name`` below), as nccl-tests
# defines it (doc/PERFORMANCE.md; the alltoall and sendrecv tests' own factors for those two):
# busbw = algbw x factor(n). An op
# missing here has no busbw (NaN where one is asked), never a guessed factor: NCCL runs
# all-to-all, gather, scatter and point-to-point alike as SendRecv kernels, whose name does
# not say which.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send": lambda n: 1.0,  # gloo's point-to-point spans: one tensor, one way
    "recv": lambda n: 1.0,
}

# nccl-tests' size S of a call over the bytes a trace (or a flight record) holds for it, the
# call's input: an all-gather's S is its output, n inputs; every other registered op's S is its
# input (all-reduce, broadcast: the buffer; reduce-scatter, all-to-all: the send buffer).
# ``collectives.py``'s ``in_count`` rows say the same, and a test holds the two equal.
S_PER_INPUT: dict[str, Callable[[int], int]] = {"all_gather": lambda n: n}


def size_per_input(op: str, n: int) -> int:
    return S_PER_INPUT[op](n) if op in S_PER_INPUT else 1


# Point-to-point ops: the two ranks of a pair issue different ops by design, so they are not
# compared across ranks as collectives are.
POINT_TO_POINT = ("send", "recv")
# Rooted collectives whose input only the root holds (the others pass none): every rank's output
# is what they issue alike, so a dump describes such a call by its output.
ROOT_ONLY_INPUT = ("scatter",)

# How traces and dumps spell an op, reduced to one name. The spellings: ProcessGroupGloo's and
# ProcessGroupNCCL's profiler spans (``gloo:all_reduce``, ``nccl:_all_gather_base``), c10d's
# op names (``allgather_into_tensor_coalesced``, a flight record's ``profiling_name``), and NCCL's
# kernels (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ``ncclKernel_SendRecv_...``). A spelling
# is lower-cased, stripped of any prefix up to a colon (``gloo:``, ``c10d::``), of all but
# letters and of the words for variants that move the same data (base, coalesced, into tensor),
# then looked up here.
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_VARIANT = re.compile(r"coalesced|intotensor|tensor|base|sparse")
_OPS = {
    "allreduce": "all_reduce",
    "broadcast": "broadcast",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recvanysource": "recv",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
}


def op_name(spelling: str) -> str:
    """The op's one name: ``gloo:all_reduce``, ``allreduce``, ``ncclDevKernel_AllReduce_Sum_f32``
    -> all_reduce; ``nccl:_all_gather_base`` -> all_gather; ``ncclKernel_SendRecv`` -> send_recv
    (NCCL runs all-to-all, gather, scatter and point-to-point alike as SendRecv kernels). A
    spelling it does not know keeps its name, without a backend's prefix."""
    kernel = _NCCL_KERNEL.search(spelling)
    if kernel:
        spelling = _CAMEL.sub("_", kernel.group(1)).lower()
    key = _VARIANT.sub("", re.sub(r"[^a-z]", "", spelling.lower().rpartition(":")[2]))
    if key in _OPS:
        return _OPS[key]
    return spelling[5:] if spelling.startswith(("gloo:", "nccl:")) else spelling


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
