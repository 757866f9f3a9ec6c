"""The training step of a point, as the harness times it and as ``bench/selftime/speed.py``
compares implementations with: build the plain model (same seed on every rank), apply the
strategy's implementation, and step AdamW over the point's micro-batches."""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from bench.runfolder.points import PointRecord
from bench.runner.session.distenv import DistEnv
from bench.runner.train.data import Batches
from parallel_kernels.checkpointing import set_checkpointing
from parallel_kernels.compiling import compile_blocks, compile_wrapped
from parallel_kernels.facts import torch_dtype
from parallel_kernels.float8 import convert_blocks, converts
from parallel_kernels.mesh import data_parallel_coords
from parallel_kernels.models import build_model, workload
from parallel_kernels.strategies import STRATEGIES
from parallel_kernels.wrapped_step import clip_grad_norm, unsynced

# The AdamW learning rate every point trains with (``Recipe``'s default).
LR = 1e-3


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How a point's trainer is made beyond what its record says: the seed of its model and
    data, AdamW's learning rate (and its ``foreach``, where not torch's default for the device:
    the planner tracks a GPU's step on the CPU), the clip of the gradient's global norm before
    each step, and the parts a caller made already: the plain model (the planner's, shortened
    and under fake tensors) and the batches."""

    seed: int = 0
    lr: float = LR
    clip: float | None = None
    foreach: bool | None = None
    plain: torch.nn.Module | None = None
    batches: Batches | None = None


def autocast_for(point: PointRecord, device: torch.device):
    """A context factory: the forward under ``torch.autocast`` when the record says so (a
    strategy with its own mixed-precision policy has the precision among its knobs instead).
    A dtype the device cannot compute in is refused."""
    if point.autocast is None:
        return contextlib.nullcontext
    dtype = torch_dtype(point.autocast)
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"{torch.cuda.get_device_name(device)} cannot compute in bf16")
    return lambda: torch.autocast(device.type, dtype=dtype)


@dataclass
class Trainer:
    """A point's model, wrapped, with its optimiser and data; ``step()`` is one optimiser
    step over ``accum`` micro-batches, gradients synchronised only in the last one's
    backward."""

    point: PointRecord
    device: torch.device
    wrapped: torch.nn.Module
    opt: torch.optim.Optimizer
    batches: Batches
    dp_size: int
    accum: int
    clip: float | None = None
    last_loss: torch.Tensor = field(default_factory=lambda: torch.zeros(()))
    _fetched: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._workload = workload(self.point.model)
        self._autocast = autocast_for(self.point, self.device)
        facts = self.point.impl_facts
        self._scheduled = facts.get("steps") == "schedule"
        if self._scheduled and self.accum > 1:
            raise ValueError(
                "a pipeline accumulates over its own micro-batches (pp_microbatches): "
                "grad_accum must be 1"
            )
        self._skip_sync = unsynced(self.wrapped, facts["skip_sync"]) if self.accum > 1 else None
        accelerator = getattr(self.wrapped, "accelerator", None)  # Accelerate's own backward
        self._backward = accelerator.backward if accelerator is not None else torch.Tensor.backward

    @property
    def samples_per_step(self) -> int:
        return self.point.batch_per_replica * self.accum * self.dp_size

    def next_inputs(self) -> list[tuple[torch.Tensor, ...]]:
        """The next step's micro-batches, on the device."""
        return [next(self.batches) for _ in range(self.accum)]

    def fetch(self) -> None:
        """Load the next step's micro-batches now, so that ``step()`` spends no time loading
        data (the harness fetches between timed steps and times that apart, ``data_ms``)."""
        self._fetched = self.next_inputs()

    def step(self, inputs: list[tuple[torch.Tensor, ...]] | None = None) -> None:
        """One optimiser step over ``inputs`` (or what ``fetch`` loaded, or the next ones)."""
        micro_batches = inputs or self._fetched or self.next_inputs()
        self._fetched = []
        self.opt.zero_grad(set_to_none=True)
        total = None
        for micro, (x, y) in enumerate(micro_batches):
            loss = self.micro_step(x, y, last=micro == self.accum - 1)
            # kept on the device: reading it (.cpu(), float) would synchronise mid-step; the
            # harness reads the last step's loss once, after timing
            total = loss if total is None else total + loss
        self.finish_step()
        self.last_loss = total

    def micro_step(self, x, y, *, last: bool) -> torch.Tensor:
        """One micro-batch's forward and backward, its gradients synchronised on the ``last``
        only; its share of the loss, detached. A model whose implementation steps by its own
        schedule (``Impl.steps``, a pipeline) runs it over the micro-batch."""
        if self._scheduled:  # the wrapped model's schedule runs forward and backward itself
            with self._autocast():
                return self.wrapped.train_step(x, y).detach()
        with contextlib.nullcontext() if last else self._skip_sync():
            with self._autocast():
                out = self._workload.forward(self.wrapped, x)
                loss = self._workload.compute_loss(out, y) / self.accum
            self._backward(loss)
        return loss.detach()

    def finish_step(self) -> None:
        """The optimiser's step over the micro-batches' gradients (clipped where asked)."""
        if self.clip is not None:
            clip_grad_norm(self.wrapped, self.clip)
        self.opt.step()


