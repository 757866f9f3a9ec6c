"""One registry: every knob a point can set, as a row.

A knob is either an option of a strategy (passed to its implementations' apply functions:
``bucket_cap_mb``, ``sharding_strategy`` ...) or a knob of the training step that every strategy
takes (``precision``, ``grad_accum``, ``activation_checkpointing``). Its row says how a value is
read from the command line, its default, where it applies, and the keyword (``param``) the code
takes its value by. The command line knows a knob by its name; the code reads a point's value
by that keyword from the point's record, which holds every knob's value and default: no other
place keeps a knob's default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parallel_kernels.checkpointing import parse_checkpointing
from parallel_kernels.compiling import parse_compile
from parallel_kernels.fsdp_layout import STRATEGIES as SHARDING_STRATEGIES
from parallel_kernels.pp_schedules import SCHEDULES, parse_schedule

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd", "powersgd2")  # powersgd: rank 1
MIXED_PRECISIONS = ("none", "bf16", "fp16")
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")  # fp8: parallel_kernels/float8.py
PP_SCHEDULES = tuple(SCHEDULES)  # those the installed torch has (parallel_kernels/pp_schedules.py)


# The bounds of the numeric knobs, each checked by its row's parser before any rank starts, so
# that a value no implementation takes is one line at the command line, not an error deep in
# torch on every rank.
# A DDP bucket of at most 1 TiB: above every model's gradients, so every larger cap runs as this
# one (one bucket). torch's DDP turns the cap into bytes in an int64 (``int(mb * 2**20)``, its
# C++ Reducer's ``bucket_bytes_cap``), which fails past 2**43 MB.
MAX_BUCKET_MB = 2**20
# Micro-batches per optimiser step: a step loads all of them on the device before its first
# forward.
MAX_GRAD_ACCUM = 2**16
# Ranks in a parallel dimension (TP degree, FSDP shard group): more than any job launches.
MAX_RANKS = 2**20


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a finite number")
    if value <= 0:
        raise ValueError(f"{text!r} must be a positive number")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{text!r} must be a positive integer")
    return value


def at_most(parse: Callable[[str], Any], bound: int, unit: str) -> Callable[[str], Any]:
    """``parse``, refusing a value above ``bound`` (in ``unit``, which the message names with
    why the bound is there); None (a knob's "unset") passes."""

    def bounded(text: str) -> Any:
        value = parse(text)
        if value is not None and value > bound:
            raise ValueError(f"{text!r} is more than {bound} {unit}")
        return value

    return bounded


def boolean(text: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false", "1", "0", "on", "off"):
        raise ValueError(f"{text!r} is not true or false")
    return value in ("true", "1", "on")


def one_of(names: tuple[str, ...], what: str, *, upper: bool = False) -> Callable[[str], str]:
    """A parser that accepts one of ``names`` (case-insensitive)."""

    def parse(text: str) -> str:
        value = str(text).strip()
        value = value.upper() if upper else value.lower()
        if value not in names:
            raise ValueError(f"{text!r} is not {what} ({', '.join(names)})")
        return value

    return parse


def optional_positive_int(text: str) -> int | None:
    return None if str(text).strip().lower() in ("", "none") else positive_int(text)


@dataclass(frozen=True, kw_only=True)
class Knob:
    name: str
    description: str
    parse: Callable[[str], Any]
    default: Any
    # The strategies whose implementations take it as an option; None: a knob of the training
    # step, which every strategy takes.
    strategies: tuple[str, ...] | None = None
    # Only these implementations take it (None: every implementation of those strategies); the
    # others run at its default and refuse any other value.
    impls: tuple[str, ...] | None = None
    # The keyword the code takes its value by (the apply functions', the training step's):
    # the knob's name unless a row says otherwise, so that a knob can be renamed on the command
    # line without touching any code.
    param: str = ""

    def __post_init__(self) -> None:
        if not self.param:
            object.__setattr__(self, "param", self.name)

    @property
    def of_step(self) -> bool:
        return self.strategies is None


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            name="bucket_cap_mb",
            description="DDP gradient bucket size, MB (2**20 bytes)",
            parse=at_most(positive_float, MAX_BUCKET_MB, "MB (a 1 TiB bucket, one for any model)"),
            default=25.0,
            strategies=("ddp",),
        ),
        Knob(
            name="comm_hook",
            description="gradient compression: none, fp16, bf16, powersgd, powersgd2",
            parse=one_of(COMM_HOOKS, "a comm hook"),
            default="none",
            strategies=("ddp",),
        ),
        Knob(
            name="sharding_strategy",
            description="FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD (ZeRO stages)",
            parse=one_of(SHARDING_STRATEGIES, "a sharding strategy", upper=True),
            default="FULL_SHARD",
            strategies=("fsdp",),
        ),
        Knob(
            name="shard_size",
            description="HYBRID_SHARD: ranks per shard group (default n/2)",
            parse=at_most(optional_positive_int, MAX_RANKS, "ranks"),
            default=None,
            strategies=("fsdp",),
        ),
        Knob(
            name="mixed_precision",
            description="the strategy's own mixed-precision policy: none, bf16, fp16",
            parse=one_of(MIXED_PRECISIONS, "a mixed precision"),
            default="none",
            strategies=("fsdp", "accelerate"),
        ),
        Knob(
            name="auto_wrap",
            description="auto-wrap policy: module (each block) or size",
            parse=one_of(("module", "size"), "an auto-wrap policy"),
            default="module",
            strategies=("fsdp",),
            impls=("native_fsdp1",),
        ),
        Knob(
            name="cpu_offload",
            description="parameters kept on the host",
            parse=boolean,
            default=False,
            strategies=("fsdp",),
            impls=("native_fsdp1",),
        ),
        Knob(
            name="hybrid_mesh",
            description="HYBRID_SHARD given an explicit 2-D mesh",
            parse=boolean,
            default=True,
            strategies=("fsdp",),
            impls=("native_fsdp1",),
        ),
        Knob(
            name="tp_degree",
            description="tensor-parallel degree (the rest of the ranks data parallel; "
            "pp: each stage's)",
            parse=at_most(positive_int, MAX_RANKS, "ranks"),
            default=1,
            strategies=("tp", "pp"),
        ),
        Knob(
            name="dp_shard",
            description="the data-parallel dimension shards (FSDP) instead of replicating (DDP)",
            parse=boolean,
            default=False,
            strategies=("tp", "pp"),
        ),
        Knob(
            name="pp_schedule",
            description="the pipeline's schedule: gpipe, 1f1b (both implementations), "
            "interleaved_1f1b, interleaved_zb, zbv, dualpipev (torch's, 2 stages a rank)",
            parse=parse_schedule,
            default="1f1b",
            strategies=("pp",),
        ),
        Knob(
            name="pp_microbatches",
            description="micro-batches a pipeline step splits the batch into",
            parse=at_most(
                positive_int, MAX_GRAD_ACCUM, "micro-batches (a step loads them all at once)"
            ),
            default=2,
            strategies=("pp",),
        ),
        Knob(
            name="pp_degree",
            description="ranks of one pipeline (default: every rank; the rest its data-parallel "
            "replicas)",
            parse=at_most(optional_positive_int, MAX_RANKS, "ranks"),
            default=None,
            strategies=("pp",),
        ),
        Knob(
            name="precision",
            description="training precision: fp32, or bf16/fp16 by autocast "
            "or the strategy's mixed-precision policy, or fp8: the blocks' matmuls in float8 "
            "(torchao; emulated on CPU), the rest fp32",
            parse=one_of(PRECISIONS, "a precision"),
            default="fp32",
        ),
        Knob(
            name="grad_accum",
            description="micro-batches per optimiser step (gradients synchronised on the last)",
            parse=at_most(
                positive_int, MAX_GRAD_ACCUM, "micro-batches (a step loads them all at once)"
            ),
            default=1,
        ),
        Knob(
            name="activation_checkpointing",
            description="blocks recomputed in backward: off, full (or on), selective:op "
            "(matmul and attention outputs kept), selective:layer=N (every N-th block)",
            parse=parse_checkpointing,
            default="off",
        ),
        Knob(
            name="compile",
            description="torch.compile (inductor) of the step: off, blocks (each block, "
            "before the strategy wraps), model (the wrapped model)",
            parse=parse_compile,
            default="off",
        ),
    )
}


def step_knobs() -> list[Knob]:
    return [k for k in KNOBS.values() if k.of_step]


def by_param(param: str) -> Knob:
    """The knob whose value the code takes as ``param``."""
    for k in KNOBS.values():
        if k.param == param:
            return k
    raise KeyError(f"no knob takes {param!r}")


def strategy_knobs(strategy: str) -> list[Knob]:
    return [k for k in KNOBS.values() if k.strategies is not None and strategy in k.strategies]


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "-" if value is None else str(value)


def docs_table() -> str:
    """The knob table as docs/sweeps.md lists it (a test keeps the two equal)."""
    lines = ["| knob | default | applies to | meaning |", "|---|---|---|---|"]
    for k in KNOBS.values():
        where = ", ".join(k.strategies) if k.strategies else "the training step"
        if k.impls:
            where += f" ({', '.join(f'`{i}`' for i in k.impls)} only)"
        lines.append(f"| `{k.name}` | {_cell(k.default)} | {where} | {k.description} |")
    return "\n".join(lines)
