"""Calibration: the target a plan is for, made once: its device's peaks, its links and how its
computation is priced per precision, measured here where the plan is for this machine.

The computation is priced op by op on the target's roofline (``roofline_fit.py``): as its
profile states it, or calibrated by ``--compute`` runs or, for a CPU target, by one short
launch of the model's points here (``measure_here``: a factor on the efficiencies, a
cost per micro-batch, checkpointing's and the implementations' own work, ``rates.py``);
``--mfu`` (or a GPU without a stated profile) prices the FLOPs at a share of the peak. The
links are presets (``--link``), a fitted ``--collectives`` run, or, on a CPU target given
neither, this machine's collectives measured by a short run (``collectives_run``). Both
measurements are one launch here (``measure_here``), the planner's only work before its rows;
its failure is one line (a ``ValueError``).

The calibration launch's points are interleaved in its cycles, so that the machine's drift
falls on all of them alike (docs/benchmarks.md, "The calibration").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from bench.model.errors import FitError
from bench.model.predict import overlap_share
from bench.plan.devices import Device
from bench.plan.families import OP_DISPATCH, UNIT_COPIES, own_works
from bench.plan.launch import command_run, launch_runs, points_run, timing
from bench.plan.rates import (
    CKPT,
    FSDP,
    MANY,
    ONE,
    TP,
    Rate,
    accum_of,
    accumulated,
    at_precision,
    fit_rates,
    fsdp_extra,
    launch_ckpt_factor,
    launch_tables,
    ok_rows,
    optimiser_ms,
    param_bytes,
    tp_extra,
)
from bench.plan.request import OPTIONS, PlanRequest
from bench.plan.roofline_fit import (
    calibrated_rates,
    check_precisions,
    ckpt_ratio,
    lever_key,
    priced_optimiser_ms,
    row_levers,
    run_roofline,
    stated,
    target_roofline,
)
from bench.plan.space import Config, names_checkpoint_units
from bench.plan.topology import Topology
from bench.roofline.profile import Roofline
from bench.roofline.step_comm import host_step_comm
from bench.runfolder import peaks
from bench.runfolder.schema import read_results
from bench.runner.configure.config import Resolved
from parallel_kernels.checkpointing import checkpoint_mode
from parallel_kernels.compiling import compiles
from parallel_kernels.float8 import FP8

FLOAT8_REST = "fp32"  # the precision of an fp8 step's other ops (parallel_kernels/float8.py)
DEFAULT_MFU_PCT = 40.0  # what a tuned dense training step reaches on recent GPUs (torchtitan)
FSDP_CALIBRATED = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")  # HYBRID_SHARD needs 4 ranks
GROUP = "plan calibration"  # the calibration points' verdict group
CALIBRATION = Path("calibration") / "training"  # a plan's folder: the launch's run folder
# A point's seconds of interleaved cycles (``--launch-seconds`` sets another), and three
# traced steps: its computation is the analyser's, which one step leaves noisy.
POINT_SECONDS = 4.0
LAUNCH_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Target:
    """What the rows are predicted on: the calibration's hand-off."""

    device: Device
    topology: Topology
    peak_tflops: Callable[[str], float]  # precision -> the device's peak
    peak_source: Callable[[str], str]
    allowance_gib: float  # memory the allocator does not see (CUDA context, NCCL buffers)
    global_batch: int
    # precision (or ``lever_key``: a measured fp8 or compiled point's) -> computation's rate
    rates: dict[str, Rate] = field(default_factory=dict)

    def rate_for(self, knobs: dict) -> Rate:
        """The rate a row's computation is priced at: that of a measured point with its
        precision and compile (``lever_key``) where the rates hold one, else its precision's
        (fp8 without one: fp32's, the rest of its step's) on the op model, its source saying
        which."""
        precision, mode = knobs["precision"], knobs.get("compile", "off")
        key = lever_key(precision, mode)
        if key in self.rates:
            return self.rates[key]
        rate = self.rates.get(precision) or self.rates[FLOAT8_REST]
        if key == precision:
            return rate
        what = [f"compile={mode}: its memory-bound chains fused"] * compiles(knobs)
        what += ["fp8: the blocks' Linears at the fp8 peak, their casts"] * (precision == FP8)
        return replace(rate, source=f"op model ({'; '.join(what)}) on {rate.source}")


@dataclass(frozen=True)
class Peaks:
    tflops: Callable[[str], float]  # precision -> the device's peak, TFLOP/s
    source: Callable[[str], str]  # precision -> where that figure comes from


