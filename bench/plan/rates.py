"""The computation's rate, fitted to profiled steps of the model: the arithmetic the calibration
(``calibration.py``) applies to ``--compute`` runs and to its own launch's points.

A step's computation (the analyser's ``compute_ms``: the main thread's work less its
collectives) of ``a`` micro-batches of ``m`` samples is ``a (c + k m) + o``: ``c`` what a
micro-batch costs whatever its size (launches, Python), ``k m`` its FLOPs at the rate ``R``,
``o`` the optimiser step (AdamW's traffic, ``ADAMW_BYTES_PER_PARAM``). Two DDP points, ``B``
samples per replica in one micro-batch and in ``a``, give ``c = (T_a - T_1) / (a - 1)`` and
``R = F / (T_1 - c - o)`` (``F``: the rank's FLOPs per step, the harness's count); one point
gives ``R`` with ``c = 0``. Another device's rate is this one's times the ratio of the two
devices' peaks at the precision.

A CPU plan also measures what the FLOPs at that rate miss, as this host's costs, taken for its
own plans only (the plan's first precision):

- ``ckpt_factor``: DDP checkpointed over DDP plain (``B`` samples), against what the rate
  predicts; a checkpoint replays the forward's launches and Python and keeps books of its
  own. It multiplies a checkpointed micro-batch's computation (``step_time.compute_profile``).
- ``fsdp_ms``: each FSDP implementation at three shardings (``B`` samples) less DDP: the
  copies into and out of its collectives' buffers, its hooks.
- ``tp_ms``: each TP implementation over all its ranks (the ranks' samples, so that a rank
  computes DDP's FLOPs) less DDP, scaled to its FLOPs: DTensor decides each op's sharding in
  Python, a cost per op, so it is taken for every TP degree of the plan.

The measurements behind these choices: docs/benchmarks.md, "The calibration".
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from bench.plan.launch import role
from bench.plan.op_prices import Pricing
from bench.runfolder.points import RunFolderError, read_points
from bench.runfolder.schema import read_results, read_samples
from parallel_kernels.checkpointing import checkpoint_mode
from parallel_kernels.models import workload

ADAMW_BYTES_PER_PARAM = 28
# The roles of a calibration launch's points (``calibration.calibration_points``), their ids'
# prefixes: DDP in one micro-batch and in several, checkpointed, FSDP's and TP's own work.
ONE, MANY, CKPT, FSDP, TP = "one", "many", "ckpt", "fsdp", "tp"


@dataclass(frozen=True)
class Rate:
    tflops: float  # the model's FLOPs per second in a step's computation, TFLOP/s
    micro_ms: float  # the cost of a micro-batch whatever its size (c)
    source: str
    # implementation -> sharding strategy -> FSDP's own computation per step beyond the
    # model's, ms (``fsdp_extra``); empty: none counted
    fsdp_ms: dict[str, dict[str, float]] = field(default_factory=dict, hash=False)
    # a checkpointed micro-batch's computation over what its FLOPs at this rate say
    # (``ckpt_factor``), measured with every block checkpointed in full; 1: none measured
    ckpt_factor: float = 1.0
    # implementation -> TP's own computation per step beyond the model's, ms (``tp_extra``)
    tp_ms: dict[str, float] = field(default_factory=dict, hash=False)
    # the roofline the ops are priced on (``op_prices.py``); None: the FLOPs at ``tflops``
    pricing: Pricing | None = None
    # ``ckpt_factor`` measured with selective:op, its per-op policy's own books (its mode's
    # dispatch of every op, kept or recomputed); None: not measured, ``ckpt_factor`` stands in
    op_ckpt_factor: float | None = None

    def recompute_factor(self, mode: str, blocks: int) -> float:
        """What checkpointing in ``mode`` multiplies a micro-batch's priced computation by on
        a model of ``blocks`` blocks: ``ckpt_factor`` (measured with every block checkpointed
        in full) where every block replays its forward in full, its excess in the share of
        blocks that do under ``selective:layer=N``; ``op_ckpt_factor`` for ``selective:op``
        where measured (its policy runs every op of the forward again, serving those it kept
        from its cache: the recomputed ops' own cost is in their prices, not its books), else
        ``ckpt_factor``; 1 with checkpointing off."""
        m = checkpoint_mode(mode)
        if not m.every:
            return 1.0
        if m.per_op:
            return self.ckpt_factor if self.op_ckpt_factor is None else self.op_ckpt_factor
        share = 1.0 if m.every == 1 else (blocks // m.every) / max(blocks, 1)
        return 1.0 + (self.ckpt_factor - 1.0) * share

    def fsdp_extra_ms(self, impl: str, strategy: str) -> float:
        """FSDP's own computation per step of ``impl`` at ``strategy``: its calibrated figure,
        else the highest of the implementation's (a strategy not run in the calibration,
        HYBRID_SHARD at fewer than 4 ranks), else none."""
        own = self.fsdp_ms.get(impl, {})
        return own[strategy] if strategy in own else max(own.values(), default=0.0)

    def tp_extra_ms(self, impl: str) -> float:
        """TP's own computation per step of ``impl``: its calibrated figure, else none."""
        return self.tp_ms.get(impl, 0.0)


