"""Every benchmark a correctness test: a point's first step checked against the plain model.

nccl-tests checks every buffer it times; here a strategy applied to a model is checked the same
way. The point's first warm-up step (untimed) is the parallel side. The plain side is one extra
step of the plain single-process model: built with the same seed, trained with the same AdamW
(learning rate, clipping, autocast), on the same global batch: every data-parallel replica's
first ``accum`` micro-batches, rebuilt here from the point's dataset and sampler (both
deterministic) rather than sent between ranks, each micro-batch through the model on its own
as a replica runs it (batch normalisation sees the same statistics). Its loss is the mean of
those micro-batch losses, which is what data parallelism's gradient averaging trains.

Compared: the loss, and every parameter after the optimiser step, sharded ones gathered by the
implementation's ``full_state`` fact (``parallel_kernels/strategies.py``), a tied parameter
once. A mismatch raises ``PlainModelMismatch`` inside the point, so it becomes the point's error
row, with the figures; the ``checked`` column of every row says what was checked.

Every rank runs the plain step itself, at the same time: no rank waits out another's extra
work in a collective (whose timeout is the point's), and a model whose forward issues
collectives of its own issues them on every rank alike.
"""

from __future__ import annotations

import fnmatch
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from bench.runfolder.points import PointRecord
from bench.runner.session.distenv import DistEnv
from bench.runner.train.data import Batches
from bench.runner.train.step import Trainer
from parallel_kernels.ddp import POWERSGD_START_ITER
from parallel_kernels.models import build_model, workload
from parallel_kernels.strategies import STRATEGIES
from parallel_kernels.workload import workload_of


class PlainModelMismatch(RuntimeError):
    """A parallelised model computed something else than the plain model."""


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


# Chosen from what correct strategies measure (docs/faults.md, "Checked against the plain
# model", has the table): in fp32, DDP and FSDP are bit-identical to the plain step (grad_accum
# 2: within 0.001 lr), TP and the 2-D meshes within loss rel 1.0e-7 and 0.049 lr of every
# element, none beyond 0.05 lr; the wrong plan, units and batch put the loss rel 1.4e-3 to
# 1.3e-2 away and 2 lr in 30 to 56 % of a parameter's elements. Reduced precision: losses
# within rel 3.8e-3 (FSDP's bf16 mixed precision against autocast) and up to 0.39 % of a
# parameter's held elements beyond (the same); gradient compression: losses exact, no held
# element beyond.
FP32 = Tolerance("fp32 tolerance", loss_rtol=1e-4, param_rtol=1e-4, lr_atol=0.1, noise=1e-4,
                 outliers=1e-4, zero_is_noise=False)  # fmt: skip
# fp16/bf16 gradient all-reduce: the forward is fp32 (the loss is held to fp32's tolerance).
COMPRESSED = Tolerance("compressed-gradient tolerance", loss_rtol=1e-4, param_rtol=1e-4,
                       lr_atol=0.1, noise=0.1, outliers=1e-3)  # fmt: skip
# bf16/fp16 autocast, or a strategy's mixed precision (which the plain side runs as autocast)
REDUCED = Tolerance("reduced-precision tolerance", loss_rtol=2e-2, param_rtol=1e-3,
                    lr_atol=0.1, noise=0.1, outliers=2e-2)  # fmt: skip


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
    return FP32


# -- does the plain model fit ---------------------------------------------------------------
def _available_bytes(device: torch.device) -> float:
    """Memory the plain model can take: the device's free memory and the caching allocator's
    free blocks on CUDA; on CPU the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            kb = {line.split(":")[0]: line.split()[1] for line in f}
        return float(kb.get("MemAvailable", "inf")) * 1024


def _fit_reason(point: PointRecord, env: DistEnv) -> str | None:
    """Why the plain model would not fit, or None. It needs its parameters, gradients and two
    AdamW moments (4 x its parameter bytes) and the gathered parallel copy (1 x); on CPU every
    rank of the host holds its own at once. Activations are left out of the estimate."""
    need = 5 * point.figures["grad_bytes"]
    if env.device.type == "cpu":
        need *= max(1, env.local_world_size)
    free = _available_bytes(env.device)
    if need <= 0.9 * free:
        return None
    return (f"not checked: the plain model does not fit one device (~{need / 2**30:.1f} GiB of "
            f"parameters, gradients and AdamW state, {free / 2**30:.1f} GiB free)")  # fmt: skip


# -- the plain step -------------------------------------------------------------------------
def global_batch(trainer: Trainer) -> list:
    """Every replica's first ``accum`` micro-batches, replica by replica, as each replica's own
    sampler yields them (the same dataset, seed and split as the trainer's)."""
    own = trainer.batches
    out = []
    for r in range(trainer.dp_size):
        batches = Batches(own.loader.dataset, batch_size=trainer.point.batch_per_replica, rank=r,
                          world_size=trainer.dp_size, device=trainer.device,
                          seed=own.sampler.seed)  # fmt: skip
        out += [next(batches) for _ in range(trainer.accum)]
    return out


def _autocast(point: PointRecord, device: torch.device):
    """The point's precision as plain autocast (a strategy's own mixed-precision policy has
    no plain equivalent: the reduced-precision tolerance covers the difference)."""
    precision = point.knobs.get("precision", "fp32")
    if precision == "fp32":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[
        precision])  # fmt: skip


