"""The planner's command line, checked before any work: each bad input is one line (a
``ValueError``); what is good becomes the plan's target."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from bench.model.errors import FitError
from bench.model.predict import overlap_share
from bench.plan.calibrate import (
    CALIBRATION,
    FSDP,
    ONE,
    TP,
    Rate,
    at_precision,
    calibration_launch,
    collectives_run,
    fit_launch,
    fit_rates,
    fsdp_extra,
    launch_ckpt_factor,
    launch_tables,
    tp_extra,
)
from bench.plan.devices import device
from bench.plan.memory import recompute_ratio
from bench.plan.planner import Target
from bench.plan.space import FAMILIES, OPTIONS, micro_batches
from bench.plan.step_time import Topology, optimiser_ms, param_bytes
from bench.runfolder import peaks
from bench.runfolder.schema import read_results
from parallel_kernels.models import workload

DEFAULT_MFU_PCT = 40.0  # what a tuned dense training step reaches on recent GPUs (torchtitan)
GPU_ALLOWANCE_GIB = 2.0  # CUDA context and NCCL's buffers, about a GiB each
DEFAULT_LINKS = "nvlink4,ib_ndr"  # a GPU target's, where --link is not given


def _families(text: str | None) -> tuple[str, ...]:
    if not text:
        return FAMILIES
    names = tuple(t.strip().lower() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in FAMILIES]
    if bad or not names:
        raise ValueError(
            f"unknown strategy {bad[0] if bad else text!r} (known: {', '.join(FAMILIES)})"
        )
    return names


def _options(items: list[str]) -> dict[str, tuple[str, ...]]:
    out = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or key not in OPTIONS:
            raise ValueError(
                f"--option {item!r}: give KNOB=VALUES with KNOB one of {', '.join(OPTIONS)}"
            )
        chosen = tuple(v.strip().lower() for v in values.split(",") if v.strip())
        bad = [v for v in chosen if v not in OPTIONS[key]]
        if bad or not chosen:
            raise ValueError(f"--option {key}: {values!r} is not among {', '.join(OPTIONS[key])}")
        out[key] = chosen
    return out


def _check_mfu(args) -> None:
    if args.compute is not None and args.mfu is not None:
        raise ValueError("give --mfu or --compute, not both")
    if args.mfu is not None and not 0 < args.mfu <= 100:
        raise ValueError(f"--mfu {args.mfu:g}: a percentage above 0, at most 100")
    for run in args.compute or []:
        if not (run / "results.csv").is_file():
            raise ValueError(f"--compute {run}: not a run folder (no results.csv)")


def rates(
    args,
    target: Target,
    precisions: tuple[str, ...],
    out: Path,
    fsdp: tuple[str, ...] = (),
    ckpt: bool = False,
    tp: tuple[str, ...] = (),
) -> dict[str, Rate]:
    """Per precision, the computation's rate on the target: fitted to ``--compute`` runs (scaled
    by the target's peak over theirs), to short runs the planner makes here for a CPU target
    (``calibrated``), or the peak times an assumed MFU."""
    runs = list(args.compute or [])
    if not runs and not target.device.gpu_name and args.mfu is None:
        return calibrated(args, target, precisions, out, fsdp, ckpt, tp)
    return rates_of(runs, args, target, precisions)


def calibrated(
    args,
    target: Target,
    precisions: tuple[str, ...],
    out: Path,
    fsdp: tuple[str, ...],
    ckpt: bool,
    tp: tuple[str, ...] = (),
) -> dict[str, Rate]:
    """``rates`` fitted to one short launch here (``calibrate.calibration_launch``): DDP's
    points, and where the plan holds them, activation checkpointing's cost (``ckpt``) and the
    FSDP and TP implementations' own work (``fsdp``, ``tp``), at the plan's first precision and
    taken for every precision."""
    per_replica = args.global_batch // args.world_size or 1
    ranks = min(args.world_size, args.gpus_per_node)
    tp = tp if ranks > 1 else ()
    what = (
        ["DDP"]
        + (["checkpointing"] if ckpt else [])
        + [f"FSDP ({', '.join(fsdp)})"] * bool(fsdp)
        + [f"TP ({', '.join(tp)})"] * bool(tp)
    )
    print(
        f"calibrating: {args.model}, {', '.join(what)} on {ranks} ranks here, {per_replica} "
        "per replica, interleaved in one launch"
    )
    run = calibration_launch(
        args.model, precisions, per_replica, out / CALIBRATION, ranks, ckpt=ckpt, fsdp=fsdp, tp=tp
    )
    tables = launch_tables(run)
    o = _optimiser_ms(args, target)
    fitted = _scaled(fit_launch(tables, o, run), run, args, target, precisions)
    first = precisions[0]
    said, extra = [], {}
    if ckpt:
        recompute = recompute_ratio(args.model, per_replica)
        factor = launch_ckpt_factor(tables, run, first, fitted[first], o, recompute)
        said.append(f"checkpointing x{factor:.2f} its FLOPs' time")
        extra["ckpt_factor"] = factor
    ddp = at_precision(tables[ONE], first)
    if fsdp:
        extra["fsdp_ms"] = fsdp_extra(tables.get(FSDP, tables[ONE].iloc[:0]), ddp)
        own = ", ".join(
            f"{impl} {strategy} {ms:.1f} ms"
            for impl, by in sorted(extra["fsdp_ms"].items())
            for strategy, ms in sorted(by.items())
        )
        said.append(f"FSDP's own work per step: {own}")
    if tp:
        extra["tp_ms"] = tp_extra(tables.get(TP, tables[ONE].iloc[:0]), ddp)
        own = ", ".join(f"{impl} {ms:.1f} ms" for impl, ms in sorted(extra["tp_ms"].items()))
        said.append(f"TP's own work per step: {own or 'not measured (its point failed)'}")
    if not said:
        return fitted
    return {p: replace(r, **extra, source="; ".join([r.source, *said])) for p, r in fitted.items()}


def rates_of(runs: list[Path], args, target: Target, precisions: tuple[str, ...]):
    """``rates``' figures from the runs it has (none: the assumed or given MFU)."""
    if not runs:
        pct = DEFAULT_MFU_PCT if args.mfu is None else args.mfu
        how = "assumed" if args.mfu is None else "given"
        return {
            p: Rate(
                target.peak_tflops(p) * pct / 100,
                0.0,
                f"{how} MFU {pct:g} % of {target.peak_source(p)}",
            )
            for p in precisions
        }
    return _scaled(fit_rates(runs, _optimiser_ms(args, target)), runs[0], args, target, precisions)


