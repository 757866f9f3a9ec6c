"""What the check against the plain model holds a parallel step to, and how it says so.

The tolerances (fp32, compressed gradients, reduced precision; why each is what it is), every
plain parameter against its gathered parallel copy, and the messages: a mismatch's (the loss,
the first parameter that differs, a TP plan's entries involved) and the ``checked`` column's.
``plain_check`` runs the steps; this module only compares what they left.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

from bench.runfolder.points import PointRecord
from parallel_kernels.compiling import compiles
from parallel_kernels.ddp import POWERSGD_START_ITER
from parallel_kernels.workload import workload_of


@dataclass(frozen=True)
class Tolerance:
    """How close the parallel step must come to the plain one.

    The loss: within ``loss_rtol`` of the plain loss. A parameter element: within
    ``param_rtol`` x its plain value plus ``lr_atol`` x the learning rate. AdamW's first step
    moves an element by about lr x sign(gradient) wherever |gradient| >> eps, so an element
    whose true gradient is about 0 steps by +-lr as the arithmetic's rounding says (a key
    bias's gradient is 0 exactly: softmax ignores a constant added to every score), however
    exact the rest: elements whose plain gradient is under ``noise`` x the model's gradient
    scale (``grad_scale``) are not held to it; in fp32 a gradient of exactly 0 is (an unused
    embedding row: an element the parallel side moved there is a fault), in reduced precision
    it is noise too (fp16 underflows small gradients to 0). A parameter differs when more than
    ``outliers`` of its other elements (a fraction, rounded down) are beyond.
    """

    name: str
    loss_rtol: float
    param_rtol: float
    lr_atol: float
    noise: float
    outliers: float
    zero_is_noise: bool = True

    def allowed(self, numel: int) -> int:
        return math.floor(self.outliers * numel)


# Each tolerance lies between what correct strategies measure against the plain step and what
# wrong ones do (a wrong plan, units or batch): the table is in docs/faults.md, "Checked
# against the plain model".
FP32 = Tolerance(
    "fp32 tolerance",
    loss_rtol=1e-4,
    param_rtol=1e-4,
    lr_atol=0.1,
    noise=1e-4,
    outliers=1e-4,
    zero_is_noise=False,
)
# fp16/bf16 gradient all-reduce: the forward is fp32 (the loss is held to fp32's tolerance).
COMPRESSED = Tolerance(
    "compressed-gradient tolerance",
    loss_rtol=1e-4,
    param_rtol=1e-4,
    lr_atol=0.1,
    noise=0.1,
    outliers=1e-3,
)
# bf16/fp16 autocast, or a strategy's mixed precision (which the plain side runs as autocast)
REDUCED = Tolerance(
    "reduced-precision tolerance",
    loss_rtol=2e-2,
    param_rtol=1e-3,
    lr_atol=0.1,
    noise=0.1,
    outliers=2e-2,
)
# fp8's second check: the plain model with its blocks float8 (emulated) against the plain fp32
# model. float8 e4m3 keeps 3 mantissa bits (rounding up to 2**-4 of a value), so a gradient near
# 0 may change sign and AdamW's first step move that element the other way: measured up to 3 %
# of a parameter's elements, the loss within 5e-5 (llama:tiny, transformer; docs/faults.md); a
# wrong float8 cast (a bad scale, a dropped term) moves the loss and flips about half.
FP8_NEAR_FP32 = Tolerance(
    "fp8-near-fp32 tolerance",
    loss_rtol=1e-3,
    param_rtol=1e-3,
    lr_atol=0.1,
    noise=0.1,
    outliers=0.1,
)
# A compiled step (the ``compile`` knob): inductor fuses and reorders float sums (a matmul's
# epilogue, a norm's reduction), so the loss and gradients differ in their last bits, as a
# reordered all-reduce's do, and AdamW's first step moves elements whose gradient is near 0 by
# +-lr: a ten times wider loss, noise floor and outlier share than fp32's. A wrong compiled
# graph (a dropped term, a stale block) moves the loss by far more (docs/sweeps.md).
COMPILED = replace(
    FP32, name="compiled tolerance", loss_rtol=1e-3, param_rtol=1e-3, noise=1e-3, outliers=1e-3
)


def tolerance_for(point: PointRecord) -> Tolerance | str:
    """The point's tolerance, or why it is not checked (a string)."""
    if point.warmup_steps < 1:
        return "not checked: no warm-up step to check"
    if point.knobs.get("precision", "fp32") != "fp32":
        return REDUCED
    hook = point.knobs.get("comm_hook", "none")
    if hook.startswith("powersgd"):
        if POWERSGD_START_ITER < 2:
            return "not checked: PowerSGD compresses the first step (lossy by design)"
        # its first steps are a plain all-reduce (start_powerSGD_iter): checked as fp32, the
        # compression itself (lossy by design) is not
        return replace(FP32, name="fp32 tolerance, PowerSGD's first step being uncompressed")
    if hook in ("fp16", "bf16"):
        return COMPRESSED
    return COMPILED if compiles(point.knobs) else FP32


@dataclass(frozen=True)
class ParamDiff:
    """One plain parameter against its gathered parallel copy."""

    name: str
    numel: int
    beyond: int  # elements beyond the tolerance (those whose gradient is noise left out)
    max_abs: float  # largest absolute difference over those elements
    max_lr: float  # the same in units of the learning rate
    missing: bool = False  # the parallel model's state does not hold it


def grad_scale(model: nn.Module) -> float:
    """The model's gradient scale: the median over its parameters of each one's RMS gradient
    (one large embedding gradient does not set it; a few all-noise ones do not either)."""
    rms = [
        float(p.grad.double().pow(2).mean().sqrt())
        for p in model.parameters()
        if p.grad is not None and p.grad.numel()
    ]
    return float(torch.tensor(rms).median()) if rms else 0.0


