"""What a data-parallel step pays for its all-reduce, against the same all-reduce alone.

    torchrun --standalone --nproc_per_node=2 bench/selftime/ddp_in_step.py \\
        [--widths 64,128,256] [--batch 8] [--rounds 2] [--steps 15]

The step costs' transformer (``bench.roofline.step_cost``) under native DDP at its default
buckets, at each width: its step; the same step under ``no_sync``, which skips the all-reduce;
the all-reduce of its gradients alone; and, on rank 0 once the group is gone, the step in one
process. Each timed call starts at a barrier, the figures are rank 0's medians, the three
alternate round by round (``bench.roofline.step_comm``, whose factor a plan made without a
calibration launch prices its collectives by). The step's all-reduce is DDP's step less its
``no_sync`` twin; the collectives sweep measures what the all-reduce alone stands for here. On
this 2-core CPU a 2-rank step paid two to six times that (docs/benchmarks.md, "The planner on
the roofline").
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist

from bench.roofline.step_comm import Timing, in_group, median_ms, training_step
from bench.roofline.step_cost import Transformer
from bench.runner.session.distenv import init_distributed, rank0_print


def alone(width: int, timing: Timing, device: torch.device) -> float:
    """The same step in this one process, no group."""
    torch.manual_seed(0)
    step = training_step(
        Transformer(width).to(device), device, timing.batch, contextlib.nullcontext
    )
    return median_ms(step, timing.steps, device, barrier=False)


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