@dataclass(frozen=True)
class LaunchPlan:
    """What a CPU plan's calibration launch measures (``calibration_points``): DDP at each
    precision, and where the plan holds rows they apply to, checkpointing's cost and the own
    work of each FSDP and TP implementation (``families.UNIT_COPIES``, ``OP_DISPATCH``)."""

    model: str
    precisions: tuple[str, ...]
    per_replica: int  # samples per replica of the plan's global batch
    ranks: int  # launched here
    # the checkpointing modes timed: full where the plan holds rows that checkpoint whole
    # blocks, selective:op where it holds that mode's rows (``Rate.recompute_factor``)
    ckpt: tuple[str, ...] = ()
    fsdp: tuple[str, ...] = ()
    tp: tuple[str, ...] = ()
    seconds: float = POINT_SECONDS  # each point's seconds of interleaved cycles

    def describe(self) -> str:
        what = (
            ["DDP"]
            + (["checkpointing"] if self.ckpt else [])
            + [f"FSDP ({', '.join(self.fsdp)})"] * bool(self.fsdp)
            + [f"TP ({', '.join(self.tp)})"] * bool(self.tp)
        )
        return (
            f"{self.model}, {', '.join(what)} on {self.ranks} ranks here, {self.per_replica} "
            "per replica, interleaved in one launch"
        )


def launch_plan(request: PlanRequest, configs: list[Config]) -> LaunchPlan:
    """The calibration launch the plan's configurations need: their precisions, and what they
    hold beyond DDP (a model without checkpoint units has no checkpointed row to time: its
    point would fail; TP needs two ranks here)."""

    def impls(own_work: str) -> tuple[str, ...]:
        rows = (f for c in configs for f in own_works(c.family, c.knobs))
        return tuple(dict.fromkeys(f.impl for f in rows if f.own_work == own_work))

    ranks = request.ranks_here
    return LaunchPlan(
        model=request.model,
        precisions=tuple(dict.fromkeys(c.knobs["precision"] for c in configs)),
        per_replica=request.global_batch // request.world_size or 1,
        ranks=ranks,
        ckpt=timed_modes(request.model, configs),
        fsdp=impls(UNIT_COPIES),
        tp=impls(OP_DISPATCH) if ranks > 1 else (),
        seconds=request.launch_seconds or POINT_SECONDS,
    )


def timed_modes(model: str, configs: list[Config]) -> tuple[str, ...]:
    """The checkpointing modes a calibration launch times for ``configs``: ``full`` for those
    checkpointing whole blocks (full, selective:layer=N), ``selective:op`` for its own; none
    for a model without checkpoint units (its point would fail, and the plan with it)."""
    if not names_checkpoint_units(model):
        return ()
    modes = {c.checkpointing for c in configs if c.checkpointed}
    per_op = {m for m in modes if checkpoint_mode(m).per_op}
    return ("full",) * bool(modes - per_op) + tuple(sorted(per_op))


def calibrate(request: PlanRequest, configs: list[Config], out: Path) -> Target:
    """The target of ``request``: its computation's rates and its links, measured here (into
    ``out``, one launch: ``measure_here``) where the plan is for this machine."""
    peak = _peaks(request.device)
    launch = launch_plan(request, configs)
    here = measure_here(request, launch, out)
    return Target(
        device=request.device,
        topology=_links(request, here.collectives),
        peak_tflops=peak.tflops,
        peak_source=peak.source,
        allowance_gib=request.allowance,
        global_batch=request.global_batch,
        rates=computation_rates(request, peak, launch, here.training),
    )


@dataclass(frozen=True)
class Here:
    """The run folders a plan's launch here made: its training points' (``calibration_points``)
    and its collectives' (``collectives_run``), each None where the plan needs none."""

    training: Path | None = None
    collectives: Path | None = None


def measure_here(request: PlanRequest, launch: LaunchPlan, out: Path) -> Here:
    """What a CPU plan measures on this machine, in one launch of ``launch.ranks`` ranks (its
    start-up paid once): the collectives, where no ``--collectives`` or ``--link`` prices them
    and the ranks communicate, then the calibration's points, where its computation is
    calibrated by a launch (``trains_here``). The ValueError of a failed launch says why."""
    here = Here(
        training=out / CALIBRATION if trains_here(request) else None,
        collectives=out / "calibration" / "collectives" if collects_here(request) else None,
    )
    runs = []
    if here.collectives is not None:
        print(f"calibrating: the collectives on {launch.ranks} ranks here")
        runs.append(collectives_run(here.collectives, launch.ranks))
    if here.training is not None:
        # a precision the roofline lacks fails before the launch, not after it
        check_precisions(target_roofline(request), launch.precisions)
        print(f"calibrating: {launch.describe()}")
        runs.append(points_run(calibration_points(launch), launch.ranks, here.training, GROUP))
    failure = launch_runs(runs, launch.ranks, LAUNCH_TIMEOUT_S) if runs else ""
    if failure:
        raise ValueError(f"the calibration launch of {launch.model} failed: {failure}")
    return here


