"""One registry: strategy name -> its implementations, each a row with its facts.

An implementation's ``apply(model, *, group, device, **knobs) -> nn.Module`` takes a plain
model (``models.py``) already on ``device`` and returns what the training loop calls forward and
backward on and gives to the optimiser; the apply functions live with their kernels (``ddp.py``,
``fsdp.py``, ``mesh.py``). Everything the rest of the code base needs to know about an
implementation is a fact of its row (does it overlap communication with backward, whose
buckets, how it skips gradient synchronisation ...): code asks the row, never the name.
A strategy's knobs, with their parsers and defaults, are rows of ``knobs.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from parallel_kernels import ddp, fsdp, mesh, pipeline, pipeline_mesh
from parallel_kernels.accelerate_ddp import apply_accelerate
from parallel_kernels.fsdp_layout import zero_state_bytes
from parallel_kernels.knobs import Knob, strategy_knobs

ApplyFn = Callable[..., nn.Module]


def all_parameters(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach() for p in model.parameters()]


def state_dict_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter (and buffer) in full under the plain model's names, by PyTorch's
    distributed state-dict API: it gathers FSDP1's and FSDP2's shards and DTensors and strips
    DDP's and FSDP's wrapper prefixes (a collective on every rank; every rank gets the whole)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def wrapped_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """A wrapper that holds the plain model whole as ``.module`` (the reference DDP), or the
    plain model itself where a variant leaves it bare."""
    plain = getattr(model, "module", model)
    return {name: p.detach() for name, p in plain.named_parameters(remove_duplicate=False)}


def reference_fsdp_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """The reference FSDP's gathered flat parameters by name, and the parameters it left whole
    on the module (a collective on every rank)."""
    state = model.full_state_dict(rank0_only=False)
    whole = {n: p.detach() for n, p in model.module.named_parameters(remove_duplicate=False)}
    return {**whole, **state}


def pipeline_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """A pipeline's parameters in full by the plain model's names, every stage's gathered
    (``PipelinedModel``)."""
    return model.full_state()


def mesh_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """A (dp, tp) mesh's parameters in full by name, TP slices joined (``MeshParallel``)."""
    return model.full_state()


@dataclass(frozen=True, kw_only=True)
class Impl:
    """One implementation of a strategy and the facts about it that other code asks."""

    name: str
    apply: ApplyFn = field(repr=False)
    native: bool  # PyTorch's own implementation (True) or ours, built from primitives
    # Gradient communication runs while backward still computes (False: only after it).
    overlap: bool = True
    # Whose bucket assignment the data-parallel gradients follow: "ddp" (DistributedDataParallel's
    # ``_compute_bucket_assignment_by_size``), "reference" (``ddp.plan_buckets``), or None.
    buckets: str | None = None
    # How backward skips gradient synchronisation (gradient accumulation): the wrapper's method
    # "no_sync" (a context manager) or "set_requires_gradient_sync" (FSDP2's switch); None: it
    # cannot.
    skip_sync: str | None = None
    # The gradient reductions block computation until they finish (our FSDP waits on each).
    reduce_blocks: bool = False
    # How the trainer steps the wrapped model: "micro_batches" (forward and backward of each
    # micro-batch, bench/runner/train/step.py) or "schedule" (its own ``train_step`` runs a
    # pipeline schedule's forwards and backwards over the batch, parallel_kernels/pipeline.py).
    steps: str = "micro_batches"
    tp_layer: str | None = None  # the TP layers: "megatron" pairs or "naive" gathering columns
    # The wrapped model's parameters in full, under the plain model's names (a collective on
    # every rank): what the check against the plain model compares
    # (bench/runner/train/plain_check.py).
    full_state: Callable[[nn.Module], dict[str, torch.Tensor]] = field(
        default=state_dict_parameters, repr=False
    )
    # The implementation of the same strategy whose planned memory stands for this one's
    # (bench/plan/trackings.py: FSDP2's for FSDP1's, the same shards gathered unit by unit);
    # None: its own. ``memory_own``: a knob's values where it is tracked as itself all the
    # same, its memory being its own there.
    memory_as: str | None = None
    memory_own: dict[str, tuple] = field(default_factory=dict, hash=False)
    # Knob values where both are tracked, at which this implementation's figure less
    # ``memory_as``'s moves the stand-in's figure: what it holds over the other in any layout.
    memory_offset_at: dict[str, Any] = field(default_factory=dict, hash=False)
    # The fewest repeated blocks its planned memory is extrapolated from
    # (bench/plan/memory.py): where a model of one block is laid out unlike the rest.
    memory_blocks_from: int = 1

    def facts(self) -> dict[str, Any]:
        """The row as plain data (what a run folder records about the implementation)."""
        return {k: v for k, v in asdict(self).items() if k not in _CODE}