def _diff(
    name: str,
    p: nn.Parameter,
    got: torch.Tensor,
    tol: Tolerance,
    lr: float,
    scale: Callable[[], float],
) -> ParamDiff:
    want = p.detach()
    got = got.detach().to(device=want.device, dtype=want.dtype)
    if got.shape != want.shape:
        return ParamDiff(name, want.numel(), want.numel(), math.inf, math.inf)
    if torch.equal(got, want):  # DDP's and FSDP's usual case: one pass
        return ParamDiff(name, want.numel(), 0, 0.0, 0.0)
    # in the parameters' dtype, in place: two values this close subtract exactly
    d = got.sub(want).abs_()
    if p.grad is not None:  # the steps of noise gradients are the rounding's: not held
        g = p.grad.detach().abs()
        noise = g <= tol.noise * scale()
        if not tol.zero_is_noise:  # fp32: a 0 is exact (an embedding row no sample used)
            noise &= g > 0
        d.masked_fill_(noise, 0.0)
    beyond = int((d > want.abs().mul_(tol.param_rtol).add_(tol.lr_atol * lr)).sum())
    top = float(d.max()) if d.numel() else 0.0
    in_lr = top / lr if lr else (0.0 if top == 0 else math.inf)  # lr 0: nothing may move
    return ParamDiff(name, want.numel(), beyond, top, in_lr)


def param_diffs(plain: nn.Module, full: dict[str, torch.Tensor], tol: Tolerance, lr: float):
    """Every plain parameter (after its step, its gradient kept) against the parallel state,
    in module order, under each name the state holds it by (a tied parameter is one parameter
    with two names: the state may hold either or both). A trainable parameter the state holds
    under no name is missing."""
    names: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for name, p in plain.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        params[id(p)] = p
    scale = functools.cache(lambda: grad_scale(plain))  # only where a parameter differs
    out = []
    for key, p in params.items():
        held = [n for n in names[key] if n in full]
        if not held and p.requires_grad:
            out.append(ParamDiff(names[key][0], p.numel(), p.numel(), math.nan, math.nan, True))
        out += [_diff(n, p, full[n], tol, lr, scale) for n in held]
    return out


def _plan_groups(model: nn.Module) -> list[list[str]]:
    """The workload's TP plan as its entries (``pattern style``), cut into Megatron's groups:
    each ends at a rowwise entry, the column (and copy) entries before it its pair."""
    wl = workload_of(model)
    plan = getattr(wl, "tp_plan", None)
    if plan is None:
        from parallel_kernels.tensor_parallel import builtin_plan

        plan = builtin_plan
    entries = plan(model) if callable(plan) else plan
    groups: list[list[str]] = [[]]
    for pattern, p in entries.items():
        style = getattr(p, "style", p)
        groups[-1].append(f"{pattern} {style}")
        if style == "rowwise":
            groups.append([])
    return [g for g in groups if g]


def plan_entries(model: nn.Module, differing: list[str]) -> list[str]:
    """The TP plan's entries whose modules hold a differing parameter, with their pairs; every
    entry where no parameter differs (the loss alone: the forward as a whole is suspect). A
    plan of module names (the built-in models') reads as patterns: ``blocks.*.fc1``."""
    modules = {name.rpartition(".")[0] for name in differing}
    out: list[str] = []
    for group in _plan_groups(model):
        patterns = [e.rpartition(" ")[0] for e in group]
        if not differing or any(fnmatch.fnmatchcase(m, p) for m in modules for p in patterns):
            out += group
    return list(dict.fromkeys(re.sub(r"\.\d+(?=\.)", ".*", e) for e in out))


def mismatch(
    loss: tuple[float, float],
    diffs: list[ParamDiff],
    tol: Tolerance,
    tp_model: nn.Module | None = None,
) -> str | None:
    """The mismatch's message, or None within tolerance; ``tp_model``: the plain model of a
    tensor-parallel point, whose plan's entries the message names."""
    got, want = loss
    rel = abs(got - want) / max(abs(want), 1e-12)
    bad = [d for d in diffs if d.missing or d.beyond > tol.allowed(d.numel)]
    if rel <= tol.loss_rtol and not bad and math.isfinite(got):
        return None
    text = (
        f"checked against the plain model ({tol.name}): loss {got:.6g} vs "
        f"{want:.6g} unsharded (rel {rel:.1e}, tolerance {tol.loss_rtol:.0e})"
    )
    if bad:
        first = bad[0]
        text += (
            f"; first parameter that differs: {first.name}, missing from the parallel model's state"
            if first.missing
            else f"; first parameter that differs: {first.name}, largest difference "
            f"{first.max_abs:.1e} ({first.max_lr:.1f} x lr), {first.beyond:,} of "
            f"{first.numel:,} elements beyond tolerance"
        )
        if len(bad) > 1:
            text += f" ({len(bad)} parameters differ)"
    if tp_model is not None:
        involved = plan_entries(tp_model, [d.name for d in bad])
        text += f"; tensor-parallel plan entries involved: {', '.join(involved) or 'none'}"
    return text


def summary(loss: tuple[float, float], diffs: list[ParamDiff], tol: Tolerance) -> str:
    """The ``checked`` column of a point within tolerance."""
    got, want = loss
    rel = abs(got - want) / max(abs(want), 1e-12)
    top = max((d.max_lr for d in diffs), default=0.0)
    beyond = sum(d.beyond for d in diffs)
    n = sum(d.numel for d in diffs)
    return (
        f"ok ({tol.name}: loss rel {rel:.1e}; parameters: largest difference "
        f"{top:.2g} x lr, {beyond:,} of {n:,} elements beyond)"
    )