def _on_host_roofline(request: PlanRequest) -> bool:
    """Whether the plan's computation is priced on this host's roofline: a CPU target's, unless
    ``--mfu`` or ``--compute`` prices it otherwise."""
    return not request.device.gpu_name and request.mfu is None and not request.compute


def trains_here(request: PlanRequest) -> bool:
    """Whether the plan's computation is calibrated by a launch of its points here: a CPU
    target's, unless ``--mfu``, ``--compute`` or ``--no-calibration-launch`` says otherwise."""
    return _on_host_roofline(request) and request.calibration_launch


def collects_here(request: PlanRequest) -> bool:
    """Whether the plan's collectives are measured here: a CPU target given neither
    ``--collectives`` nor ``--link``, on ranks that communicate."""
    given = request.collectives is not None or request.link is not None
    return not request.device.gpu_name and not given and request.ranks_here > 1


def _peaks(dev: Device) -> Peaks:
    """The target device's peaks: this host's measured (its roofline profile's, as a run's
    MFU is against), or a GPU's datasheet figures."""
    if not dev.gpu_name:
        import torch

        from bench.runner.measure.flops import device_peak

        cpu = torch.device("cpu")
        return Peaks(lambda p: device_peak(cpu, p).tflops, lambda p: device_peak(cpu, p).source)
    missing = [p for p in OPTIONS["precision"] if peaks.datasheet_peak(dev.gpu_name, p) is None]
    if missing:
        raise ValueError(f"device {dev.name} has no {missing[0]} datasheet peak")
    return Peaks(
        lambda p: peaks.datasheet_peak(dev.gpu_name, p).tflops,
        lambda p: peaks.datasheet_peak(dev.gpu_name, p).source,
    )


def _links(request: PlanRequest, measured: Path | None) -> Topology:
    """The links, or this machine's collectives fitted (``--collectives``, or those
    ``measured`` here); on a CPU target the share of a core computation keeps beside gloo's
    thread (``predict.overlap_share``)."""
    share = 1.0
    if not request.device.gpu_name:
        share = overlap_share({"device": "cpu", "ranks_per_node": request.ranks_here})
    run = request.collectives if measured is None else measured
    if run is None:
        return Topology.of_links(request.links, request.gpus_per_node, share)
    try:
        topology = Topology.fitted(run, request.gpus_per_node, share)
    except (OSError, FitError) as e:
        what = "--collectives" if measured is None else "the collectives' calibration run"
        raise ValueError(f"{what} {run}: {e}") from None
    if prices_in_step(request):
        paid = host_step_comm()
        topology = replace(
            topology, in_step=paid.factor, about=f"{topology.about}; {paid.describe()}"
        )
    return topology


def prices_in_step(request: PlanRequest) -> bool:
    """Whether the plan prices its collectives at what a step here pays for them
    (``step_comm``): a CPU target's computation on the roofline, no launch nor ``--compute``
    run measuring its steps (a launch's calibration holds what its steps paid)."""
    return _on_host_roofline(request) and not request.calibration_launch


def computation_rates(
    request: PlanRequest, peak: Peaks, launch: LaunchPlan, measured: Path | None
) -> dict[str, Rate]:
    """Per precision, how the computation is priced on the target: its ops on the target's
    roofline (``roofline_fit.py``), calibrated by ``--compute`` runs or, for a CPU target, by
    the launch ``measured`` here (``calibrated``); the peak times a given MFU (``--mfu``), or,
    on a GPU the datasheets do not state, an assumed one."""
    if request.mfu is not None:
        return rates_of(request, peak, launch.precisions)
    roofline = target_roofline(request)
    if roofline is None:
        return rates_of(request, peak, launch.precisions)
    check_precisions(roofline, launch.precisions)
    if request.compute:
        return _by_runs(request, roofline, launch.precisions)
    if measured is not None:
        return calibrated(request, launch, measured, roofline)
    return stated(roofline, launch.precisions)


