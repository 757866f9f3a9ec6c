"""The planner's predicted peak memory per rank against the harness's measured one, for every
strategy of the zoo's test models and the custom example, at 2 ranks, in one launch.

    python bench/selftime/plan_memory.py [--models llama:tiny,...] [--batch-size 8]

Predictions first, in this process (fake tensors over torch's fake process group: no weight
allocated); then one 2-rank launch runs every point through the harness (its peak: the CPU heap
above what the process held before the point, or CUDA's allocator peak) and the table prints
predicted / measured per point, with the largest error. The figures are in docs/plan.md.
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
    ("tp2", "tp", "native", {"tp_degree": 2}),
)
STEPS = {"warmup_steps": 2, "steps": 3, "profile_steps": 1}


def _configs(models, batch):
    from bench.plan.space import Config
    from parallel_kernels.models import workload

    out = []
    for m in models:
        for label, strategy, impl, knobs in LAYOUTS:
            if strategy == "tp" and workload(m).tp_plan is None:
                continue
            full = {"activation_checkpointing": "off", "precision": "fp32", "grad_accum": 1}
            out.append(Config(label, label, m, strategy, impl, {**full, **knobs}, batch, 2))
    return out


def predict(models, batch) -> list[dict]:
    from bench.plan.scaling import track_config

    rows = []
    for c in _configs(models, batch):
        t = track_config(c, 8)
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


def measure(points_file: Path, out_file: Path) -> None:
    """In the 2-rank launch: every point through the harness; rank 0 writes the peaks."""
    import torch.distributed as dist

    from bench.runfolder.points import PointRecord
    from bench.runner.session.distenv import init_distributed
    from bench.runner.train.harness import HarnessConfig, run_point

    env = init_distributed()
    rows = json.loads(points_file.read_text())
    measured = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(rows):
            point = replace(PointRecord.from_dict(r["point"]), **STEPS)
            got = run_point(point, env, HarnessConfig(), Path(tmp) / f"{i}")
            if env.is_main:
                measured.append(
                    {
                        "measured_mib": got.get("peak_mem_mb"),
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
    p.add_argument("--measure", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        measure(*args.measure)
        return 0
    models = [m for m in args.models.split(",") if m]
    rows = predict(models, args.batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        points, out = Path(tmp) / "points.json", Path(tmp) / "measured.json"
        points.write_text(json.dumps(rows))
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            __file__,
            "--measure",
            str(points),
            str(out),
        ]
        subprocess.run(cmd, check=True, env=env)
        measured = json.loads(out.read_text())
    worst = 0.0
    print(f"{'model':36} {'layout':20} {'predicted':>10} {'measured':>10} {'ratio':>7}  how")
    for r, m in zip(rows, measured, strict=True):
        ok = m["status"] == "ok" and not r["error"]
        ratio = r["predicted_mib"] / m["measured_mib"] if ok and m["measured_mib"] else float("nan")
        if ratio == ratio:
            worst = max(worst, abs(ratio - 1))
        why = r["error"] or m["run_error"] or r["how"]
        print(
            f"{r['model']:36} {r['layout']:20} {r['predicted_mib']:10.2f} "
            f"{(m['measured_mib'] or float('nan')):10.2f} {ratio:7.3f}  {why[:70]}"
        )
    print(f"largest error: {100 * worst:.1f} % (target: 5 %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
