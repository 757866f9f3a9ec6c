"""Write synthetic traces laid out as Kineto writes them (one event per block, indented two
spaces), for tests that need traces of a chosen size or shape."""

from __future__ import annotations

import json
from pathlib import Path


def kineto_text(events: list[dict], meta: dict | None = None) -> str:
    head = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in (meta or {}).items())
    blocks = []
    for e in events:
        inner = {k: v for k, v in e.items() if k != "args"}
        lines = ["  {", "    " + json.dumps(inner)[1:-1] + ("," if "args" in e else "")]
        if "args" in e:
            lines += ['    "args": {', "      " + json.dumps(e["args"])[1:-1], "    }"]
        lines.append("  }")
        blocks.append("\n".join(lines))
    body = ",\n".join(blocks)
    return "{\n" + (head + ",\n" if head else "") + '  "traceEvents": [\n' + body + "\n]\n}\n"


def gpu_step_events(steps: int, kernels_per_step: int, rank: int = 0) -> list[dict]:
    """ProfilerStep windows on the CPU, each launching compute and NCCL kernels."""
    events, corr, t = [], 0, 0.0
    for s in range(steps):
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": rank,
                "tid": 1,
                "ts": t,
                "dur": 1000.0,
            }
        )
        for k in range(kernels_per_step):
            corr += 1
            launch = t + 1 + k * (900 / kernels_per_step)
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": rank,
                    "tid": 1,
                    "ts": launch,
                    "dur": 1.0,
                    "args": {"correlation": corr},
                }
            )
            name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL" if k % 4 == 0 else "sm90_gemm_kernel"
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": name,
                    "pid": rank,
                    "tid": 7,
                    "ts": launch + 5,
                    "dur": 3.0,
                    "args": {"correlation": corr, "stream": 7 + (k % 4 == 0)},
                }
            )
        t += 1000.0
    return events


def write_trace(path: Path, events: list[dict], meta: dict | None = None) -> Path:
    path.write_text(kineto_text(events, meta))
    return path