_CODE = ("apply", "full_state")  # the rows' functions: code, not facts a run folder records


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    description: str
    impls: Mapping[str, Impl]
    default_impls: tuple[str, ...]
    # The cost model's schedule of a step: "ddp", "fsdp" or "tp" (bench/model/schedule.py).
    schedule: str
    # Tensors every rank must hold bit-identically after a step; the harness checksums them to
    # catch a run whose replicas silently diverged.
    replicated: Callable[[nn.Module], list[torch.Tensor]] = all_parameters
    # Bytes of parameters, gradients and optimiser state one rank holds, by the ZeRO paper's
    # accounting: (params, world size, *, model, impl, tokens, **knobs) -> bytes, where model is
    # the plain model before the strategy rewrites it, impl the implementation's row and tokens
    # the activation rows of one rank's batch.
    expected_state_bytes: Callable[..., float] | None = None
    # Payload bytes per step as the backend records them (each collective's input), same
    # arguments.
    expected_comm_bytes: Callable[..., float] | None = None
    # The shape of the device mesh the strategy lays its ranks on, (world size, **knobs) ->
    # shape, or None without subgroups: its lines are the subgroups it will ask for (see
    # groups.prepare).
    mesh_shape: Callable[..., tuple[int, ...] | None] = lambda n, **_: None
    # Ranks of one tensor-parallel group, (**knobs) -> degree: a data-parallel replica spans
    # that many ranks (1 without tensor parallelism).
    tp_size: Callable[..., int] = lambda **_: 1
    # Ranks one data-parallel replica spans, (world size, **knobs) -> ranks, where more than
    # its tensor-parallel group (a pipeline's stages); None: ``tp_size``.
    replica_ranks: Callable[..., int] | None = None
    # Refuses, in one ValueError line, a layout the world or the model cannot run, before any
    # rank trains: (world size, the plain model on the meta device, **knobs) -> None.
    check_layout: Callable[..., None] = lambda n, model, **_: None

    @property
    def knobs(self) -> list[Knob]:
        return strategy_knobs(self.name)

    def impl(self, name: str) -> Impl:
        if name not in self.impls:
            raise KeyError(f"strategy {self.name!r} has no implementation {name!r}")
        return self.impls[name]

    def impl_knobs(self, impl: str, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments ``impl``'s apply function takes, from ``knobs`` (by keyword;
        missing ones at their defaults). A knob that only other implementations take must keep
        its default; a knob that is not the strategy's is refused."""
        own = {k.param: k for k in self.knobs}
        for name in knobs:
            if name not in own:
                raise TypeError(f"strategy {self.name} has no option {name!r}")
        out = {}
        for name, k in own.items():
            value = knobs.get(name, k.default)
            if k.impls is None or impl in k.impls:
                out[name] = value
            elif value != k.default:
                raise ValueError(
                    f"option {k.name}={value} exists only for {', '.join(k.impls)}, not {impl}"
                )
        return out

    def apply(
        self, impl: str, model: nn.Module, *, group, device: torch.device, **knobs: Any
    ) -> nn.Module:
        """``impl``'s apply function on ``model`` with the strategy's knobs (``impl_knobs``)."""
        row = self.impl(impl)
        return row.apply(model, group=group, device=device, **self.impl_knobs(impl, knobs))


def _by_name(*impls: Impl) -> dict[str, Impl]:
    return {i.name: i for i in impls}


def _ddp_state_bytes(psi: int, n: int, **_) -> float:
    return zero_state_bytes(psi, n, "NO_SHARD")


