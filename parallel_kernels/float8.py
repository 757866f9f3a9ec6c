"""Float8 training of the transformer blocks' matmuls through torchao (``precision=fp8``).

What is converted: every ``nn.Linear`` inside the workload's blocks (the modules activation
checkpointing recomputes: its ``checkpoint_units``, else its FSDP units) whose input and output
features are both multiples of 16, which float8's matmul (``torch._scaled_mm``) needs. torchao's
``Float8Linear`` takes its place: input, weight and output gradient cast to float8 with dynamic
per-tensor scales (e4m3 forward, e5m2 gradients), the matmul in float8, its output in fp32.

Filtered out, and left ``nn.Linear`` in fp32: every Linear outside the blocks (the output head,
whose logits the loss is most sensitive to, as torchtitan leaves it out too), the embeddings
(not Linears), and a block's Linear with a dimension that is not a multiple of 16. A model
without Linears in its blocks (GPT-2's are ``Conv1D``) converts nothing and is refused.

The rest of the model (norms, softmax, embeddings, the loss) stays fp32 with no autocast, so
that an fp8 point differs from fp32 by the float8 matmuls alone. Where: on CUDA GPUs of compute
capability 8.9 and above real float8 matmuls; on a CPU torchao's emulation
(``Float8LinearConfig(emulate=True)``): the casts to float8 are real, so the numerics and the
memory are float8's, but the matmul runs in fp32, so its step times are not float8's (the row's
``untimed`` says so). A GPU below 8.9 is refused. torchao is an optional extra
(``pip install 'parallel-bench[fp8]'``), imported only when a point converts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import torch
from torch import nn

from parallel_kernels.workload import repeated_blocks, workload_of

FP8 = "fp8"  # the precision knob's value
TORCHAO = "torchao==0.18.0"  # the pinned release (pyproject's fp8 extra)
INSTALL = f"pip install 'parallel-bench[fp8]' (or {TORCHAO})"
MIN_CAPABILITY = (8, 9)  # float8 tensor cores: Ada, Hopper and later
MULTIPLE = 16  # torch._scaled_mm's alignment of both matmul dimensions
EMULATED = "fp8 emulated: not float8's speed"  # the row's untimed (matmuls in fp32)


def converts(precision: str) -> bool:
    """Whether a point of this precision has its blocks' matmuls converted to float8."""
    return precision == FP8


def matmul_precision(knobs: dict) -> str:
    """The precision a point's matmuls run in: its ``precision``, else the strategy's own
    mixed-precision policy where set (FSDP's ``mixed_precision``), else fp32."""
    precision = knobs.get("precision", "fp32")
    policy = knobs.get("mixed_precision", "none")
    return policy if precision == "fp32" and policy not in (None, "none") else precision


@contextlib.contextmanager
def quiet_torchao() -> Iterator[None]:
    """torchao's import's log lines silenced (here, or where transformers imports it, as it
    does whenever torchao is installed): a CPU build of torch cannot load torchao's CUDA kernels
    (mxfp8, cutlass), which float8 training does not use, and torch warns of an enum torchao
    registers the old way."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _torchao():
    """``torchao.float8``, imported quietly (``quiet_torchao``)."""
    with quiet_torchao():
        import torchao.float8 as float8
    return float8


def torchao_missing() -> str | None:
    """Why float8 cannot be imported (one line, how to install it), or None."""
    try:
        _torchao()
    except ImportError as e:
        return f"precision=fp8 needs torchao: {INSTALL} ({e})"
    return None


def emulates(device: torch.device) -> bool:
    """Whether float8 runs emulated on ``device`` (a CPU); a GPU without float8 matmuls is
    refused in one line (ValueError)."""
    if device.type != "cuda":
        return True
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ValueError(
            f"precision=fp8: {name} (compute capability {capability[0]}.{capability[1]}) has "
            f"no float8 matmuls (needs {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or later)"
        )
    return False


def unavailable(device_type: str) -> str | None:
    """Why no fp8 point can run on this machine's ``device_type`` (cpu or cuda), or None:
    torchao missing, or the first GPU without float8. Checked before any rank starts."""
    missing = torchao_missing()
    if missing is not None or device_type != "cuda":
        return missing
    try:
        emulates(torch.device("cuda", 0))
    except ValueError as e:
        return str(e)
    return None


def block_linears(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """torchao's module filter: true for the blocks' Linears with both dimensions multiples of
    ``MULTIPLE``, false for every other module (the head, the embeddings, other Linears)."""
    inside = {id(m) for block in repeated_blocks(model) for m in block.modules()}

    def keep(module: nn.Module, fqn: str) -> bool:
        return (
            id(module) in inside
            and isinstance(module, nn.Linear)
            and module.in_features % MULTIPLE == 0
            and module.out_features % MULTIPLE == 0
        )

    return keep


def convert_blocks(model: nn.Module, device: torch.device) -> nn.Module:
    """``model`` with its blocks' Linears float8 (``block_linears``), emulated on a CPU; a
    model with none to convert, torchao missing, or a GPU without float8: one-line ValueError."""
    missing = torchao_missing()
    if missing is not None:
        raise ValueError(missing)
    emulate = emulates(device)
    keep = block_linears(model)
    name = getattr(workload_of(model), "name", type(model).__name__)
    if not any(keep(m, n) for n, m in model.named_modules()):
        raise ValueError(
            f"precision=fp8: {name} has no nn.Linear in its blocks with dimensions multiples "
            f"of {MULTIPLE} to convert"
        )
    float8 = _torchao()
    config = float8.Float8LinearConfig(emulate=emulate)
    return float8.convert_to_float8_training(model, config=config, module_filter_fn=keep)