def ok_rows(run: Path, what: str = "--compute") -> pd.DataFrame:
    """A run's ok points with their FLOPs; ``what`` names the run in an error."""
    try:
        df = read_results(run)
    except RunFolderError as e:
        raise ValueError(f"{what} {run}: {e}") from None
    if df.empty:
        raise ValueError(f"{what} {run}: not a run folder with results (no results.csv rows)")
    ok = df[df["status"] == "ok"]
    if ok.empty or "flops_per_step" not in ok:
        raise ValueError(f"{what} {run}: no ok point with its FLOPs")
    return ok


def accum_of(run: Path) -> int:
    """A run's gradient accumulation, from its points record's knobs."""
    try:
        first = next(iter(read_points(run).values()))
    except (RunFolderError, StopIteration):
        raise ValueError(f"--compute {run}: no points record to read its knobs from") from None
    return int(first.knobs.get("grad_accum", 1))


def computation_ms(row) -> float:
    """A results row's computation per step: the analyser's, else (no traces) the step."""
    try:
        value = float(row["compute_ms"])
    except (KeyError, TypeError, ValueError):
        value = math.nan
    return value if value > 0 else float(row["step_ms_median"])


def fit_rates(runs: list[Path], optimiser_ms: float) -> dict[str, Rate]:
    """Per precision, the rate and per-micro-batch cost the runs give (``--compute``: the run
    of fewest micro-batches per step, and the run of most)."""
    tables = {r: ok_rows(r) for r in runs}
    by_accum = sorted(tables, key=accum_of)
    one, many = by_accum[0], by_accum[-1]
    return _fit(
        tables[one], tables[many], accum_of(many), optimiser_ms, f"in {one}", f"from {many}"
    )


def _fit(
    one: pd.DataFrame,
    many: pd.DataFrame,
    a: int,
    optimiser_ms: float,
    at: str,
    then: str,
    paired: dict[str, float] | None = None,
) -> dict[str, Rate]:
    """Per precision (each table's ``value``), the rate from ``one`` (a micro-batch per step)
    and the per-micro-batch cost from ``many`` (``a`` per step) where ``a`` > 1: from the two
    points' computations, or where ``paired`` has the precision, from its difference of their
    steps cycle by cycle (``paired_difference``). A cost per micro-batch that leaves the one
    micro-batch no computation of its own is noise, not a fit (a loaded machine slows one point
    and not the other): none is fitted (docs/benchmarks.md, "The calibration")."""
    rates = {}
    for _, row in one.iterrows():
        precision = str(row["value"])
        t1 = computation_ms(row)
        c, note = 0.0, ""
        match = many[many["value"].astype(str) == precision]
        if a > 1 and not match.empty:
            delta = (paired or {}).get(precision)
            if delta is None:
                delta = computation_ms(match.iloc[0]) - t1
            else:
                note = ", paired cycle by cycle"
            c = max(0.0, delta / (a - 1))
            if t1 - c - optimiser_ms <= 0:
                c, note = 0.0, f"; none per micro-batch {then}: it read more than the whole step"
        compute_ms = t1 - c - optimiser_ms
        if compute_ms <= 0:
            compute_ms = t1 - c
        tflops = float(row["flops_per_step"]) / (compute_ms / 1e3) / 1e12
        how = f"{precision}: {t1:.1f} ms of computation per step of {row['batch_per_replica']} "
        how += f"samples {at}"
        if c:
            how += f", {c:.2f} ms per micro-batch {then}"
        rates[precision] = Rate(tflops, c, how + note)
    if not rates or any(not math.isfinite(r.tflops) for r in rates.values()):
        raise ValueError(f"no rate could be fitted {at}")
    return rates


def launch_tables(run: Path) -> dict[str, pd.DataFrame]:
    """A calibration launch's ok points by role (``ONE``, ``MANY``, ``CKPT``, ``FSDP``,
    ``TP``)."""
    df = ok_rows(run, "the calibration launch").drop_duplicates("point", keep="last")
    roles = df["point"].map(role)
    return {name: df[roles == name] for name in roles.unique()}


def accumulated(tables: dict[str, pd.DataFrame], run: Path) -> dict[str, tuple[int, float]]:
    """Per precision of a calibration launch, its accumulated point's micro-batches and its
    step less the one micro-batch's, paired cycle by cycle (``paired_difference``), where the
    launch kept both points' cycles."""
    one, many = tables.get(ONE), tables.get(MANY)
    if one is None or many is None:
        return {}
    out = {}
    for _, row in many.iterrows():
        base = one[one["value"].astype(str) == str(row["value"])]
        if not base.empty:
            delta = paired_difference(run, base.iloc[0]["point"], row["point"])
            if delta is not None:
                out[str(row["value"])] = (int(row["grad_accum"]), delta)
    return out