def plain_step(trainer: Trainer, *, seed: int, lr: float, clip: float | None):
    """(loss, model) of the plain model after one AdamW step on the global batch, its
    gradients kept. Each micro-batch's loss is divided by ``accum`` before backward, as the
    trainer does, and the summed gradients by the replicas after it, as data parallelism
    averages them: in fp16 a loss divided first underflows small gradients to 0."""
    point, device = trainer.point, trainer.device
    # build_model seeds the global generator: the point's own stream goes on as if unchecked
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model(point.model, seed=seed).to(device)
    wl = workload(point.model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    total = torch.zeros((), dtype=torch.float64, device=device)
    for x, y in global_batch(trainer):
        with _autocast(point, device):
            loss = wl.compute_loss(wl.forward(model, x), y) / trainer.accum
        loss.backward()
        total += loss.detach().double()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(trainer.dp_size)
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return float(total) / trainer.dp_size, model


def parallel_loss(trainer: Trainer, group) -> float:
    """The mean over data-parallel replicas of the step's loss: the mean over every rank of
    the point, since the ranks of one tensor-parallel group share their replica's batch and
    loss (no data-parallel group needed)."""
    t = torch.tensor(float(trainer.last_loss), dtype=torch.float64, device=trainer.device)
    dist.all_reduce(t, group=group)
    return float(t) / dist.get_world_size(group)


# -- the comparison ---------------------------------------------------------------------------
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
    rms = [float(p.grad.double().pow(2).mean().sqrt()) for p in model.parameters()
           if p.grad is not None and p.grad.numel()]  # fmt: skip
    return float(torch.tensor(rms).median()) if rms else 0.0


def _diff(name: str, p: nn.Parameter, got: torch.Tensor, tol: Tolerance, lr: float,
          scale: Callable[[], float]) -> ParamDiff:  # fmt: skip
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


def mismatch(loss: tuple[float, float], diffs: list[ParamDiff], tol: Tolerance,
             tp_model: nn.Module | None = None) -> str | None:  # fmt: skip
    """The mismatch's message, or None within tolerance; ``tp_model``: the plain model of a
    tensor-parallel point, whose plan's entries the message names."""
    got, want = loss
    rel = abs(got - want) / max(abs(want), 1e-12)
    bad = [d for d in diffs if d.missing or d.beyond > tol.allowed(d.numel)]
    if rel <= tol.loss_rtol and not bad and math.isfinite(got):
        return None
    text = (f"checked against the plain model ({tol.name}): loss {got:.6g} vs "
            f"{want:.6g} unsharded (rel {rel:.1e}, tolerance {tol.loss_rtol:.0e})")  # fmt: skip
    if bad:
        first = bad[0]
        text += (f"; first parameter that differs: {first.name}, missing from the parallel "
                 f"model's state" if first.missing else
                 f"; first parameter that differs: {first.name}, largest difference "
                 f"{first.max_abs:.1e} ({first.max_lr:.1f} x lr), {first.beyond:,} of "
                 f"{first.numel:,} elements beyond tolerance")  # fmt: skip
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
    return (f"ok ({tol.name}: loss rel {rel:.1e}; parameters: largest difference "
            f"{top:.2g} x lr, {beyond:,} of {n:,} elements beyond)")  # fmt: skip


# -- the check --------------------------------------------------------------------------------
def _agreed(verdict: str | None, group) -> str | None:
    """Every rank's verdict, the first one that is not None (in rank order), on every rank."""
    verdicts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(verdicts, verdict, group=group)
    return next((v for v in verdicts if v is not None), None)


def skip_reason(point: PointRecord, env: DistEnv, group) -> str | None:
    """Why the point is not checked (the ``checked`` column), or None: it is. Agreed by the
    ranks (the free memory each sees may differ)."""
    tol = tolerance_for(point)
    if isinstance(tol, str):
        return tol
    return _agreed(_fit_reason(point, env), group)


def run(trainer: Trainer, env: DistEnv, group, *, seed: int, lr: float, clip: float | None,
        replicas: Callable[[], None] = lambda: None) -> str:  # fmt: skip
    """The check of the trainer's first step (just taken), or why there is none: the
    ``checked`` column (``check``, ``skip_reason``)."""
    reason = skip_reason(trainer.point, env, group)
    if reason is not None:
        return reason
    return check(trainer, group, seed=seed, lr=lr, clip=clip, replicas=replicas)


def check(trainer: Trainer, group, *, seed: int, lr: float, clip: float | None,
          replicas: Callable[[], None] = lambda: None) -> str:  # fmt: skip
    """Compare the trainer's first step (just taken) with the plain model's; the ``checked``
    column, or ``PlainModelMismatch`` on every rank. Collectives on every rank of ``group``.
    ``replicas`` raises where the replicas differ: called on a mismatch, before it is said,
    since one replica against the plain model would not name that fault."""
    point = trainer.point
    tol = tolerance_for(point)
    assert isinstance(tol, Tolerance), tol  # skip_reason said so first
    got = parallel_loss(trainer, group)
    impl = STRATEGIES[point.strategy].impl(point.impl)
    full = impl.full_state(trainer.wrapped)
    want, plain = plain_step(trainer, seed=seed, lr=lr, clip=clip)
    diffs = param_diffs(plain, full, tol, lr)
    tp_model = plain if point.tp_size > 1 else None
    verdict = _agreed(mismatch((got, want), diffs, tol, tp_model), group)
    if verdict is not None:
        replicas()
        raise PlainModelMismatch(verdict)
    return summary((got, want), diffs, tol)


def checked_of_failed(errors: list[str | None], said: list[str | None]) -> str:
    """A failed point's ``checked`` from its ranks' errors and what their check said: a
    mismatch, what the check said before the point failed later, or that it failed first."""
    if any(e and e.startswith(PlainModelMismatch.__name__) for e in errors):
        return "mismatch: see error"
    return next((c for c in said if c is not None), "not checked: the point failed before its "
                "check")  # fmt: skip
