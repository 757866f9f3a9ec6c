"""Facts every side needs, once, torch-free: the one name of each collective however a trace
spells it, the bus factor of each, how its nccl-tests size relates to the bytes a trace records,
which are point-to-point, the spans a pipeline's step records, the dtype each precision name
computes in, and the dtypes' spellings in traces and flight records with their sizes.

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
# letters and of the words for variants that move the same data (base, coalesced, into tensor,
# single: torch.distributed's ``all_gather_single``, FSDP2's call),
# then looked up here.
_NCCL_KERNEL = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")
_VARIANT = re.compile(r"coalesced|intotensor|tensor|base|sparse|single")
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
OPS = frozenset(_OPS.values())  # every op's one name


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


# The spans a pipeline's step records, which the trace analysis reads: the schedule's whole run
# on a stage (parallel_kernels/pipeline.py; a stage's bubble is the part of it the stage does
# not compute) and each micro-batch's forward (F) or backward (B) in the reference schedules
# (pipeline_schedule.py: ``pipeline F 3``). torch's own schedules name theirs otherwise: its
# single-stage GPipe ``Forward 3`` and ``Backward 3``, its multi-stage ones ``PP:<action>``
# (``PP:1F3``: stage 1's forward of micro-batch 3; I and W the backward's input and weight
# halves); its 1F1B records none.
PIPELINE_SCHEDULE_SPAN = "pipeline schedule"
PIPELINE_MICRO_SPAN = re.compile(
    r"^(?:pipeline (?P<ours>[FBW]) (?P<ours_mb>\d+)"
    r"|(?P<gpipe>Forward|Backward) (?P<gpipe_mb>\d+)"
    r"|PP:(?P<stage>\d+)(?P<pp>[FBIW])(?P<pp_mb>\d+))$"
)


def pipeline_micro_span(kind: str, micro: int) -> str:
    """The span of one micro-batch's forward (``F``) or backward (``B``) in our schedules."""
    return f"pipeline {kind} {micro}"


def pipeline_micro_label(span: str) -> str | None:
    """A micro-batch span's short label, its kind and micro-batch (``F3``, ``B3``; torch's
    multi-stage actions keep their stage: ``1F3``), or None for any other name."""
    m = PIPELINE_MICRO_SPAN.match(span)
    if m is None:
        return None
    if m["ours"]:
        return f"{m['ours']}{m['ours_mb']}"
    if m["gpipe"]:
        return f"{m['gpipe'][0]}{m['gpipe_mb']}"
    return f"{m['stage']}{m['pp']}{m['pp_mb']}"


# What a backend's collective allocates beside the caller's buffers, by op: which of the two
# (the output or the input) it copies whole for the call. gloo gathers into a flat buffer of
# its own and copies the output out of it, and reduces a copy of a reduce-scatter's input
# (ProcessGroupGloo; tests/test_collectives.py measures both against this table); its
# all-reduce works in place. NCCL works in the caller's buffers. The planner allocates these
# copies where it tracks a configuration for the backend (bench/plan/fakes.py).
BACKEND_COPIES: dict[str, dict[str, str]] = {
    "gloo": {"all_gather": "output", "reduce_scatter": "input"},
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


# The dtypes of a trace and a flight record: how they are spelled, torch's names, their sizes.
# The trace's dtype spellings -> torch's names: record_param_comms' ``dtype`` is c10's
# ScalarType name (c10/core/ScalarType.h), ``Input type`` the C++ type record_shapes prints.
TORCH_DTYPE = {
    "Float": "float32",
    "float": "float32",
    "Double": "float64",
    "double": "float64",
    "Half": "float16",
    "c10::Half": "float16",
    "BFloat16": "bfloat16",
    "c10::BFloat16": "bfloat16",
    "Long": "int64",
    "long int": "int64",
    "long": "int64",
    "Int": "int32",
    "int": "int32",
    "Short": "int16",
    "short int": "int16",
    "short": "int16",
    "Char": "int8",
    "signed char": "int8",
    "Byte": "uint8",
    "unsigned char": "uint8",
    "Bool": "bool",
    "bool": "bool",
    "Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "c10::Float8_e5m2": "float8_e5m2",
}
ITEM_BYTES = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
# Bytes per element for the dtype spellings of record_shapes ("Input type") and of
# record_param_comms ("dtype"), from the two tables above.
DTYPE_BYTES = {spelled: ITEM_BYTES[name] for spelled, name in TORCH_DTYPE.items()}


def torch_dtype(precision: str):
    """The ``torch.dtype`` of a precision name (None for "none"); torch is imported here,
    when asked, so that the module stays importable without it."""
    import torch

    name = PRECISION_DTYPES[precision]
    return None if name is None else getattr(torch, name)
