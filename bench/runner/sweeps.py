"""One registry: sweep name -> what it varies, its default values, and the points it yields.

A training sweep varies one option of one strategy (see ``parallel_kernels/strategies.py``)
over values, for each model and implementation. Values are validated here, before any process
group exists, so bad input fails fast with one line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parallel_kernels.fsdp import STRATEGIES as SHARDING_STRATEGIES
from parallel_kernels.models import MODELS
from parallel_kernels.strategies import COMM_HOOKS, STRATEGIES


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} must be a positive number")
    return value


def sharding_strategy(text: str) -> str:
    name = text.strip().upper()
    if name not in SHARDING_STRATEGIES:
        raise ValueError(f"{text!r} is not a sharding strategy ({', '.join(SHARDING_STRATEGIES)})")
    return name


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{text!r} must be a positive integer")
    return value


def comm_hook(text: str) -> str:
    value = text.strip().lower()
    if value not in COMM_HOOKS:
        raise ValueError(f"{text!r} is not a comm hook ({', '.join(COMM_HOOKS)})")
    return value


def precision(text: str) -> str:
    value = text.strip().lower()
    if value not in ("fp32", "bf16", "fp16"):
        raise ValueError(f"{text!r} is not a precision (fp32, bf16, fp16)")
    return value


def on_off(text: str) -> str:
    value = text.strip().lower()
    if value not in ("off", "on"):
        raise ValueError(f"{text!r} is not off or on")
    return value


def _tp_degree(degree: int, world: int) -> dict[str, Any]:
    if world % degree:
        raise ValueError(f"TP degree {degree} does not divide the world size {world}")
    return {"tp_degree": degree}


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
    """The (tp_degree, dp_shard) options of a layout: pure DP, pure TP, or DDP/FSDP x TP on a
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
    kind: str = "training"  # "training": points of a strategy; "collective": message sizes
    strategy: str = ""
    option: str = ""  # the strategy option that the sweep varies
    default_values: tuple[str, ...] = ()
    parse: Callable[[str], Any] = str
    default_models: tuple[str, ...] = ()
    # (value, world size) -> the options a value sets; raises ValueError when the value cannot
    # run at that world size. Default: {option: value}. Default values that cannot run at the
    # world size are left out (TP degrees up to the world size).
    expand: Callable[[Any, int], dict[str, Any]] | None = None
    sets: tuple[str, ...] = ()  # options the sweep sets (default: option): --option cannot
    # A knob of the training step (harness.TRAINING_KNOBS), not a strategy option: its value
    # goes to Point.train, and --strategy picks the strategy (default: ``strategy`` or ddp).
    knob: bool = False
    tradeoff: bool = False  # the report draws time against memory, bytes and loss per point

    def options_for(self, value: Any, world: int | None) -> dict[str, Any]:
        if self.expand is None:
            return {self.option: value}
        if world is None:
            raise ValueError(f"the {self.name} sweep needs the world size")
        return self.expand(value, world)

    def fits(self, value: Any, world: int | None) -> bool:
        try:
            self.options_for(value, world)
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
            strategy="ddp",
            option="bucket_cap_mb",
            default_values=("0.25", "1", "5", "25", "100"),
            parse=positive_float,
            default_models=("mlp", "wide_mlp"),
        ),
        Sweep(
            name="comm_hook",
            description="DDP gradient compression: none, fp16, bf16 (our cast where PyTorch's "
            "hook refuses gloo), PowerSGD of rank 1 or 2 (powersgd, powersgd2; native)",
            strategy="ddp",
            option="comm_hook",
            default_values=COMM_HOOKS,
            parse=comm_hook,
            default_models=("wide_mlp",),
            tradeoff=True,
        ),
        Sweep(
            name="sharding_strategy",
            description="FSDP sharding strategy (ZeRO-3, ZeRO-2, no sharding, hybrid), native "
            "fully_shard and reference",
            strategy="fsdp",
            option="sharding_strategy",
            default_values=("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"),
            parse=sharding_strategy,
            default_models=("transformer",),
        ),
        Sweep(
            name="tp_degree",
            description="tensor-parallel degree (1, 2, 4 up to the world size; the rest of the "
            "ranks data parallel), native DTensor, Megatron reference and the naive layer",
            strategy="tp",
            option="tp_degree",
            default_values=("1", "2", "4"),
            parse=positive_int,
            default_models=("wide_mlp", "transformer"),
            expand=_tp_degree,
        ),
        Sweep(
            name="mesh",
            description="layouts of the ranks: pure data parallel (dp), pure tensor parallel "
            "(tp), DDP x TP and FSDP x TP on a 2-D mesh (ddp_tp, fsdp_tp; 4 ranks or more)",
            strategy="tp",
            option="mesh",
            default_values=MESH_LAYOUTS,
            parse=mesh_layout,
            default_models=("transformer",),
            expand=_mesh,
            sets=("tp_degree", "dp_shard"),
        ),
        Sweep(
            name="grad_accum",
            description="gradient accumulation: 1, 2, 4, 8 micro-batches per optimiser step, "
            "gradients synchronised on the last only (no_sync); --strategy ddp (default)",
            option="grad_accum",
            default_values=("1", "2", "4", "8"),
            parse=positive_int,
            default_models=("wide_mlp",),
            knob=True,
            tradeoff=True,
        ),
        Sweep(
            name="activation_checkpointing",
            description="activation checkpointing per transformer block, off or on: peak "
            "memory saved against compute added; --strategy ddp (default) or fsdp",
            option="activation_checkpointing",
            default_values=("off", "on"),
            parse=on_off,
            default_models=("transformer",),
            knob=True,
            tradeoff=True,
        ),
        Sweep(
            name="precision",
            description="training precision, fp32 or bf16 (fp16 on request): autocast for DDP "
            "and TP, FSDP's mixed-precision policy for FSDP; --strategy ddp (default)",
            option="precision",
            default_values=("fp32", "bf16"),
            parse=precision,
            default_models=("wide_mlp",),
            knob=True,
            tradeoff=True,
        ),
        Sweep(
            name="world_size",
            description="world sizes 1, 2, 4, ... up to the launched one, inside one launch, "
            "at a fixed per-rank batch (weak scaling) and a fixed global batch (strong); "
            "--strategy picks ddp (default), fsdp or tp",
            kind="scaling",
            option="world_size",
            parse=positive_int,
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


@dataclass(frozen=True, kw_only=True)
class Point:
    sweep: str
    model: str
    value: Any
    impl: str
    strategy: str
    options: dict[str, Any] = field(default_factory=dict)
    # World-size sweeps: the point runs on the first ``world`` ranks (None: all of them), at a
    # fixed per-replica batch ("weak" scaling) or a fixed global batch ("strong").
    world: int | None = None
    scaling: str | None = None
    global_batch: int | None = None
    train: dict[str, Any] = field(default_factory=dict)  # knobs of the training step

    @property
    def id(self) -> str:
        """Folder-safe, unique within a run: ``wide_mlp-bucket_cap_mb=25-native``."""
        value = f"{self.value:g}" if isinstance(self.value, float) else f"{self.value}"
        # a world-size point names its scaling mode and strategy (a run may hold several)
        scaling = f"-{self.scaling}-{self.strategy}" if self.scaling else ""
        raw = f"{self.model}-{self.sweep}={value}{scaling}-{self.impl}"
        return re.sub(r"[^A-Za-z0-9_.=+-]", "_", raw)


def parse_list(text: str | None, what: str, allowed: dict | None = None) -> list[str]:
    """Split a comma list; check names against ``allowed`` when given."""
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    if not items:
        raise ValueError(f"empty {what} list")
    if allowed is not None:
        unknown = [i for i in items if i not in allowed]
        if unknown:
            raise ValueError(f"unknown {what} {', '.join(unknown)} (known: {', '.join(allowed)})")
    return items


def _option_value(text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_options(items: list[str], known: dict, swept: tuple[str, ...]) -> dict:
    """``KEY=VALUE`` strategy options fixed for the whole sweep (numbers and true/false are
    converted); the options the sweep sets cannot be fixed."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r} is not KEY=VALUE")
        if key not in known:
            raise ValueError(f"unknown option {key!r} (known: {', '.join(known)})")
        if key in swept:
            raise ValueError(f"--option {key} is what the sweep varies: use --values")
        out[key] = _option_value(value)
    return out


SCALINGS = ("weak", "strong")


def _world_size_points(
    sweep: Sweep,
    *,
    values: str | None,
    models: str | None,
    impls: str | None,
    options: list[str] | None,
    world_size: int | None,
    strategy_name: str | None,
    scaling: str | None,
    batch_size: int,
) -> list[Point]:
    """Points at world sizes up to the launched one. Strong scaling keeps one global batch,
    --batch-size x the largest world size (one replica per rank: --batch-size each at the
    largest size), split over each point's data-parallel replicas."""
    if world_size is None:
        raise ValueError("the world_size sweep needs the world size")
    strategy = _strategy(strategy_name or "ddp")
    if values:
        sizes = []
        for v in parse_list(values, "value"):
            try:
                sizes.append(positive_int(v))
            except ValueError as e:
                raise ValueError(f"bad value for --sweep world_size: {e}") from None
        too_big = [k for k in sizes if k > world_size]
        if too_big:
            raise ValueError(
                f"world size {too_big[0]} is larger than the {world_size} ranks launched"
            )
    else:
        sizes = [1 << i for i in range(world_size.bit_length()) if 1 << i <= world_size]
    scalings = parse_list(scaling, "scaling", dict.fromkeys(SCALINGS)) if scaling else SCALINGS
    fixed = parse_options(options or [], strategy.options, ())
    model_names, impl_names = _models_and_impls(sweep, strategy, models, impls)
    global_batch = batch_size * max(sizes)
    return [
        Point(
            sweep=sweep.name,
            model=m,
            value=k,
            impl=i,
            strategy=strategy.name,
            options=dict(fixed),
            world=k,
            scaling=sc,
            global_batch=global_batch if sc == "strong" else None,
        )
        for m in model_names
        for sc in scalings
        for k in sizes
        for i in impl_names
    ]


def _models_and_impls(sweep: Sweep, strategy, models: str | None, impls: str | None):
    """The models and implementations asked for, or the sweep's and the strategy's defaults."""
    model_names = parse_list(models, "model", MODELS) if models else list(sweep.default_models)
    impl_names = (
        parse_list(impls, "implementation", strategy.impls)
        if impls
        else list(strategy.default_impls)
    )
    return model_names, impl_names


def _strategy(name: str):
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
    return STRATEGIES[name]


def build_points(
    sweep_name: str,
    *,
    values: str | None = None,
    models: str | None = None,
    impls: str | None = None,
    options: list[str] | None = None,
    world_size: int | None = None,
    strategy: str | None = None,
    scaling: str | None = None,
    batch_size: int = 64,
) -> list[Point]:
    """Every point of a sweep, implementations interleaved per value (so drift hits both).
    ``world_size``: what the sweep checks its values against (TP degrees, mesh layouts, world
    sizes). ``strategy``, ``scaling``: the world-size sweep's choices."""
    if sweep_name not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep_name!r} (known: {', '.join(SWEEPS)})")
    sweep = SWEEPS[sweep_name]
    if sweep.kind == "scaling":
        return _world_size_points(
            sweep,
            values=values,
            models=models,
            impls=impls,
            options=options,
            world_size=world_size,
            strategy_name=strategy,
            scaling=scaling,
            batch_size=batch_size,
        )
    if strategy is not None and not sweep.knob:
        measures = sweep.strategy or "collectives"
        raise ValueError(
            f"--strategy is for the world_size sweep and the training-knob sweeps; "
            f"{sweep_name} measures {measures}"
        )
    if scaling is not None:
        raise ValueError("--scaling is for the world_size sweep")
    if sweep.kind != "training":
        raise ValueError(f"sweep {sweep_name!r} has no training points")
    strategy = _strategy(strategy or sweep.strategy or "ddp")
    raw_values = parse_list(values, "value") if values else list(sweep.default_values)
    parsed = []
    for v in raw_values:
        try:
            parsed.append(sweep.parse(v))
        except ValueError as e:
            raise ValueError(f"bad value for --sweep {sweep.name}: {e}") from None
    if not values and sweep.expand is not None:
        parsed = [v for v in parsed if sweep.fits(v, world_size)]
    set_by_value = []
    for v in parsed:
        try:
            set_by_value.append(sweep.options_for(v, world_size))
        except ValueError as e:
            raise ValueError(f"bad value for --sweep {sweep.name}: {e}") from None
    fixed = parse_options(options or [], strategy.options, sweep.sets or (sweep.option,))
    if sweep.knob:  # the value sets a knob of the step, not an option of the strategy
        set_by_value = [{} for _ in parsed]
    model_names, impl_names = _models_and_impls(sweep, strategy, models, impls)
    return [
        Point(
            sweep=sweep.name,
            model=m,
            value=v,
            impl=i,
            strategy=strategy.name,
            options={**fixed, **opts},
            train={sweep.option: v} if sweep.knob else {},
        )
        for m in model_names
        for v, opts in zip(parsed, set_by_value, strict=True)
        for i in impl_names
    ]
