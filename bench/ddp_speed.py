"""Reference vs native DDP step time, measured in one launch.

    torchrun --standalone --nproc_per_node=2 bench/ddp_speed.py [--model wide_mlp]

Implementations are interleaved round by round (native, reference, reference_nooverlap, native,
...) so that machine drift hits them alike; each round builds the model afresh, warms up, and
times steps with the harness's timing (slowest rank per step). The figure printed is the median
over rounds of each implementation's median step time, and their ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch
import torch.distributed as dist

from bench.data import Batches
from bench.distenv import init_distributed, rank0_print
from bench.timing import timed_steps
from parallel_kernels.models import MODELS, build_model
from parallel_kernels.strategies import STRATEGIES

TARGET = 1.10


def measure(impl: str, args, env) -> float:
    spec = MODELS[args.model]
    model = build_model(args.model).to(env.device)
    wrapped = STRATEGIES["ddp"].apply(
        impl, model, group=None, device=env.device, bucket_cap_mb=args.bucket_cap_mb
    )
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    data = spec.dataset(args.batch_size * env.world_size * 8, 0)
    batches = Batches(
        data,
        batch_size=args.batch_size,
        rank=env.rank,
        world_size=env.world_size,
        device=env.device,
    )

    def step() -> None:
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        spec.loss(wrapped(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    slowest, _ = timed_steps(step, args.steps, device=env.device, group=None)
    return float(np.median(slowest))


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/ddp_speed.py")
    p.add_argument("--model", default="wide_mlp", choices=list(MODELS))
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--impl", default="native,reference,reference_nooverlap")
    args = p.parse_args()
    env = init_distributed()
    impls = args.impl.split(",")
    times: dict[str, list[float]] = {i: [] for i in impls}
    for r in range(args.rounds):
        for impl in impls:
            times[impl].append(measure(impl, args, env))
        rank0_print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{i} {times[i][-1]:.1f} ms" for i in impls)
        )
    med = {i: float(np.median(t)) for i, t in times.items()}
    rank0_print(
        f"\n{args.model}, bucket_cap_mb={args.bucket_cap_mb:g}, world size "
        f"{env.world_size}, {env.backend} on {env.device.type}"
    )
    for i in impls:
        rank0_print(
            f"  {i:<22} median step {med[i]:8.2f} ms  (rounds: "
            + ", ".join(f"{t:.1f}" for t in times[i])
            + ")"
        )
    if "native" in med and "reference" in med:
        ratio = med["reference"] / med["native"]
        rank0_print(
            f"reference/native step-time ratio: {ratio:.3f} (target <= {TARGET:.2f}: "
            f"{'met' if ratio <= TARGET else 'MISSED'})"
        )
    if "reference_nooverlap" in med and "reference" in med:
        rank0_print(
            "reference_nooverlap/reference step-time ratio: "
            f"{med['reference_nooverlap'] / med['reference']:.3f} (what overlap saves)"
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
