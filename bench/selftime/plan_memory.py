"""The planner's predicted peak memory per rank against the harness's measured one, for every
strategy of the zoo's test models and the custom example, at 2 ranks, in one launch.

    python bench/selftime/plan_memory.py [--models llama:tiny,...] [--batch-size 8]
        [--ranks 2] [--gpu --backend nccl] [--layouts ddp,tp2]
        [--save-predictions F | --predictions F]

Predictions first, in this process (fake tensors over torch's fake process group: no weight
allocated); then one launch of ``--ranks`` ranks runs every point through the harness (its peak:
c10's or CUDA's allocator peak above what it held before the point's build) and the table
prints predicted / measured per point, with the largest error. The figures are in docs/plan.md.

On a GPU machine (``--gpu``: the plan's GPU target, AdamW foreach and no CPU kernel workspaces) the
predictions can be made beforehand on a machine without one (``--save-predictions``), and read
there (``--predictions``): the prediction then never sees the hardware. One GPU holds one NCCL
rank (``--ranks 1``) or several gloo ranks on CUDA tensors (``--backend gloo-cuda``: no
reduce-scatter, so DDP and TP only). On CUDA each point also reports the device memory the
allocator does not hold (the CUDA context, NCCL's and cuBLAS's buffers, per rank) and what the
allocator reserved over its peak: the figures behind the planner's ``--allowance-gib``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

MODELS = (
    "llama:tiny",
    "gpt2:tiny",
    "bert:tiny",
    "resnet:tiny",
    "examples/custom_model.py:workload",
)
LAYOUTS = (  # (label, strategy, impl, knobs)
    ("ddp", "ddp", "native", {}),
    ("ddp ckpt", "ddp", "native", {"activation_checkpointing": "on"}),
    ("fsdp2 FULL_SHARD", "fsdp", "native", {"sharding_strategy": "FULL_SHARD"}),
    ("fsdp2 SHARD_GRAD_OP", "fsdp", "native", {"sharding_strategy": "SHARD_GRAD_OP"}),
    ("fsdp2 NO_SHARD", "fsdp", "native", {"sharding_strategy": "NO_SHARD"}),
    ("fsdp1 FULL_SHARD", "fsdp", "native_fsdp1", {"sharding_strategy": "FULL_SHARD"}),
    ("fsdp1 NO_SHARD", "fsdp", "native_fsdp1", {"sharding_strategy": "NO_SHARD"}),
    ("tp2", "tp", "native", {"tp_degree": 2}),
)
STEPS = {"warmup_steps": 2, "steps": 3, "profile_steps": 1}


def _configs(models, batch, ranks, layouts):
    from bench.plan.families import family_of
    from bench.plan.space import Config
    from parallel_kernels.models import workload

    out = []
    for m in models:
        for label, strategy, impl, knobs in LAYOUTS:
            if layouts and label not in layouts:
                continue
            if strategy == "tp" and (workload(m).tp_plan is None or ranks % knobs["tp_degree"]):
                continue
            full = {"activation_checkpointing": "off", "precision": "fp32", "grad_accum": 1}
            family = family_of(strategy, impl)
            out.append(Config(family, label, m, strategy, impl, {**full, **knobs}, batch, ranks))
    return out


def predict(models, batch, ranks=2, gpu=False, layouts=()) -> list[dict]:
    from bench.plan.memory import track_config

    rows = []
    for c in _configs(models, batch, ranks, layouts):
        t = track_config(c, 8, gpu=gpu)
        rows.append(
            {
                "model": c.model,
                "layout": c.label,
                "predicted_mib": t.peak_mib,
                "how": t.how,
                "error": t.error,
                "point": json.loads(c.point().to_json()),
            }
        )
    return rows


def _outside_allocator_mib(env) -> float:
    """The device memory this rank holds outside torch's allocator: what the GPU has in use less
    what every rank's allocator reserved, shared among the ranks on it (one GPU here)."""
    import torch
    import torch.distributed as dist

    free, total = torch.cuda.mem_get_info()
    reserved = torch.tensor([float(torch.cuda.memory_reserved())], device=env.device)
    dist.all_reduce(reserved)
    return ((total - free) - reserved.item()) / env.world_size / 2**20