STRATEGIES: dict[str, Strategy] = {
    s.name: s
    for s in (
        Strategy(
            name="ddp",
            description="data parallel: replicated model, gradients all-reduced in buckets",
            impls=_by_name(
                Impl(
                    name="native",
                    apply=ddp.apply_native_ddp,
                    native=True,
                    buckets="ddp",
                    skip_sync="no_sync",
                ),
                Impl(
                    name="reference",
                    apply=ddp.apply_reference_ddp,
                    native=False,
                    buckets="reference",
                    skip_sync="no_sync",
                    full_state=wrapped_parameters,
                ),
                # Same buckets, all-reduced only after backward: the no-overlap baseline.
                Impl(
                    name="reference_nooverlap",
                    apply=partial(ddp.apply_reference_ddp, overlap=False),
                    native=False,
                    overlap=False,
                    buckets="reference",
                    skip_sync="no_sync",
                    full_state=wrapped_parameters,
                ),
            ),
            default_impls=("native", "reference"),
            schedule="ddp",
            expected_state_bytes=_ddp_state_bytes,
            expected_comm_bytes=ddp.expected_comm_bytes,
        ),
        Strategy(
            name="fsdp",
            description="sharded data parallel (ZeRO): parameters, gradients and optimiser "
            "state split across ranks",
            impls=_by_name(
                Impl(
                    name="native",
                    apply=fsdp.apply_native_fsdp,
                    native=True,
                    skip_sync="set_requires_gradient_sync",
                ),
                Impl(
                    name="reference",
                    apply=fsdp.apply_reference_fsdp,
                    native=False,
                    reduce_blocks=True,
                    full_state=reference_fsdp_parameters,
                ),
                Impl(
                    name="native_fsdp1",
                    apply=fsdp.apply_native_fsdp1,
                    native=True,
                    skip_sync="no_sync",
                    memory_as="native",
                    # Tracked as itself but for SHARD_GRAD_OP, which torch's FSDP1 cannot
                    # step under fake tensors: NO_SHARD reduces its flat gradient in place
                    # where FSDP2 keeps a gradient apart from the reduced one, and FULL_SHARD
                    # gathers a flat unit ahead in backward and holds it with the current one
                    # (docs/benchmarks.md, "Planned memory")
                    memory_own={"sharding_strategy": ("NO_SHARD", "FULL_SHARD", "HYBRID_SHARD")},
                    # Its SHARD_GRAD_OP holds over FSDP2's what its FULL_SHARD does (its flat
                    # units' buffers: docs/benchmarks.md, "Planned memory")
                    memory_offset_at={"sharding_strategy": "FULL_SHARD"},
                    # With one block there is no next flat unit to gather ahead in backward,
                    # and it shows in FSDP1's parameters, where FSDP2's shows in the temporaries
                    # that tell a move between two trackings: so FSDP1 is extrapolated from two
                    # blocks (docs/benchmarks.md, "Planned memory")
                    memory_blocks_from=2,
                ),
            ),
            default_impls=("native", "native_fsdp1", "reference"),
            schedule="fsdp",
            replicated=fsdp.fsdp_full_parameters,
            expected_state_bytes=fsdp.expected_state_bytes,
            expected_comm_bytes=fsdp.expected_comm_bytes,
            mesh_shape=fsdp.mesh_shape,
        ),
        Strategy(
            name="accelerate",
            description="data parallel prepared by Hugging Face Accelerate (optional extra), "
            "next to plain DDP with the same autocast",
            impls=_by_name(
                Impl(
                    name="native",
                    apply=ddp.apply_ddp_autocast,
                    native=True,
                    buckets="ddp",
                    skip_sync="no_sync",
                ),
                Impl(
                    name="accelerate",
                    apply=apply_accelerate,
                    native=True,
                    buckets="ddp",
                    skip_sync="no_sync",
                ),
            ),
            default_impls=("native", "accelerate"),
            schedule="ddp",
            expected_state_bytes=_ddp_state_bytes,
            expected_comm_bytes=lambda psi, n, **_: 4 * psi,  # fp32 gradients, all-reduced once
        ),
        Strategy(
            name="tp",
            description="tensor parallel (Megatron column/row layers) over a (dp, tp) mesh, "
            "data parallel (DDP, or FSDP with dp_shard) over the rest of the ranks",
            impls=_by_name(
                Impl(
                    name="native",
                    apply=mesh.apply_native_tp,
                    native=True,
                    buckets="ddp",
                    tp_layer="megatron",
                    full_state=mesh_parameters,
                    skip_sync="no_sync",  # MeshParallel.no_sync: DDP's, or FSDP2's switch
                ),
                # With dp_shard its data-parallel ranks run ReferenceFSDP, which waits on
                # each unit's reduction (reduce_blocks).
                Impl(
                    name="reference",
                    apply=mesh.apply_reference_tp,
                    native=False,
                    buckets="reference",
                    reduce_blocks=True,
                    tp_layer="megatron",
                    full_state=mesh_parameters,
                ),
                # The seed's column layer that all-gathers its output: what pairing saves.
                Impl(
                    name="naive",
                    apply=partial(mesh.apply_reference_tp, layer="naive"),
                    native=False,
                    buckets="reference",
                    reduce_blocks=True,
                    tp_layer="naive",
                    full_state=mesh_parameters,
                ),
            ),
            default_impls=("native", "reference", "naive"),
            schedule="tp",
            replicated=lambda m: list(m.full_state().values()),
            expected_state_bytes=mesh.expected_state_bytes,
            expected_comm_bytes=mesh.expected_comm_bytes,
            mesh_shape=mesh.mesh_shape,
            tp_size=lambda tp_degree=1, **_: tp_degree,
        ),
        Strategy(
            name="pp",
            description="pipeline parallel: the model's blocks cut into stages over pp_degree "
            "ranks (one or two a rank), stepped by a schedule (GPipe, 1F1B, interleaved, "
            "zero bubble) over pp_microbatches micro-batches; the other ranks its replicas",
            impls=_by_name(
                Impl(
                    name="native",
                    apply=pipeline.apply_pipeline,
                    native=True,
                    overlap=False,
                    full_state=pipeline_parameters,
                    steps="schedule",
                ),
                Impl(
                    name="reference",
                    apply=partial(pipeline.apply_pipeline, native=False),
                    native=False,
                    overlap=False,
                    full_state=pipeline_parameters,
                    steps="schedule",
                ),
            ),
            default_impls=("native", "reference"),
            schedule="pp",
            replicated=lambda m: [],  # every rank holds its own stages: nothing on every rank
            mesh_shape=pipeline_mesh.mesh_shape,
            tp_size=lambda tp_degree=1, **_: tp_degree,
            # a data-parallel replica is one pipeline (of TP groups)
            replica_ranks=pipeline_mesh.replica_ranks,
            check_layout=pipeline.check_layout,
        ),
    )
}


def strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
    return STRATEGIES[name]