def _scaled(fitted: dict[str, Rate], run: Path, args, target: Target, precisions) -> dict:
    """Fitted rates on the target: times its peak over the peak they were measured against
    (``run``'s), each precision the plan holds."""
    missing = [p for p in precisions if p not in fitted]
    if missing:
        raise ValueError(f"--compute: no {missing[0]} point of {args.model} to fit its rate from")
    # the same device when the target is this host: no ratio (two measurements of one peak)
    peaks_there = {
        p: _peak_of(run, p) if target.device.gpu_name else target.peak_tflops(p) for p in precisions
    }
    return {
        p: Rate(
            fitted[p].tflops * target.peak_tflops(p) / peaks_there[p],
            fitted[p].micro_ms * peaks_there[p] / target.peak_tflops(p),
            f"fitted ({fitted[p].source}), x{target.peak_tflops(p) / peaks_there[p]:.3g} peaks",
        )
        for p in precisions
    }


def _optimiser_ms(args, target: Target) -> float:
    """AdamW's step over the whole model on the target: what the fits take out of a DDP
    step's computation (ZeRO's 16 bytes of state per fp32 parameter)."""
    params = sum(param_bytes(args.model)) / 4
    return optimiser_ms(16 * params, target.device.bandwidth_GBps)


def _peak_of(run: Path, precision: str) -> float:
    """The peak a run's points of ``precision`` were measured against (its results.csv)."""
    df = read_results(run)
    rows = df[(df["status"] == "ok") & (df["value"].astype(str) == precision)]
    return float(rows["peak_tflops"].iloc[0]) if not rows.empty else math.nan