def measure(points_file: Path, out_file: Path, backend: str = "auto") -> None:
    """In the launch: every point through the harness; rank 0 writes the peaks."""
    import torch.distributed as dist

    from bench.runfolder.points import PointRecord
    from bench.runner.session.distenv import init_distributed
    from bench.runner.train.lifecycle import PointSettings, run_point

    env = init_distributed(backend=backend)
    cuda = env.device.type == "cuda"
    rows = json.loads(points_file.read_text())
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(rows):
            point = replace(PointRecord.from_dict(r["point"]), **STEPS)
            got = run_point(point, env, PointSettings(), Path(tmp) / f"{i}").as_dict()
            outside = _outside_allocator_mib(env) if cuda else float("nan")
            if env.is_main:
                measured.append(
                    {
                        "measured_mib": got.get("peak_mem_mb"),
                        "reserved_mib": got.get("peak_reserved_mb", float("nan")),
                        "outside_mib": outside,
                        "left_mib": got.get("mem_left_mb", float("nan")),
                        "kept_mib": got.get("mem_kept_mb", float("nan")),
                        "status": got["status"],
                        "run_error": got.get("error", ""),
                    }
                )
    if env.is_main:
        out_file.write_text(json.dumps(measured))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ranks", type=int, default=2, help="the launch's world size (default 2)")
    p.add_argument("--gpu", action="store_true", help="predict for a GPU target (see above)")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl", "gloo-cuda"))
    p.add_argument("--layouts", default="", help="comma-separated labels (default: all)")
    p.add_argument("--save-predictions", type=Path, help="predict, write them here, and stop")
    p.add_argument("--predictions", type=Path, help="read the predictions instead of making them")
    p.add_argument("--measure", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        measure(*args.measure, backend=args.backend)
        return 0
    if args.predictions:
        if not args.predictions.is_file():
            print(f"plan_memory: no predictions file {args.predictions}", file=sys.stderr)
            return 2
        rows = json.loads(args.predictions.read_text())
    else:
        models = [m for m in args.models.split(",") if m]
        layouts = tuple(x for x in args.layouts.split(",") if x)
        rows = predict(models, args.batch_size, args.ranks, args.gpu, layouts)
    if args.save_predictions:
        args.save_predictions.write_text(json.dumps(rows))
        print(f"{len(rows)} predictions in {args.save_predictions}")
        return 0
    ranks = {r["point"]["world_size"] for r in rows}
    if len(ranks) != 1:
        print(f"plan_memory: predictions at several world sizes {sorted(ranks)}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        points, out = Path(tmp) / "points.json", Path(tmp) / "measured.json"
        points.write_text(json.dumps(rows))
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks.pop()}",
            __file__,
            "--backend",
            args.backend,
            "--measure",
            str(points),
            str(out),
        ]
        subprocess.run(cmd, check=True, env=env)
        measured = json.loads(out.read_text())
    _print(rows, measured)
    return 0


def _print(rows: list[dict], measured: list[dict]) -> None:
    worst = 0.0
    nan = float("nan")
    print(
        f"{'model':36} {'layout':20} {'predicted':>10} {'measured':>10} {'ratio':>7} "
        f"{'reserved':>9} {'outside':>8} {'left':>7} {'kept':>6}  how"
    )
    for r, m in zip(rows, measured, strict=True):
        ok = m["status"] == "ok" and not r["error"]
        ratio = r["predicted_mib"] / m["measured_mib"] if ok and m["measured_mib"] else nan
        if ratio == ratio:
            worst = max(worst, abs(ratio - 1))
        why = r["error"] or m["run_error"] or r["how"]
        print(
            f"{r['model']:36} {r['layout']:20} {r['predicted_mib']:10.2f} "
            f"{(m['measured_mib'] or nan):10.2f} {ratio:7.3f} "
            f"{m.get('reserved_mib', nan):9.1f} {m.get('outside_mib', nan):8.1f} "
            f"{m.get('left_mib', nan):7.2f} {m.get('kept_mib', nan):6.2f}  {why[:70]}"
        )
    print(f"largest error: {100 * worst:.1f} % (target: 5 %); reserved: the allocator's peak")
    print("reservation; outside: device memory in use outside the allocator, per rank; left:")
    print("what the point left in use once released, taken off its measured peak but for")
    print("kept: its own state still alive (an implementation's leak, MiB)")


if __name__ == "__main__":
    raise SystemExit(main())
