"""A sweep -> its points, each resolved once into a frozen record (``bench.runfolder.points``).

Resolving reads the tables (sweeps, strategies with their implementation rows, knobs, models)
and writes down everything a point is: the knobs with their values and defaults, the
implementation's facts, the world and batch, and the inputs of its analytical figures, taken
from the plain model's shapes on the meta device. The harness runs a record; the reading side
reads records from the run folder and never these tables.

A run's configuration reaches a point in two typed steps: ``SweepChoices`` (the strategy,
models, implementations, fixed knobs and ``VisitSettings`` every point of the sweep shares),
then a ``PointRequest`` per point, which ``resolve_point`` turns into its record.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.runfolder.points import PointRecord
from bench.runner.configure.config import DEFAULTS, RunConfig
from bench.runner.configure.sweeps import SWEEPS, Sweep, distinct, parse_list, sweep_names
from parallel_kernels.float8 import converts
from parallel_kernels.fsdp_layout import fsdp_units, unit_params
from parallel_kernels.knobs import KNOBS, by_param, positive_int, step_knobs
from parallel_kernels.mesh import local_layout
from parallel_kernels.models import grad_bytes, param_count, workload
from parallel_kernels.strategies import Strategy
from parallel_kernels.strategies import strategy as strategy_row
from parallel_kernels.tensor_parallel import comm_calls, tp_plan
from parallel_kernels.workload import stamp

SCALINGS = ("weak", "strong")


class PointRefused(ValueError):
    """A point whose layout its world or model cannot run (``Strategy.check_layout``)."""


def _fmt(value: Any) -> str:
    """A value as an id writes it: a float short (``25``, ``0.25``) where that reads back as
    the same number, else in full, so that two values never share an id."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return f"{value}"


def point_id(model: str, values: dict[str, Any], impl: str, suffix: str = "") -> str:
    """Folder-safe, unique within a run: ``wide_mlp-bucket_cap_mb=25-native``; a grid names
    both values, a world-size point its scaling and strategy (``suffix``)."""
    axes = "-".join(f"{axis}={_fmt(v)}" for axis, v in values.items())
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", f"{model}-{axes}{suffix}-{impl}")


@functools.cache
def _twin(model: str) -> torch.nn.Module:
    """The plain model on the meta device: its shapes, without memory. Built once per model
    and only read (the figures never change it), whatever the number of points."""
    wl = workload(model)
    with torch.device("meta"):
        return stamp(wl.build(), wl)


def _unique_numel(params: list) -> int:
    """Elements of a unit's parameters, a tied one (a head sharing its embedding's weight)
    counted once: it is one tensor, stored and moved once."""
    return sum({id(p): p.numel() for _, _, p in params}.values())


def check_workload(name: str) -> None:
    """Refuse, in one line and before any rank trains, a model that does not resolve or whose
    facts name what its model lacks (a TP plan's module, FSDP's unit classes). A fact it does
    not give at all is no error here: the points that need it are error rows naming it."""
    wl, twin = workload(name), _twin(name)
    if wl.fsdp_units:
        fsdp_units(twin)
    if wl.tp_plan is not None:
        tp_plan(twin)


def _figures(row: Strategy, impl, model: str, world: int, batch: int | None, knobs: dict) -> dict:
    """The analytical figures' inputs and values, from the plain model's shapes: one layout's
    whatever its step's knobs, made once (a plan resolves hundreds) and copied out."""
    options = tuple((k.param, knobs[k.param]) for k in row.knobs)
    return copy.deepcopy(_layout_figures(row.name, impl.name, model, world, batch, options))