def _by_runs(request: PlanRequest, roofline: Roofline, precisions: tuple[str, ...]) -> dict:
    """The target's roofline calibrated by the ``--compute`` run of fewest micro-batches per
    step: its DDP point of each precision, priced on the device it ran on."""
    run = min(request.compute, key=accum_of)
    ones = ok_rows(run)
    keys = ones.apply(lambda row: lever_key(*row_levers(row)), axis=1)
    needed = [p for p in precisions if p != FP8]  # fp8 where measured, else the op model
    missing = [p for p in needed if p not in set(keys)]
    if missing:
        raise ValueError(f"--compute: no {missing[0]} point of {request.model} to fit from")
    there, gpu = run_roofline(run, roofline, request.device.gpu_name)
    levered = keys.ne(ones["value"].astype(str))  # fp8 or compiled: their own rates
    ones = ones[keys.isin(needed) | levered].assign(_key=keys).drop_duplicates("_key")
    return calibrated_rates(ones, roofline, there, str(run), gpu)


def calibrated(request: PlanRequest, launch: LaunchPlan, run: Path, roofline: Roofline) -> dict:
    """``computation_rates`` calibrated by the short launch ``run`` made here
    (``calibration_points``): this host's roofline at the factor each precision's DDP point
    gives, and where the launch holds them, checkpointing's cost and the FSDP and TP
    implementations' own work."""
    tables = launch_tables(run)
    if ONE not in tables:
        raise ValueError(f"the calibration launch {run}: no ok point of one micro-batch")
    first = launch.precisions[0]
    ones = pd.concat([pd.DataFrame([at_precision(tables[ONE], p)]) for p in launch.precisions])
    fitted = calibrated_rates(ones, roofline, roofline, str(run), False, accumulated(tables, run))
    notes, extra = [], {}
    for mode in launch.ckpt:
        o = priced_optimiser_ms(request.model, launch.per_replica, first, fitted[first].pricing)
        ratio = ckpt_ratio(request.model, launch.per_replica, first, fitted[first], mode)
        # the ops' ratio stands for the FLOPs': a rate of no fixed cost per micro-batch
        factor = launch_ckpt_factor(tables, run, first, Rate(1.0, 0.0, ""), o, ratio, mode)
        notes.append(f"checkpointing {mode} x{factor:.2f} its ops' time")
        extra["op_ckpt_factor" if checkpoint_mode(mode).per_op else "ckpt_factor"] = factor
    notes += _own_work(tables, launch, extra)
    if not notes:
        return fitted
    return {p: replace(r, **extra, source="; ".join([r.source, *notes])) for p, r in fitted.items()}


def _own_work(tables: dict[str, pd.DataFrame], launch: LaunchPlan, extra: dict) -> list[str]:
    """The FSDP and TP implementations' own work per step the launch measured, into ``extra``
    (``Rate``'s ``fsdp_ms`` and ``tp_ms``), and the console's words for it."""
    notes = []
    ddp = at_precision(tables[ONE], launch.precisions[0])
    if launch.fsdp:
        extra["fsdp_ms"] = fsdp_extra(tables.get(FSDP, tables[ONE].iloc[:0]), ddp)
        own = ", ".join(
            f"{impl} {sharding} {ms:.1f} ms"
            for impl, by in sorted(extra["fsdp_ms"].items())
            for sharding, ms in sorted(by.items())
        )
        notes.append(f"FSDP's own work per step: {own}")
    if launch.tp:
        extra["tp_ms"] = tp_extra(tables.get(TP, tables[ONE].iloc[:0]), ddp)
        own = ", ".join(f"{impl} {ms:.1f} ms" for impl, ms in sorted(extra["tp_ms"].items()))
        notes.append(f"TP's own work per step: {own or 'not measured (its point failed)'}")
    return notes


def rates_of(request: PlanRequest, peak: Peaks, precisions: tuple[str, ...]) -> dict:
    """``computation_rates``' figures from the ``--compute`` runs (none: the assumed or given
    MFU)."""
    runs = list(request.compute)
    if not runs:
        pct = DEFAULT_MFU_PCT if request.mfu is None else request.mfu
        how = "assumed" if request.mfu is None else "given"
        return {
            p: Rate(peak.tflops(p) * pct / 100, 0.0, f"{how} MFU {pct:g} % of {peak.source(p)}")
            for p in precisions
        }
    fitted = fit_rates(runs, _optimiser_ms(request))
    return _scaled(fitted, runs[0], request, peak, precisions)


