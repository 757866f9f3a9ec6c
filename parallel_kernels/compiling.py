"""``torch.compile`` applied to a training step's model, in the modes users choose (the
``compile`` knob's values):

- ``off``: eager, as every step ran before.
- ``blocks``: each repeated block of the workload (``workload_of(model).block_types``, the
  blocks activation checkpointing finds) compiled in place with ``nn.Module.compile``, before
  the strategy wraps the model, as torchtitan does. The block stays the same module under the
  same name, so FSDP units and tensor-parallel plans still find it, and the blocks share one
  compiled graph (dynamo guards on their shapes, not on which block runs).
- ``model``: the whole wrapped model compiled in place after the strategy wrapped it (DDP's
  buckets then split its graph: dynamo's DDPOptimizer). A model that steps by its own schedule
  (a pipeline) is not called as one module: refused, its blocks can be compiled instead.

Inductor is the backend on every device: C++ kernels on the CPU, Triton on GPUs; the same
code. On the CPU it needs a C++ compiler, which ``compiler_problem`` looks for with torch's own
search before any rank trains.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch import nn

from parallel_kernels.workload import repeated_blocks, workload_of

MODES = ("off", "blocks", "model")
EAGER, BLOCKS, MODEL = MODES


def parse_compile(text: str) -> str:
    """The knob's parser: a mode of ``MODES``; a compiling mode on a host whose inductor has
    no C++ compiler is refused here, in one line, before any rank trains."""
    value = str(text).strip().lower()
    if value not in MODES:
        raise ValueError(f"{text!r} is not a compile mode ({', '.join(MODES)})")
    if value != "off" and (problem := compiler_problem()) is not None:
        raise ValueError(f"compile={value}: {problem}")
    return value


def compiler_problem() -> str | None:
    """Why inductor cannot compile on this host, or None: it can. A GPU host compiles its
    kernels with Triton; a CPU-only host needs the C++ compiler torch's own search finds
    (``cpp_builder.get_cpp_compiler``: ``cc``, ``g++`` ... on PATH, or ``CXX``)."""
    if torch.cuda.is_available():
        return None
    return cpp_compiler_missing()


@functools.cache
def cpp_compiler_missing() -> str | None:
    """Torch's search for inductor's C++ compiler, once per process: why it found none."""
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:  # noqa: BLE001  (torch's InvalidCxxCompiler, or what the search met)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"inductor found no working C++ compiler for the CPU ({first}); install g++"
    return None


def compiler_output(e: BaseException) -> str | None:
    """The C++ compiler's own first line where ``e`` is inductor's failure to compile a kernel
    (its message holds the command and, under "Output:", what the compiler said), else None:
    "CppCompileError: C++ compile error" alone does not say why."""
    if "inductor" not in type(e).__module__ and "Inductor" not in type(e).__name__:
        return None
    lines = [line.strip() for line in str(e).splitlines()]
    if "Output:" not in lines:
        return None
    said = [line for line in lines[lines.index("Output:") + 1 :] if line]
    return said[0][:300] if said else None


def compiles(knobs: dict) -> bool:
    """Whether a point with these knobs has its step compiled (its ``compile`` other than
    off)."""
    return knobs.get("compile", EAGER) != EAGER


def compile_blocks(model: nn.Module, mode: str) -> nn.Module:
    """``blocks``: each block of ``model`` compiled in place (before the strategy wraps it);
    any other mode leaves the model as it is. A model without blocks is refused."""
    if mode != BLOCKS:
        return model
    for block in _blocks(model):
        block.compile()
    return model


def compile_wrapped(wrapped: nn.Module, mode: str, *, scheduled: bool) -> nn.Module:
    """``model``: the wrapped model compiled in place (its names, state and the strategy's
    facts about it unchanged); any other mode leaves it as it is. ``scheduled``: it steps by
    its own schedule (the implementation's ``steps`` fact), which no module call runs."""
    if mode != MODEL:
        return wrapped
    if scheduled:
        raise ValueError(
            "compile=model: a pipeline steps by its schedule, not by one call of the model; "
            "compile=blocks compiles its stages' blocks"
        )
    wrapped.compile()
    return wrapped


def compiled_frames() -> int:
    """Frames dynamo has compiled in this process so far, recompilations included: the count
    before and after a stretch of steps says whether anything compiled in it (none in a
    process that never imported dynamo)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


def _blocks(model: nn.Module) -> list[nn.Module]:
    blocks = repeated_blocks(model)
    if not blocks:
        wl = workload_of(model)
        name = wl.name if wl is not None else type(model).__name__
        raise ValueError(
            f"compile=blocks compiles each block; {name} has none (a workload names its "
            "blocks in block_types)"
        )
    return list(blocks)
