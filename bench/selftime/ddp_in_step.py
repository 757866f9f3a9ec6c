"""What a data-parallel step pays for its all-reduce, against the same all-reduce alone.

    torchrun --standalone --nproc_per_node=2 bench/selftime/ddp_in_step.py \\
        [--widths 64,128,256] [--batch 8] [--rounds 2] [--steps 15]

The step costs' transformer (``bench.roofline.step_cost``) under native DDP at its default
buckets, at each width: its step; the same step under ``no_sync``, which skips the all-reduce;
the all-reduce of its gradients alone; and, on rank 0 once the group is gone, the step in one
process. Each timed call starts at a barrier, the figures are rank 0's medians, the three
alternate round by round. The step's all-reduce is DDP's step less its ``no_sync`` twin; the
planner prices it at what the collectives sweep fits, which the all-reduce alone stands for
here. On this 2-core CPU a 2-rank step paid two to six times that (docs/benchmarks.md, "The
planner on the roofline"): what a plan without a calibration launch misses.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bench.roofline.step_cost import SEQ, VOCAB, Transformer
from bench.runner.session.distenv import init_distributed, rank0_print, synchronize

WARMUP = 3


@dataclass(frozen=True)
class Timing:
    batch: int  # samples a rank a step
    rounds: int  # rounds the three figures alternate over
    steps: int  # timed calls a figure a round


def _median_ms(fn: Callable[[], object], steps: int, device: torch.device, barrier: bool) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(steps):
        if barrier:
            dist.barrier()
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _step(model: torch.nn.Module, device: torch.device, batch: int, sync: Callable):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=device.type == "cuda")
    ids = torch.randint(0, VOCAB, (batch, SEQ), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with sync():
            F.cross_entropy(model(ids).flatten(0, 1), ids.flatten()).backward()
        opt.step()

    return step


def in_group(width: int, timing: Timing, device: torch.device) -> dict[str, float]:
    """DDP's step, its ``no_sync`` twin and the all-reduce alone, medians over the rounds."""
    torch.manual_seed(0)
    plain = Transformer(width).to(device)
    grads = torch.zeros(sum(p.numel() for p in plain.parameters()), device=device)
    ddp = torch.nn.parallel.DistributedDataParallel(plain)
    calls = {
        "ddp_ms": _step(ddp, device, timing.batch, contextlib.nullcontext),
        "no_sync_ms": _step(ddp, device, timing.batch, ddp.no_sync),
        "all_reduce_ms": lambda: dist.all_reduce(grads),
    }
    rounds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(timing.rounds):
        for name, fn in calls.items():
            rounds[name].append(_median_ms(fn, timing.steps, device, barrier=True))
    out = {name: statistics.median(v) for name, v in rounds.items()}
    out["grads_mb"] = grads.numel() * grads.element_size() / 2**20
    return out


def alone(width: int, timing: Timing, device: torch.device) -> float:
    """The same step in this one process, no group."""
    torch.manual_seed(0)
    step = _step(Transformer(width).to(device), device, timing.batch, contextlib.nullcontext)
    return _median_ms(step, timing.steps, device, barrier=False)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--widths", default="64,128,256", help="comma list of the model's widths")
    p.add_argument("--batch", type=int, default=8, help="samples a rank a step")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=15, help="timed calls a figure a round")
    args = p.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    timing = Timing(args.batch, args.rounds, args.steps)
    env = init_distributed()
    figures = {w: in_group(w, timing, env.device) for w in widths}
    rank = dist.get_rank()
    dist.destroy_process_group()
    if rank != 0:
        return
    rank0_print(
        f"{env.world_size} ranks, {env.backend} on {env.device.type}, batch {args.batch}\n"
        "| width | gradients MB | one process ms | no_sync ms | DDP ms | all-reduce alone ms "
        "| all-reduce in the step ms | in the step / alone |\n|---|---|---|---|---|---|---|---|"
    )
    for w, f in figures.items():
        in_step = f["ddp_ms"] - f["no_sync_ms"]
        rank0_print(
            f"| {w} | {f['grads_mb']:.2f} | {alone(w, timing, env.device):.2f} "
            f"| {f['no_sync_ms']:.2f} | {f['ddp_ms']:.2f} | {f['all_reduce_ms']:.2f} "
            f"| {in_step:.2f} | {in_step / f['all_reduce_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