def _scaled(
    fitted: dict[str, Rate], run: Path, request: PlanRequest, peak: Peaks, precisions
) -> dict:
    """Fitted rates on the target: times its peak over the peak they were measured against
    (``run``'s), each precision the plan holds."""
    missing = [p for p in precisions if p not in fitted]
    if missing:
        raise ValueError(
            f"--compute: no {missing[0]} point of {request.model} to fit its rate from"
        )
    # the same device when the target is this host: no ratio (two measurements of one peak)
    gpu = request.device.gpu_name
    peaks_there = {p: _peak_of(run, p) if gpu else peak.tflops(p) for p in precisions}
    return {
        p: Rate(
            fitted[p].tflops * peak.tflops(p) / peaks_there[p],
            fitted[p].micro_ms * peaks_there[p] / peak.tflops(p),
            f"fitted ({fitted[p].source}), x{peak.tflops(p) / peaks_there[p]:.3g} peaks",
        )
        for p in precisions
    }


def _optimiser_ms(request: PlanRequest) -> float:
    """AdamW's step over the whole model on the target: what the fits take out of a DDP
    step's computation (ZeRO's 16 bytes of state per fp32 parameter)."""
    params = sum(param_bytes(request.model)) / 4
    return optimiser_ms(16 * params, request.device.bandwidth_GBps)


def _peak_of(run: Path, precision: str) -> float:
    """The peak a run's points of ``precision`` were measured against (its results.csv)."""
    df = read_results(run)
    rows = df[(df["status"] == "ok") & (df["value"].astype(str) == precision)]
    return float(rows["peak_tflops"].iloc[0]) if not rows.empty else math.nan


def collectives_run(out: Path, ranks: int) -> Resolved:
    """A short ``--sweep message_size`` run into ``out`` on ``ranks`` ranks here of the
    collectives the schedules price (all-reduce, all-gather, reduce-scatter; native, 4 KiB to
    16 MiB), whose fit prices a CPU plan's communication as this machine runs it: the link
    presets are GPU fabrics, far faster than gloo on a CPU (docs/benchmarks.md, "The
    calibration")."""
    args = ["--sweep", "message_size", "--collectives", "all_reduce,all_gather,reduce_scatter"]
    args += ["--impl", "native", "-b", "4K", "-e", "16M", "-f", "4"]
    args += ["--no-report", "--out", str(out)]
    return command_run(args, ranks, "the collectives' sweep")


def calibration_points(launch: LaunchPlan) -> list[tuple[str, str, list[str]]]:
    """The calibration's points as ``bench/run.py`` commands (``launch.points_run``), each
    named by its role: DDP with ``per_replica`` samples in one micro-batch (``ONE``) and in 4
    (or 2) accumulated ones (``MANY``, where the batch splits), each precision; and at the
    first precision, ``per_replica`` samples in one micro-batch, DDP with activation
    checkpointing (``CKPT``, where ``ckpt``), each FSDP implementation of ``fsdp`` at
    ``FSDP_CALIBRATED`` (``FSDP``) and each TP implementation of ``tp`` over the ranks with
    their ``ranks * per_replica`` samples (``TP``: a rank's FLOPs are DDP's)."""
    model, per_replica, precisions = launch.model, launch.per_replica, launch.precisions
    timed = timing(launch.seconds, traced=3)
    ddp = ["--model", model, "--impl", "native", *timed]
    each = ["--sweep", "precision", "--values", ",".join(precisions), *ddp]
    named = [(ONE, model, [*each, "--batch-size", str(per_replica)])]
    splits = [a for a in (4, 2) if per_replica % a == 0]
    if splits:
        a = splits[0]
        accumulating = ["--batch-size", str(per_replica // a), "--option", f"grad_accum={a}"]
        named.append((MANY, f"{model} accumulating {a}", [*each, *accumulating]))
    at_first = ["--batch-size", str(per_replica), "--option", f"precision={precisions[0]}"]
    if launch.ckpt:
        modes = ",".join(launch.ckpt)
        ckpt = ["--sweep", "activation_checkpointing", "--values", modes, *ddp, *at_first]
        named.append((CKPT, f"{model}'s checkpointing", ckpt))
    if launch.fsdp:
        fsdp = ["--sweep", "sharding_strategy", "--values", ",".join(FSDP_CALIBRATED)]
        fsdp += ["--model", model, "--impl", ",".join(launch.fsdp), *timed, *at_first]
        named.append((FSDP, f"{model}'s FSDP", fsdp))
    if launch.tp:
        tp = ["--sweep", "tp_degree", "--values", str(launch.ranks), "--model", model]
        tp += ["--impl", ",".join(launch.tp), *timed]
        tp += ["--batch-size", str(per_replica * launch.ranks), "--option", at_first[-1]]
        named.append((TP, f"{model}'s TP", tp))
    return named