def _on(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` on ``device``, left as it is where it is there already: a model built under
    ``FakeTensorMode`` (the planner's, bench/plan/memory.py) has parameters ``.to`` cannot swap."""
    tensors = itertools.chain(model.parameters(), model.buffers())
    if all(t.device == device for t in tensors):
        return model
    return model.to(device)


def wrapped_model(
    point: PointRecord, env: DistEnv, group: dist.ProcessGroup | None, recipe: Recipe
) -> torch.nn.Module:
    """The point's plain model built (``recipe``'s seed, the same on every rank) or taken from
    the recipe, its blocks' matmuls float8 and its blocks checkpointed where the point says so,
    wrapped by its strategy's implementation, and compiled as its ``compile`` says (blocks
    before the wrapping, the wrapped model after)."""
    if point.batch_per_replica is None:
        raise ValueError(
            f"global batch {point.global_batch} does not split over {point.dp_size} replicas"
        )
    strategy = STRATEGIES[point.strategy]
    knobs = point.knobs
    plain = recipe.plain
    model = _on(
        plain if plain is not None else build_model(point.model, seed=recipe.seed), env.device
    )
    if converts(knobs["precision"]):  # torchtitan's order: float8, then checkpointing, then wrap
        convert_blocks(model, env.device)
    set_checkpointing(model, knobs["activation_checkpointing"])
    compile_blocks(model, knobs["compile"])  # compiled in place: wrappers find the same blocks
    options = {k.param: knobs[k.param] for k in strategy.knobs}
    wrapped = strategy.apply(point.impl, model, group=group, device=env.device, **options)
    scheduled = point.impl_facts.get("steps") == "schedule"
    return compile_wrapped(wrapped, knobs["compile"], scheduled=scheduled)


def _kinds_apart(params) -> list[dict]:
    """The parameters as AdamW's groups, DTensors apart from plain tensors. Tensor parallelism
    leaves what its plan does not split (norms, embeddings) plain, and one foreach kernel over a
    list that mixes the two raises in DTensor's dispatch; AdamW runs each group's lists apart,
    and foreach is its default on CUDA. The groups share every setting: the update is the same."""
    from torch.distributed.tensor import DTensor

    groups: dict[bool, list] = {}
    for p in params:
        groups.setdefault(isinstance(p, DTensor), []).append(p)
    return [{"params": g} for g in groups.values()]


def build_trainer(
    point: PointRecord,
    env: DistEnv,
    group: dist.ProcessGroup | None,
    recipe: Recipe | None = None,
) -> Trainer:
    """The point's model built, wrapped by its strategy's implementation, and fed its data (the
    recipe's batches, or this rank's share of the workload's dataset); no ``recipe``: the
    defaults'."""
    recipe = recipe or Recipe()
    wrapped = wrapped_model(point, env, group, recipe)
    opt = torch.optim.AdamW(
        _kinds_apart(wrapped.parameters()), lr=recipe.lr, foreach=recipe.foreach
    )
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    dp_rank, dp_size = data_parallel_coords(wrapped, rank, world)
    batch = point.batch_per_replica
    batches = recipe.batches
    if batches is None:
        # Enough samples for several batches per replica, so the sampler really wraps epochs.
        dataset = workload(point.model).dataset(batch * dp_size * 8, recipe.seed)
        batches = Batches(
            dataset,
            batch_size=batch,
            rank=dp_rank,
            world_size=dp_size,
            device=env.device,
            seed=recipe.seed,
        )
    return Trainer(
        point=point,
        device=env.device,
        wrapped=wrapped,
        opt=opt,
        batches=batches,
        dp_size=dp_size,
        accum=int(point.knobs["grad_accum"]),
        clip=recipe.clip,
    )