@functools.lru_cache(maxsize=256)
def _layout_figures(row: str, impl: str, model: str, world: int, batch: int | None, options: tuple):
    strategy = strategy_row(row)
    impl = strategy.impl(impl)
    spec, twin = workload(model), _twin(model)
    psi = param_count(twin)
    tokens = (batch or 0) * spec.tokens_per_sample
    units = unit_params(twin, fsdp_units(twin))
    if units[-1][0] is twin:  # the root's own parameters are gathered first, reduced last
        units = [units[-1], *units[:-1]]
    out: dict[str, Any] = {
        "params": psi,
        "grad_bytes": grad_bytes(twin),
        "tokens_per_sample": spec.tokens_per_sample,
        "fsdp_unit_bytes": [4 * _unique_numel(params) for _, params in units],
        # The data-parallel gradients of a TP point are bucketed as DDP does by default.
        "dp_bucket_cap_mb": by_param("bucket_cap_mb").default,
    }
    options, plain = dict(options), dict(model=twin, impl=impl, tokens=tokens)
    for name, fn in (
        ("comm_bytes_expected", strategy.expected_comm_bytes),
        ("state_bytes_expected", strategy.expected_state_bytes),
    ):
        try:
            out[name] = fn(psi, world, **plain, **options) if fn else None
        except ValueError:  # a layout that cannot run: the point's apply says why
            out[name] = None
    out["tp_comm_calls"] = None
    if impl.tp_layer is not None:
        try:
            dims, plan, _ = local_layout(
                twin, impl.tp_layer, world, strategy.tp_size(**options), False
            )
            out["tp_comm_calls"] = [list(c) for c in comm_calls(twin, plan, tokens, dims.tp)]
        except ValueError:
            pass
    return out


def _settings(row: Strategy, knobs: dict[str, Any]) -> tuple[dict, dict, str | None]:
    """(every knob's setting, every knob's default, the autocast precision or None): the
    strategy's and the step's knobs at their defaults but for those set. A precision goes to
    the strategy's own mixed-precision policy where it has one, else to autocast."""
    own = [*row.knobs, *step_knobs()]
    defaults = {k.param: k.default for k in own}
    settings = dict(defaults)
    for name, value in knobs.items():
        if name not in defaults:
            raise ValueError(f"strategy {row.name} has no knob {name!r}")
        settings[name] = value
    autocast = None
    precision = settings["precision"]
    if precision != defaults["precision"] and not converts(precision):  # fp8: neither
        if "mixed_precision" in defaults:
            settings["mixed_precision"] = precision
        else:
            autocast = precision
    return settings, defaults, autocast


@dataclass(frozen=True, kw_only=True)
class VisitSettings:
    """What every visit of a point does: the batch per rank and its warm-up, timed and traced
    steps. The defaults are ``RunConfig``'s."""

    batch_size: int = DEFAULTS.batch_size
    steps: int = DEFAULTS.steps
    warmup_steps: int = DEFAULTS.warmup_steps
    profile_steps: int = DEFAULTS.profile_steps

    @classmethod
    def of(cls, config: RunConfig) -> VisitSettings:
        return cls(
            batch_size=config.batch_size,
            steps=config.steps,
            warmup_steps=config.warmup_steps,
            profile_steps=config.profile_steps,
        )


@dataclass(frozen=True, kw_only=True)
class PointRequest:
    """One point asked for: ``values`` maps each swept axis to its value here, ``knobs`` the
    knobs set (by the sweep and ``--option``), by the keyword the code takes each by; every
    other knob takes its default."""

    sweep: str
    values: dict[str, Any]
    model: str
    strategy: str
    impl: str
    world_size: int
    knobs: dict[str, Any] = field(default_factory=dict)
    swept_defaults: dict[str, Any] | None = None  # None: no axis has a default
    scaling: str | None = None  # a world-size point's: weak or strong
    global_batch: int | None = None  # strong scaling's, split over the data-parallel replicas
    per_visit: VisitSettings = VisitSettings()
    id_suffix: str = ""  # a world-size point's scaling and strategy (``point_id``)


