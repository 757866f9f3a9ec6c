"""Reference vs native step time (and peak memory), measured in one launch.

    torchrun --standalone --nproc_per_node=2 bench/selftime/speed.py                 # DDP, wide_mlp
    torchrun --standalone --nproc_per_node=2 bench/selftime/speed.py --strategy fsdp  # FULL_SHARD
    torchrun --standalone --nproc_per_node=2 bench/selftime/speed.py --strategy tp    # TP degree 2

Implementations are interleaved round by round (native, reference, ..., native, ...) so that machine
drift hits them alike; each round builds the model afresh, warms up, and times steps with the
harness's timing (slowest rank per step). The figure printed is the median over rounds of each
implementation's median step time, and their ratio. Peak memory is the harness's
(``bench.runner.measure.peak_memory.point_memory``: the allocator's bytes at a step's peak, above
what it held before the model was built), the largest over ranks. Communication per step is read
from a profiled run of each implementation (the bytes the traces record), and compared.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import torch
import torch.distributed as dist

from bench.analysis import breakdown as analysis
from bench.analysis.breakdown import load_trace
from bench.runfolder.points import PointRecord
from bench.runner.configure.resolve import PointRequest, VisitSettings, resolve_point
from bench.runner.measure.peak_memory import point_memory
from bench.runner.measure.profiling import profile_steps
from bench.runner.measure.timing import timed_steps
from bench.runner.session.distenv import init_distributed, rank0_print
from bench.runner.train.step import build_trainer
from parallel_kernels.knobs import KNOBS
from parallel_kernels.strategies import STRATEGIES

TARGETS = {"ddp": 1.10, "fsdp": 1.20, "tp": 1.15}  # reference/native step time, from the issues
DEFAULT_MODEL = {"ddp": "wide_mlp", "fsdp": "transformer", "tp": "wide_mlp"}
COMPARED_AT = {"tp": {"tp_degree": 2}}  # the comparison: TP degree 2


def point(impl: str, args, env) -> PointRecord:
    """The implementation's point: the suite's own resolution, at the chosen knobs."""
    return resolve_point(
        PointRequest(
            sweep="speed",
            values={"impl": impl},
            model=args.model,
            strategy=args.strategy,
            impl=impl,
            knobs=args.options,
            world_size=env.world_size,
            per_visit=VisitSettings(batch_size=args.batch_size),
        )
    )


def peak_memory(impl: str, args, env) -> float:
    """The harness's peak_mem_mb for the implementation, in bytes (largest rank): the most
    bytes live at once in a step, above what the allocator held before the model was built,
    less what its release leaves and its data set (``point_memory``)."""
    metrics = point_memory(
        lambda: build_trainer(point(impl, args, env), env, None),
        lambda trainer: trainer.step(),
        device=env.device,
    )
    t = torch.tensor([metrics["peak_mem_mb"] * 2**20], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def measure(impl: str, args, env) -> float:
    """Median step time (first start to last end over the ranks) of a freshly built model:
    the harness's own step."""
    step = build_trainer(point(impl, args, env), env, None).step
    for _ in range(args.warmup):
        step()
    times, _ = timed_steps(step, args.steps, device=env.device, group=None)
    return float(np.median(times))


def comm_bytes(impl: str, args, env) -> float:
    """Bytes this rank hands to collectives per step, read from a profiled run's trace."""
    step = build_trainer(point(impl, args, env), env, None).step
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = profile_steps(
            step,
            trace_dir=Path(tmp),
            worker_name=f"rank{env.rank}",
            device=env.device,
            wait=1,
            warmup=1,
            active=2,
        )
        metrics = analysis.summarize(analysis.breakdown(load_trace(path)))
    return float(metrics["comm_bytes_per_step"])


def parse_option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or key not in KNOBS:
        raise argparse.ArgumentTypeError(f"{text!r} is not KNOB=VALUE (knobs: {', '.join(KNOBS)})")
    try:
        return KNOBS[key].param, KNOBS[key].parse(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _print_ratios(strategy: str, med: dict, peaks: dict, comm: dict) -> None:
    """The ratios between the implementations measured (median step, peak memory, comm)."""
    if "native" in med and "reference" in med:
        ratio, target = med["reference"] / med["native"], TARGETS[strategy]
        rank0_print(
            f"reference/native step-time ratio: {ratio:.3f} (target <= {target:.2f}: "
            f"{'met' if ratio <= target else 'MISSED'})"
        )
        rank0_print(
            f"reference/native peak-memory ratio: {peaks['reference'] / peaks['native']:.3f}"
        )
    if "accelerate" in med and "native" in med:
        rank0_print(
            f"accelerate/native step-time ratio: {med['accelerate'] / med['native']:.3f} "
            "(what the convenience layer costs)"
        )
    if "naive" in med and "reference" in med:
        rank0_print(
            f"naive/reference communication bytes per step: {comm['naive'] / comm['reference']:.2f}"
            f", step time: {med['naive'] / med['reference']:.3f} (what Megatron's pairing saves)"
        )
    if "reference_nooverlap" in med and "reference" in med:
        rank0_print(
            "reference_nooverlap/reference step-time ratio: "
            f"{med['reference_nooverlap'] / med['reference']:.3f} (what overlap saves)"
        )


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/selftime/speed.py")
    p.add_argument("--strategy", default="ddp", choices=list(STRATEGIES))
    p.add_argument("--model", help="default: wide_mlp for ddp, transformer for fsdp")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        type=parse_option,
        help="a knob, e.g. bucket_cap_mb=25 or sharding_strategy=FULL_SHARD (repeatable)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--impl", help="comma list (default: every implementation of the strategy)")
    args = p.parse_args()
    strategy = STRATEGIES[args.strategy]
    args.model = args.model or DEFAULT_MODEL.get(args.strategy, "transformer")
    args.options = COMPARED_AT.get(args.strategy, {}) | dict(args.option)
    env = init_distributed()
    impls = args.impl.split(",") if args.impl else list(strategy.impls)
    times: dict[str, list[float]] = {i: [] for i in impls}
    for r in range(args.rounds):
        for impl in impls:
            times[impl].append(measure(impl, args, env))
        rank0_print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{i} {times[i][-1]:.1f} ms" for i in impls)
        )
    peaks = {i: peak_memory(i, args, env) for i in impls}
    comm = {i: comm_bytes(i, args, env) for i in impls}
    med = {i: float(np.median(t)) for i, t in times.items()}
    opts = ", ".join(f"{k}={v}" for k, v in point(impls[0], args, env).knobs.items())
    rank0_print(
        f"\n{args.strategy} ({opts}), {args.model}, world size {env.world_size}, "
        f"{env.backend} on {env.device.type}"
    )
    for i in impls:
        rank0_print(
            f"  {i:<22} median step {med[i]:8.2f} ms  peak memory "
            f"{peaks[i] / 2**20:8.1f} MB  comm {comm[i] / 1e6:8.2f} MB/step  (rounds: "
            + ", ".join(f"{t:.1f}" for t in times[i])
            + ")"
        )
    _print_ratios(args.strategy, med, peaks, comm)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
