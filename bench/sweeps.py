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
from parallel_kernels.strategies import STRATEGIES


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

    @property
    def id(self) -> str:
        """Folder-safe, unique within a run: ``wide_mlp-bucket_cap_mb=25-native``."""
        raw = (
            f"{self.model}-{self.sweep}={self.value:g}-{self.impl}"
            if isinstance(self.value, float)
            else f"{self.model}-{self.sweep}={self.value}-{self.impl}"
        )
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


def parse_options(items: list[str], known: dict, swept: str) -> dict:
    """``KEY=VALUE`` strategy options fixed for the whole sweep (numbers and true/false are
    converted); the swept option itself cannot be fixed."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r} is not KEY=VALUE")
        if key not in known:
            raise ValueError(f"unknown option {key!r} (known: {', '.join(known)})")
        if key == swept:
            raise ValueError(f"--option {key} is what the sweep varies: use --values")
        out[key] = _option_value(value)
    return out


def build_points(
    sweep_name: str,
    *,
    values: str | None = None,
    models: str | None = None,
    impls: str | None = None,
    options: list[str] | None = None,
) -> list[Point]:
    """Every point of a sweep, implementations interleaved per value (so drift hits both)."""
    if sweep_name not in SWEEPS:
        raise ValueError(f"unknown sweep {sweep_name!r} (known: {', '.join(SWEEPS)})")
    sweep = SWEEPS[sweep_name]
    if sweep.kind != "training":
        raise ValueError(f"sweep {sweep_name!r} has no training points")
    strategy = STRATEGIES[sweep.strategy]
    raw_values = parse_list(values, "value") if values else list(sweep.default_values)
    parsed = []
    for v in raw_values:
        try:
            parsed.append(sweep.parse(v))
        except ValueError as e:
            raise ValueError(f"bad value for --sweep {sweep.name}: {e}") from None
    fixed = parse_options(options or [], strategy.options, sweep.option)
    model_names = parse_list(models, "model", MODELS) if models else list(sweep.default_models)
    impl_names = (
        parse_list(impls, "implementation", strategy.impls)
        if impls
        else list(strategy.default_impls)
    )
    return [
        Point(
            sweep=sweep.name,
            model=m,
            value=v,
            impl=i,
            strategy=strategy.name,
            options={**fixed, sweep.option: v},
        )
        for m in model_names
        for v in parsed
        for i in impl_names
    ]