def resolve_point(request: PointRequest) -> PointRecord:
    """The point asked for, resolved: every knob's setting and default, the implementation's
    facts, the world, the batch per replica and the analytical figures' inputs."""
    row = strategy_row(request.strategy)
    # an unknown model, or a factory that fails: one line, before any rank trains
    workload(request.model)
    facts = row.impl(request.impl)
    settings, defaults, autocast = _settings(row, request.knobs)
    own = {k.param: settings[k.param] for k in row.knobs}
    try:
        row.check_layout(request.world_size, _twin(request.model), **own)
    except ValueError as e:
        raise PointRefused(f"{request.model} at {request.world_size} ranks: {e}") from None
    tp = row.tp_size(**own)
    if converts(settings["precision"]) and tp > 1:
        raise PointRefused(
            f"{request.model}: precision=fp8 with tensor parallelism needs torchao's float8 "
            "TP styles, which the suite does not apply (fp8 runs with ddp and fsdp)"
        )
    span = row.replica_ranks(request.world_size, **own) if row.replica_ranks else tp
    dp = max(1, request.world_size // span) if isinstance(span, int) and span > 0 else 1
    batch: int | None = request.per_visit.batch_size
    if request.global_batch is not None:
        batch = request.global_batch // dp if request.global_batch % dp == 0 else None
    return PointRecord(
        id=point_id(request.model, request.values, request.impl, request.id_suffix),
        sweep=request.sweep,
        swept=tuple(request.values),
        value=next(iter(request.values.values())),
        values=dict(request.values),
        swept_defaults=dict(request.swept_defaults or dict.fromkeys(request.values)),
        model=request.model,
        strategy=request.strategy,
        impl=request.impl,
        impl_facts=facts.facts(),
        schedule=row.schedule,
        knobs=settings,
        defaults=defaults,
        autocast=autocast,
        world_size=request.world_size,
        ranks=tuple(range(request.world_size)),
        dp_size=dp,
        tp_size=tp,
        scaling=request.scaling,
        global_batch=request.global_batch,
        batch_per_replica=batch,
        steps=request.per_visit.steps,
        warmup_steps=request.per_visit.warmup_steps,
        profile_steps=request.per_visit.profile_steps,
        figures=_figures(row, facts, request.model, request.world_size, batch, settings),
    )


def parse_options(items: list[str], known: dict[str, Any], swept: tuple[str, ...]) -> dict:
    """``NAME=VALUE`` knobs fixed for the whole sweep, each parsed by its knob's row, keyed by
    the keyword the code takes it by; the knobs the sweep sets cannot be fixed."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r} is not KEY=VALUE")
        if key not in known:
            raise ValueError(f"unknown option {key!r} (known: {', '.join(known)})")
        if known[key].param in swept:
            raise ValueError(f"--option {key} is what the sweep varies: use --values")
        if known[key].param in out:  # the last would win unseen: which was meant?
            raise ValueError(f"--option {key} is given twice")
        try:
            out[known[key].param] = known[key].parse(value)
        except ValueError as e:
            raise ValueError(f"bad --option {key}: {e}") from None
    return out


def _models_and_impls(sweep: Sweep, strategy: Strategy, models: str | None, impls: str | None):
    """The models and implementations asked for, or the sweep's and the strategy's defaults."""
    model_names = (
        parse_list(models, "model", flag="--model") if models else list(sweep.default_models)
    )
    for name in model_names:
        check_workload(name)  # resolved (and refused) here, on every rank alike
    impl_names = (
        parse_list(impls, "implementation", strategy.impls, flag="--impl")
        if impls
        else list(strategy.default_impls)
    )
    return model_names, impl_names


def _axis_values(
    sweep: Sweep, text: str | None, world: int, flag: str = "--values"
) -> list[tuple[Any, dict]]:
    """[(value, knobs it sets)] of one sweep: the values asked for (``flag``), or its defaults
    that fit. Values given are distinct as text, as parsed and as the knobs they set (a mesh
    layout with its TP degree named and one without): each is a point of its own."""
    raw = parse_list(text, "value", flag=flag) if text else list(sweep.default_values)
    parsed = []
    for v in raw:
        try:
            parsed.append(sweep.parse(v))
        except ValueError as e:
            raise ValueError(f"bad value for --sweep {sweep.name}: {e}") from None
    if text:
        distinct(flag, raw, parsed)
    if not text and sweep.expand is not None:
        parsed = [v for v in parsed if sweep.fits(v, world)]
    out = []
    for v in parsed:
        try:
            out.append((v, sweep.knobs_for(v, world)))
        except ValueError as e:
            raise ValueError(f"bad value for --sweep {sweep.name}: {e}") from None
    sets: dict[tuple, Any] = {}
    for v, knobs in out:
        key = tuple(sorted(knobs.items()))
        if key in sets:
            knob_text = ", ".join(f"{k}={x}" for k, x in knobs.items())
            raise ValueError(
                f"{flag}: {_fmt(sets[key])} and {_fmt(v)} set the same knobs ({knob_text})"
            )
        sets[key] = v
    return out


def _strategy_of(sweeps: list[Sweep], asked: str | None) -> Strategy:
    fixed = {s.strategy for s in sweeps if not s.picks_strategy}
    if asked is not None and fixed:
        measures = ", ".join(sorted(fixed))
        raise ValueError(
            f"--strategy is for the world_size sweep and the training-knob sweeps; "
            f"{','.join(s.name for s in sweeps)} measures {measures}"
        )
    if len(fixed) > 1:
        raise ValueError(f"a grid of {' and '.join(sorted(fixed))} sweeps has no one strategy")
    name = asked or (fixed.pop() if fixed else sweeps[0].strategy or "ddp")
    return strategy_row(name)


@dataclass(frozen=True)
class SweepChoices:
    """What every point of a sweep is made from: its strategy, the models and implementations
    (a point for each), the knobs ``--option`` fixes and what each visit does."""

    strategy: Strategy
    models: list[str]
    impls: list[str]
    fixed: dict[str, Any]
    per_visit: VisitSettings


def _choices(
    sweep: Sweep, row: Strategy, config: RunConfig, set_by_sweeps: tuple[str, ...]
) -> SweepChoices:
    """The choices of ``config`` for a sweep of ``row``: ``--option``'s knobs (not those the
    sweeps set), then the models and implementations."""
    known = {k.name: k for k in (*row.knobs, *step_knobs())}
    fixed = parse_options(list(config.option or ()), known, set_by_sweeps)
    models, impls = _models_and_impls(sweep, row, config.model, config.impl)
    return SweepChoices(row, models, impls, fixed, VisitSettings.of(config))


def build_points(config: RunConfig, world_size: int) -> list[PointRecord]:
    """Every point of ``config``'s sweep (or of a grid of two), implementations interleaved per
    value (so drift hits each alike). ``world_size``: the ranks launched, what values are
    checked against (TP degrees, mesh layouts, world sizes). ``config.strategy``,
    ``config.scaling``: the world-size sweep's choices, and the strategy of a training-knob
    sweep."""
    sweeps = [SWEEPS[n] for n in sweep_names(config.sweep)]
    if sweeps[0].kind == "scaling":
        return _world_size_points(sweeps[0], config, world_size)
    if sweeps[0].kind != "training":
        raise ValueError(f"sweep {config.sweep!r} has no training points")
    if config.values2 is not None and len(sweeps) < 2:
        raise ValueError("--values2 is for a grid (--sweep A,B): the second sweep's values")
    if config.scaling is not None:
        raise ValueError("--scaling is for the world_size sweep")
    row = _strategy_of(sweeps, config.strategy)
    axes = [
        _axis_values(s, v, world_size, flag)
        for s, v, flag in zip(
            sweeps, (config.values, config.values2), ("--values", "--values2"), strict=False
        )
    ]
    known = {k.name for k in (*row.knobs, *step_knobs())}
    for s in sweeps:
        if s.knob and s.knob not in known:
            raise ValueError(f"the {s.name} sweep varies a knob that {row.name} does not take")
    choices = _choices(sweeps[0], row, config, tuple(k for s in sweeps for k in s.knobs_set))
    asked = tuple(v is not None for v in (config.values, config.values2))
    return _one_id_each(_grid_points(sweeps, axes, choices, world_size, asked))


def _one_id_each(points: list[PointRecord]) -> list[PointRecord]:
    """The points, refused if two share an id (two model names that become one folder-safe
    name): a run keeps its rows, traces and resume by id."""
    ids: set[str] = set()
    for p in points:
        if p.id in ids:
            raise ValueError(
                f"two points would share the id {p.id} (two --model names alike but for "
                "characters an id writes as _)"
            )
        ids.add(p.id)
    return points


def _grid_points(
    sweeps: list[Sweep],
    axes: list[list[tuple[Any, dict]]],
    choices: SweepChoices,
    world_size: int,
    asked: tuple[bool, ...] = (),
) -> list[PointRecord]:
    """A point per model, combination of the axes' values and implementation (implementations
    innermost: interleaved per value), each with the fixed knobs and those its values set;
    ``asked``: which axes' values were given (``resolved``)."""
    swept_defaults = {s.name: KNOBS[s.knob].default if s.knob else None for s in sweeps}
    requests = []
    for m in choices.models:
        for combo in itertools.product(*axes):
            vals = {s.name: v for s, (v, _) in zip(sweeps, combo, strict=True)}
            knobs = dict(choices.fixed)
            for _, sets in combo:
                knobs.update(sets)
            requests += [
                PointRequest(
                    sweep=",".join(s.name for s in sweeps),
                    values=vals,
                    model=m,
                    strategy=choices.strategy.name,
                    impl=i,
                    knobs=knobs,
                    world_size=world_size,
                    swept_defaults=swept_defaults,
                    per_visit=choices.per_visit,
                )
                for i in choices.impls
            ]
    return resolved(requests, defaulted=not all(asked[: len(sweeps)]))