def paired_difference(run: Path, a: str, b: str) -> float | None:
    """The median over the cycles both points ran of point ``b``'s step less ``a``'s, each pair
    timed moments apart (the launch's ``samples.csv``): what drift and load within a launch
    leave of the difference. None where fewer than two cycles are shared."""
    try:
        samples = read_samples(run)
    except RunFolderError:
        return None
    by = [samples[samples["point"] == p].set_index("index")["ms"] for p in (a, b)]
    shared = by[0].index.intersection(by[1].index)
    if len(shared) < 2:
        return None
    return float((by[1][shared] - by[0][shared]).median())


def at_precision(table: pd.DataFrame, precision: str) -> dict:
    rows = table[table["value"].astype(str) == precision]
    if rows.empty:
        raise ValueError(f"the calibration launch: no {precision} DDP point to compare with")
    return rows.iloc[0].to_dict()


def fsdp_extra(fsdp: pd.DataFrame, ddp: dict) -> dict[str, dict[str, float]]:
    """Per FSDP point (by implementation, then sharding strategy), its computation per step
    less DDP's (``ddp``: its row at the same micro-batch and precision), at least 0."""
    ddp_ms = computation_ms(ddp)
    extra: dict[str, dict[str, float]] = {}
    for _, row in fsdp.iterrows():
        own = max(0.0, computation_ms(row) - ddp_ms)
        extra.setdefault(str(row["impl"]), {})[str(row["value"])] = own
    return extra


def tp_extra(tp: pd.DataFrame, ddp: dict) -> dict[str, float]:
    """Per TP point's implementation, its computation per step less DDP's (``ddp``: its row at
    the same precision) scaled by their FLOPs per step (where both are known), at least 0."""
    extra: dict[str, float] = {}
    for _, row in tp.iterrows():
        try:
            ratio = float(row["flops_per_step"]) / float(ddp["flops_per_step"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            ratio = math.nan
        ratio = ratio if math.isfinite(ratio) and ratio > 0 else 1.0
        extra[str(row["impl"])] = max(0.0, computation_ms(row) - ratio * computation_ms(ddp))
    return extra


def launch_ckpt_factor(
    tables: dict[str, pd.DataFrame],
    run: Path,
    precision: str,
    rate: Rate,
    optimiser_ms: float,
    recompute: float,
    mode: str = "full",
) -> float:
    """``ckpt_factor`` of a calibration launch: its point checkpointed in ``mode`` against its
    one micro-batch at ``precision``, the checkpointed computation that one's plus their
    steps' difference cycle by cycle (the same synchronisation in both), where the launch
    kept its cycles."""
    points = tables.get(CKPT, pd.DataFrame({"value": []}))
    points = points[points["value"].astype(str) == mode]
    if points.empty:
        raise ValueError(f"the calibration launch {run}: its point checkpointed {mode} failed")
    on = points.iloc[0].to_dict()
    off = at_precision(tables[ONE], precision)
    delta = paired_difference(run, off["point"], on["point"])
    # a checkpointed step no longer than the plain one is noise, not a pair (under CI's load
    # the pairs read a factor of 0.30): the traced computations then
    if delta is not None and delta > 0:
        on = {**on, "compute_ms": computation_ms(off) + delta}
    return ckpt_factor(off, on, rate, optimiser_ms, recompute)


def ckpt_factor(off: dict, on: dict, rate: Rate, optimiser_ms: float, recompute: float) -> float:
    """The checkpointed step's computation (``on``, a results row) over the plain one's
    (``off``; the optimiser's step, ``optimiser_ms``, left out of both as ``fit_rates`` leaves
    it out), over the ratio ``rate`` predicts for them: ``(recompute F / R + c) / (F / R +
    c)``, ``F`` the plain micro-batch's FLOPs (the harness's count), ``recompute`` the
    checkpointed micro-batch's FLOPs over the plain one's (the planner's count, its
    recomputation included)."""
    off_ms, on_ms = computation_ms(off), computation_ms(on)
    o = optimiser_ms if min(off_ms, on_ms) > optimiser_ms else 0.0
    measured = (on_ms - o) / (off_ms - o)
    flops_ms = float(off["flops_per_step"]) / (rate.tflops * 1e12) * 1e3
    predicted = (recompute * flops_ms + rate.micro_ms) / (flops_ms + rate.micro_ms)
    return measured / predicted


@functools.cache
def param_bytes(model: str) -> tuple[int, ...]:
    """The plain model's parameters' fp32 bytes in backward's order (registration reversed),
    a tied one once; from the model on the meta device (no memory)."""
    with torch.device("meta"):
        twin = workload(model).build()
    counted, sizes = set(), []
    for p in twin.parameters():
        if id(p) not in counted:
            counted.add(id(p))
            sizes.append(4 * p.numel())
    return tuple(reversed(sizes))


def optimiser_ms(state_bytes: float, bandwidth_GBps: float) -> float:
    """AdamW's step over the parameters a rank holds (ZeRO's 16 bytes of state per parameter):
    28 bytes of traffic per parameter (reads of the parameter, gradient and two moments, writes
    of three) at the device's memory bandwidth."""
    return 1e3 * state_bytes / 16 * ADAMW_BYTES_PER_PARAM / (bandwidth_GBps * 1e9)
