"""One registry: sweep name -> what it varies, its default values, and the models it runs.

A training sweep varies one knob (a row of ``parallel_kernels/knobs.py``) over values, for each
model and implementation; a grid (``--sweep a,b``) varies two. A knob of a strategy fixes the
strategy; a knob of the training step runs under ``--strategy`` (default ddp). Values are
parsed by the knob's row here, before any process group exists, so bad input fails fast with
one line. ``points.py`` turns a sweep into resolved points.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parallel_kernels.knobs import COMM_HOOKS, KNOBS, PP_SCHEDULES, positive_int


def _tp_degree(degree: int, world: int) -> dict[str, Any]:
    if world % degree:
        raise ValueError(f"TP degree {degree} does not divide the world size {world}")
    return {"tp_degree": degree}


def _pp_degree(degree: int | None, world: int) -> dict[str, Any]:
    if degree is not None and world % degree:
        raise ValueError(f"PP degree {degree} does not divide the world size {world}")
    return {"pp_degree": degree}


MESH_LAYOUTS = ("dp", "tp", "ddp_tp", "fsdp_tp")


def mesh_layout(text: str) -> str:
    name = text.strip().lower()
    m = re.fullmatch(r"(dp|tp|ddp_tp|fsdp_tp)(\d*)", name)
    if not m or (m.group(2) and m.group(1) in ("dp", "tp")):
        raise ValueError(
            f"{text!r} is not a mesh layout (dp, tp, ddp_tp, fsdp_tp; the last two may name "
            "their TP degree, e.g. fsdp_tp2)"
        )
    return name


def _mesh(layout: str, world: int) -> dict[str, Any]:
    """The (tp_degree, dp_shard) knobs of a layout: pure DP, pure TP, or DDP/FSDP x TP on a
    2-D mesh (TP degree 2 unless named)."""
    kind = layout.rstrip("0123456789")
    if kind == "dp":
        return {"tp_degree": 1, "dp_shard": False}
    if kind == "tp":
        return {"tp_degree": world, "dp_shard": False}
    degree = int(layout[len(kind) :] or 2)
    if degree < 2 or world % degree or world // degree < 2:
        raise ValueError(
            f"mesh {layout} needs a TP degree of 2 or more that divides the world size "
            f"{world} into 2 or more data-parallel replicas"
        )
    return {"tp_degree": degree, "dp_shard": kind == "fsdp_tp"}


@dataclass(frozen=True, kw_only=True)
class Sweep:
    name: str
    description: str
    kind: str = "training"  # "training": points of a strategy; "scaling"; "collective"
    knob: str = ""  # the knob it varies (a row of KNOBS); "" for a sweep with its own axis
    strategy: str = ""  # the strategy it measures (a step knob's sweep: the default one)
    default_values: tuple[str, ...] = ()
    # A sweep with its own axis (mesh layouts): how a value is read, and the knobs it sets.
    axis_parse: Callable[[str], Any] | None = None
    sets: tuple[str, ...] = ()
    default_models: tuple[str, ...] = ()
    # (value, world size) -> the knobs a value sets; raises ValueError when the value cannot
    # run at that world size. Default: {knob: value}. Default values that cannot run at the
    # world size are left out (TP degrees up to the world size).
    expand: Callable[[Any, int], dict[str, Any]] | None = None
    tradeoff: bool = False  # the report draws time against memory, bytes and loss per point

    @property
    def knobs_set(self) -> tuple[str, ...]:
        """The keywords of the knobs the sweep's values set (what ``--option`` may not fix)."""
        return self.sets or ((KNOBS[self.knob].param,) if self.knob else ())

    @property
    def picks_strategy(self) -> bool:
        """Its knob belongs to the training step: ``--strategy`` says which strategy runs."""
        return bool(self.knob) and KNOBS[self.knob].of_step

    def parse(self, text: str) -> Any:
        return self.axis_parse(text) if self.axis_parse else KNOBS[self.knob].parse(text)

    def knobs_for(self, value: Any, world: int | None) -> dict[str, Any]:
        if self.expand is None:
            return {KNOBS[self.knob].param: value}
        if world is None:
            raise ValueError(f"the {self.name} sweep needs the world size")
        return self.expand(value, world)

    def fits(self, value: Any, world: int | None) -> bool:
        try:
            self.knobs_for(value, world)
        except ValueError:
            return False
        return True