def resolved(requests: list[PointRequest], *, defaulted: bool) -> list[PointRecord]:
    """The requests resolved. One whose layout cannot run (``PointRefused``) is left out where
    the sweep's values are its defaults (``defaulted``), as TP degrees larger than the world
    are; where the values were asked for, or none is left, it is refused."""
    points, refused = [], []
    for request in requests:
        try:
            points.append(resolve_point(request))
        except PointRefused as e:
            if not defaulted:
                raise
            refused.append(e)
    if refused and not points:
        raise refused[0]
    return points


def _world_sizes(values: str | None, world_size: int) -> list[int]:
    """The world sizes asked for (``--values``), none larger than the ranks launched; by
    default the powers of two up to it."""
    if not values:
        return [1 << i for i in range(world_size.bit_length()) if 1 << i <= world_size]
    sizes, texts = [], parse_list(values, "value", flag="--values")
    for v in texts:
        try:
            sizes.append(positive_int(v))
        except ValueError as e:
            raise ValueError(f"bad value for --sweep world_size: {e}") from None
    distinct("--values", texts, sizes)
    too_big = [k for k in sizes if k > world_size]
    if too_big:
        raise ValueError(f"world size {too_big[0]} is larger than the {world_size} ranks launched")
    return sizes


def _world_size_points(sweep: Sweep, config: RunConfig, world_size: int) -> list[PointRecord]:
    """Points at world sizes up to the launched one. Strong scaling keeps one global batch,
    --batch-size x the largest world size (one replica per rank: --batch-size each at the
    largest size), split over each point's data-parallel replicas."""
    row = strategy_row(config.strategy or "ddp")
    sizes = _world_sizes(config.values, world_size)
    scalings = (
        parse_list(config.scaling, "scaling", dict.fromkeys(SCALINGS), flag="--scaling")
        if config.scaling
        else SCALINGS
    )
    choices = _choices(sweep, row, config, ())
    global_batch = config.batch_size * max(sizes)
    requests = [
        PointRequest(
            sweep=sweep.name,
            values={sweep.name: k},
            model=m,
            strategy=row.name,
            impl=i,
            knobs=dict(choices.fixed),
            world_size=k,
            scaling=sc,
            global_batch=global_batch if sc == "strong" else None,
            per_visit=choices.per_visit,
            id_suffix=f"-{sc}-{row.name}",
        )
        for m in choices.models
        for sc in scalings
        for k in sizes
        for i in choices.impls
    ]
    return _one_id_each(resolved(requests, defaulted=not config.values))
