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

from collections.abc import Callable

import torch
import torch.distributed as dist

from bench.runfolder.points import PointRecord
from bench.runner.session.distenv import DistEnv
from bench.runner.train.data import Batches
from bench.runner.train.plain_compare import (
    FP8_NEAR_FP32,
    Tolerance,
    mismatch,
    param_diffs,
    summary,
    tolerance_for,
)
from bench.runner.train.step import Recipe, Trainer
from parallel_kernels.facts import torch_dtype
from parallel_kernels.float8 import convert_blocks, converts
from parallel_kernels.models import build_model, workload
from parallel_kernels.strategies import STRATEGIES


class PlainModelMismatch(RuntimeError):
    """A parallelised model computed something else than the plain model."""


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
    return (
        f"not checked: the plain model does not fit one device (~{need / 2**30:.1f} GiB of "
        f"parameters, gradients and AdamW state, {free / 2**30:.1f} GiB free)"
    )


# -- the plain step -------------------------------------------------------------------------
def global_batch(trainer: Trainer) -> list:
    """Every replica's first ``accum`` micro-batches, replica by replica, as each replica's own
    sampler yields them (the same dataset, seed and split as the trainer's)."""
    own = trainer.batches
    out = []
    for r in range(trainer.dp_size):
        batches = Batches(
            own.loader.dataset,
            batch_size=trainer.point.batch_per_replica,
            rank=r,
            world_size=trainer.dp_size,
            device=trainer.device,
            seed=own.sampler.seed,
        )
        out += [next(batches) for _ in range(trainer.accum)]
    return out


def _autocast(point: PointRecord, device: torch.device):
    """The point's precision as plain autocast (a strategy's own mixed-precision policy has
    no plain equivalent: the reduced-precision tolerance covers the difference); fp8 has none:
    its float8 is in the model (``plain_step``)."""
    precision = point.knobs.get("precision", "fp32")
    if precision == "fp32" or converts(precision):
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch_dtype(precision))


def plain_step(trainer: Trainer, recipe: Recipe, *, float8: bool = True):
    """(loss, model) of the plain model after one AdamW step on the global batch (the seed,
    learning rate and clip of the ``recipe`` the trainer was made with), its
    gradients kept; an fp8 point's with its blocks float8 as the trainer's are (``float8``:
    False, left fp32, what fp8's second check compares with). Each micro-batch's loss is
    divided by ``accum`` before backward, as the trainer does, and the summed gradients by the
    replicas after it, as data parallelism averages them: in fp16 a loss divided first
    underflows small gradients to 0."""
    point, device = trainer.point, trainer.device
    # build_model seeds the global generator: the point's own stream goes on as if unchecked
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model(point.model, seed=recipe.seed).to(device)
    if float8 and converts(point.knobs.get("precision", "fp32")):
        convert_blocks(model, device)
    wl = workload(point.model)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
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
    if recipe.clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
    opt.step()
    return float(total) / trainer.dp_size, model


def parallel_loss(trainer: Trainer, group) -> float:
    """The mean over data-parallel replicas of the step's loss: the mean over every rank of
    the point, since the ranks of one tensor-parallel group share their replica's batch and
    loss (no data-parallel group needed)."""
    t = torch.tensor(float(trainer.last_loss), dtype=torch.float64, device=trainer.device)
    dist.all_reduce(t, group=group)
    return float(t) / dist.get_world_size(group)


# -- the check --------------------------------------------------------------------------------
def _first_verdict(verdict: str | None, group) -> str | None:
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
    return _first_verdict(_fit_reason(point, env), group)


def run(
    trainer: Trainer,
    env: DistEnv,
    group,
    recipe: Recipe,
    replicas: Callable[[], None] = lambda: None,
) -> str:
    """The check of the trainer's first step (just taken; ``recipe``: how the trainer was
    made), or why there is none: the ``checked`` column (``check``, ``skip_reason``)."""
    reason = skip_reason(trainer.point, env, group)
    if reason is not None:
        return reason
    return check(trainer, group, recipe, replicas)


def check(
    trainer: Trainer,
    group,
    recipe: Recipe,
    replicas: Callable[[], None] = lambda: None,
) -> str:
    """Compare the trainer's first step (just taken) with the plain model's; the ``checked``
    column, or ``PlainModelMismatch`` on every rank. Collectives on every rank of ``group``.
    ``replicas`` raises where the replicas differ: called on a mismatch, before it is reported,
    since one replica against the plain model would not name that fault."""
    point = trainer.point
    tol = tolerance_for(point)
    assert isinstance(tol, Tolerance), tol  # skip_reason returned first otherwise
    got = parallel_loss(trainer, group)
    impl = STRATEGIES[point.strategy].impl(point.impl)
    full = impl.full_state(trainer.wrapped)
    want, plain = plain_step(trainer, recipe)
    diffs = param_diffs(plain, full, tol, recipe.lr)
    tp_model = plain if point.tp_size > 1 else None
    verdict = _first_verdict(mismatch((got, want), diffs, tol, tp_model), group)
    if verdict is not None:
        replicas()
        raise PlainModelMismatch(verdict)
    return summary((got, want), diffs, tol) + _near_fp32(trainer, recipe, want, plain)


def _near_fp32(trainer: Trainer, recipe: Recipe, loss: float, model: torch.nn.Module) -> str:
    """fp8's second check (empty for other points): the plain float8 step (``loss``, ``model``)
    against the plain fp32 one, at ``FP8_NEAR_FP32``; a ``PlainModelMismatch`` beyond it (every
    rank computes the same plain steps, so every rank raises alike)."""
    if not converts(trainer.point.knobs.get("precision", "fp32")):
        return ""
    want, fp32 = plain_step(trainer, recipe, float8=False)
    full = {n: p.detach() for n, p in model.named_parameters()}
    diffs = param_diffs(fp32, full, FP8_NEAR_FP32, recipe.lr)
    verdict = mismatch((loss, want), diffs, FP8_NEAR_FP32)
    if verdict is not None:
        raise PlainModelMismatch(f"fp8 against fp32, {verdict}")
    return f"; fp8 against fp32 {summary((loss, want), diffs, FP8_NEAR_FP32)}"


def is_mismatch(errors: list[str | None]) -> bool:
    """Whether a failed point's ranks failed the check against the plain model."""
    return any(e and e.startswith(PlainModelMismatch.__name__) for e in errors)


def checked_of_failed(errors: list[str | None], checks: list[str | None]) -> str:
    """A failed point's ``checked`` from its ranks' errors and what their checks returned: a
    mismatch, what a check returned before the point failed later, or that it failed first."""
    if is_mismatch(errors):
        return "mismatch: see error"
    return next(
        (c for c in checks if c is not None), "not checked: the point failed before its check"
    )