SWEEPS: dict[str, Sweep] = {
    s.name: s
    for s in (
        Sweep(
            name="bucket_cap_mb",
            description="DDP gradient bucket size in MB (native DistributedDataParallel and "
            "reference DDP)",
            knob="bucket_cap_mb",
            strategy="ddp",
            default_values=("0.25", "1", "5", "25", "100"),
            default_models=("mlp", "wide_mlp"),
        ),
        Sweep(
            name="comm_hook",
            description="DDP gradient compression: none, fp16, bf16 (our cast where PyTorch's "
            "hook refuses gloo), PowerSGD of rank 1 or 2 (powersgd, powersgd2; native)",
            knob="comm_hook",
            strategy="ddp",
            default_values=COMM_HOOKS,
            default_models=("wide_mlp",),
            tradeoff=True,
        ),
        Sweep(
            name="sharding_strategy",
            description="FSDP sharding strategy (ZeRO-3, ZeRO-2, no sharding, hybrid), native "
            "fully_shard and reference",
            knob="sharding_strategy",
            strategy="fsdp",
            default_values=("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"),
            default_models=("transformer",),
        ),
        Sweep(
            name="tp_degree",
            description="tensor-parallel degree (1, 2, 4 up to the world size; the rest of the "
            "ranks data parallel), native DTensor, Megatron reference and the naive layer",
            knob="tp_degree",
            strategy="tp",
            default_values=("1", "2", "4"),
            default_models=("wide_mlp", "transformer"),
            expand=_tp_degree,
        ),
        Sweep(
            name="mesh",
            description="layouts of the ranks: pure data parallel (dp), pure tensor parallel "
            "(tp), DDP x TP and FSDP x TP on a 2-D mesh (ddp_tp, fsdp_tp; 4 ranks or more)",
            strategy="tp",
            default_values=MESH_LAYOUTS,
            axis_parse=mesh_layout,
            sets=("tp_degree", "dp_shard"),
            default_models=("transformer",),
            expand=_mesh,
        ),
        Sweep(
            name="pp_schedule",
            description="pipeline schedule: GPipe and 1F1B (one stage a rank; torch.distributed."
            "pipelining's and the reference from point-to-point sends), interleaved 1F1B, "
            "interleaved zero bubble, ZBV and DualPipeV (two stages a rank, torch's only) where "
            "the installed torch has them; models whose workload says where its blocks are",
            knob="pp_schedule",
            strategy="pp",
            default_values=PP_SCHEDULES,
            default_models=("transformer",),
        ),
        Sweep(
            name="pp_microbatches",
            description="micro-batches a pipeline step splits its batch into (2, 4, 8): the "
            "schedule's bubble against each micro-batch's fixed cost",
            knob="pp_microbatches",
            strategy="pp",
            default_values=("2", "4", "8"),
            default_models=("transformer",),
        ),
        Sweep(
            name="pp_degree",
            description="ranks of one pipeline (1, 2, 4 up to the world size; 1: data "
            "parallel alone), the rest of the ranks its data-parallel replicas, each stage's "
            "gradients averaged over them",
            knob="pp_degree",
            strategy="pp",
            default_values=("1", "2", "4"),
            default_models=("transformer",),
            expand=_pp_degree,
        ),
        Sweep(
            name="grad_accum",
            description="gradient accumulation: 1, 2, 4, 8 micro-batches per optimiser step, "
            "gradients synchronised on the last only (no_sync); --strategy ddp (default)",
            knob="grad_accum",
            default_values=("1", "2", "4", "8"),
            default_models=("wide_mlp",),
            tradeoff=True,
        ),
        Sweep(
            name="activation_checkpointing",
            description="activation checkpointing per transformer block: off, full, "
            "selective:op (matmul and attention outputs kept), selective:layer=2 (every "
            "second block): peak memory saved against compute added; --strategy ddp (default) "
            "or fsdp",
            knob="activation_checkpointing",
            default_values=("off", "full", "selective:op", "selective:layer=2"),
            default_models=("transformer",),
            tradeoff=True,
        ),
        Sweep(
            name="compile",
            description="torch.compile of the step (inductor): off, blocks (each block), "
            "model (the wrapped model): step time after compilation against eager, compile "
            "time apart; --strategy ddp (default) or another",
            knob="compile",
            default_values=("off", "blocks", "model"),
            default_models=("llama:tiny",),
        ),
        Sweep(
            name="precision",
            description="training precision, fp32 or bf16 (fp16 on request): autocast for DDP "
            "and TP, FSDP's mixed-precision policy for FSDP; --strategy ddp (default)",
            knob="precision",
            default_values=("fp32", "bf16"),
            default_models=("wide_mlp",),
            tradeoff=True,
        ),
        Sweep(
            name="world_size",
            description="world sizes 1, 2, 4, ... up to the launched one, inside one launch, "
            "at a fixed per-rank batch (weak scaling) and a fixed global batch (strong); "
            "--strategy picks ddp (default), fsdp or tp",
            kind="scaling",
            axis_parse=positive_int,
            default_models=("wide_mlp",),
        ),
        Sweep(
            name="message_size",
            description="every collective, native and reference, over message sizes "
            "(nccl-tests flags -b -e -f -n -w -c -d)",
            kind="collective",
        ),
    )
}