def _peaks(dev):
    """(precision -> peak TFLOP/s, precision -> its source) of the target device."""
    if not dev.gpu_name:
        import torch

        from bench.runner.measure.flops import measured_peak

        cpu = torch.device("cpu")
        return (lambda p: measured_peak(cpu, p).tflops), (lambda p: measured_peak(cpu, p).source)
    missing = [p for p in OPTIONS["precision"] if peaks.datasheet_peak(dev.gpu_name, p) is None]
    if missing:
        raise ValueError(f"device {dev.name} has no {missing[0]} datasheet peak")
    return (
        lambda p: peaks.datasheet_peak(dev.gpu_name, p).tflops,
        lambda p: peaks.datasheet_peak(dev.gpu_name, p).source,
    )


def _topology(args, dev) -> Topology:
    """The links, or with ``--collectives`` this machine's fitted collectives; on a CPU target
    the share of a core computation keeps beside gloo's thread (``predict.overlap_share``)."""
    share = 1.0
    if not dev.gpu_name:
        ranks_here = min(args.world_size, args.gpus_per_node)
        share = overlap_share({"device": "cpu", "ranks_per_node": ranks_here})
    if args.collectives is None:
        return Topology.of_links(args.link or DEFAULT_LINKS, args.gpus_per_node, share)
    try:
        return Topology.fitted(args.collectives, args.gpus_per_node, share)
    except (OSError, FitError) as e:
        raise ValueError(f"--collectives {args.collectives}: {e}") from None


def collectives_here(args, target: Target, out: Path) -> Topology:
    """The target's topology, but on a CPU target given neither ``--collectives`` nor
    ``--link``: this machine's collectives, measured by a short run on the ranks its
    computation is calibrated on (``calibrate.collectives_run``), and fitted."""
    ranks = min(args.world_size, args.gpus_per_node)
    if target.device.gpu_name or args.collectives is not None or args.link is not None:
        return target.topology
    if ranks < 2:  # nothing is communicated
        return target.topology
    print(f"calibrating: the collectives on {ranks} ranks here")
    run = collectives_run(out / "calibration", ranks)
    try:
        return Topology.fitted(run, args.gpus_per_node, target.topology.share)
    except (OSError, FitError) as e:
        raise ValueError(f"the collectives' calibration run {run}: {e}") from None


def resolve(args) -> tuple[Target, tuple[str, ...], dict[str, tuple[str, ...]]]:
    """(the target, the strategy families, the narrowed options), or a one-line ValueError."""
    try:
        wl = workload(args.model)
    except (KeyError, ValueError) as e:
        raise ValueError(str(e).strip("'\"")) from None
    del wl
    if args.world_size < 1 or args.gpus_per_node < 1:
        raise ValueError("--world-size and --gpus-per-node must be 1 or more")
    if args.world_size > args.gpus_per_node and args.world_size % args.gpus_per_node:
        raise ValueError(
            f"world size {args.world_size} is not a whole number of nodes of "
            f"{args.gpus_per_node} ranks"
        )
    if args.global_batch < 1:
        raise ValueError("--global-batch must be 1 or more")
    degrees = [d for d in (1, 2, 4, 8, 16) if d <= min(args.gpus_per_node, args.world_size)]
    if not any(micro_batches(args.global_batch, args.world_size // d) for d in degrees):
        raise ValueError(
            f"global batch {args.global_batch} does not split over the {args.world_size} ranks' "
            f"data-parallel replicas (nor over those of any TP degree within a node)"
        )
    dev = device(args.device)
    topology = _topology(args, dev)
    families, options = _families(args.strategy), _options(args.option)
    _check_mfu(args)
    allowance = args.allowance_gib
    if allowance is None:
        allowance = GPU_ALLOWANCE_GIB if dev.gpu_name else 0.0
    if not (allowance >= 0 and math.isfinite(allowance)):
        raise ValueError("--allowance-gib must be 0 or more")
    peak, source = _peaks(dev)
    target = Target(dev, topology, peak, source, allowance, args.global_batch)
    return target, families, options