def sweep_names(text: str) -> list[str]:
    """The sweeps of ``--sweep``: one name, or two joined by a comma (a grid)."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in SWEEPS]
    if not names or unknown:
        names_given = ", ".join(map(repr, unknown)) or repr(text)
        raise ValueError(f"unknown sweep {names_given} (known: {', '.join(SWEEPS)})")
    if len(names) > 2:
        raise ValueError(f"a grid crosses two sweeps, not {len(names)}: {text}")
    if len(names) == 2:
        if names[0] == names[1]:
            raise ValueError(f"a grid names {names[0]} twice")
        for n in names:
            if SWEEPS[n].kind != "training":
                raise ValueError(f"a grid crosses training sweeps; {n} is a {SWEEPS[n].kind} sweep")
        a, b = (set(SWEEPS[n].knobs_set) for n in names)
        if a & b:
            raise ValueError(f"a grid sets the knob {', '.join(sorted(a & b))} twice")
    return names


_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from ``1024``, ``1K``, ``64M``, ``1G`` (binary multiples, as nccl-tests reads
    them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"size {text!r} is not a number of bytes (e.g. 1024, 1K, 64M, 1G)")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def message_sizes(min_bytes: str, max_bytes: str, factor: str) -> list[int]:
    """Sizes from min to max (both included when reached), multiplying by ``factor``."""
    lo, hi = parse_size(min_bytes), parse_size(max_bytes)
    try:
        f = int(factor)
    except ValueError:
        raise ValueError(f"factor {factor!r} is not an integer") from None
    if lo < 1:
        raise ValueError("min bytes must be at least 1")
    if lo > hi:
        raise ValueError(f"min bytes {lo} is larger than max bytes {hi}")
    if f < 2:
        raise ValueError(f"factor must be at least 2, got {f}")
    sizes = []
    size = lo
    while size <= hi:
        sizes.append(size)
        size *= f
    return sizes


def parse_list(
    text: str | None, what: str, allowed: dict | None = None, flag: str = ""
) -> list[str]:
    """Split a comma list; check names against ``allowed`` when given. Each item makes its own
    points, so one given twice is refused (``flag``: the flag the message names)."""
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not items:
        raise ValueError(f"empty {what} list")
    if allowed is not None:
        unknown = [i for i in items if i not in allowed]
        if unknown:
            raise ValueError(f"unknown {what} {', '.join(unknown)} (known: {', '.join(allowed)})")
    distinct(flag or f"the {what} list", items, items)
    return items


def distinct(flag: str, texts: list[str], values: list) -> None:
    """Refuse a value given twice, as text or as two texts that parse to one value (``25`` and
    ``25.0``, ``FULL_SHARD`` and ``full_shard``): both would make the same points, under one id.
    ``values``: what each text parses to (hashable), in the order of ``texts``."""
    first: dict = {}
    for text, value in zip(texts, values, strict=True):
        if value in first:
            same = "" if first[value] == text else f" ({first[value]} and {text} are one value)"
            raise ValueError(f"{flag}: {text} is given twice{same}")
        first[value] = text
