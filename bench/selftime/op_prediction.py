"""Each op of a plain training loop priced on this CPU's roofline against its time in a trace:
the per-op prediction table of docs/benchmarks.md ("Per-op prediction on this CPU").

    python -m bench.selftime.op_prediction [--models llama:tiny,gpt2:tiny,bert:tiny]
        [--batch-size 8] [--warmup 3] [--steps 3] [--device-profile FILE] [--ops 4]
        [--fastest-of-steps]

One process, one thread (``torch.set_num_threads(1)``, as the suite's CPU runs): per model a
plain loop (forward, loss, backward, AdamW) warmed up, then profiled with ``record_shapes``
like a user's own ``torch.profiler`` run; its trace is read back and every top-level op priced
alone on this host's measured profile (``host_profile("cpu")``, or ``--device-profile``) by
``bench.analysis.op_accuracy``. It prints the summary per model and class, then per model and
class the ``--ops`` ops with the most time priced away from their measured time.
``--fastest-of-steps`` holds each op of a step at its fastest call over the profiled steps
(``op_accuracy.fastest_of_steps``): the figure to take on a machine other jobs load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pandas as pd

MODELS = ("llama:tiny", "gpt2:tiny", "bert:tiny")


@dataclass(frozen=True)
class Loop:
    """What each model's profiled loop runs: ``batch`` samples a step, ``warmup`` steps
    before the profiler starts, ``steps`` profiled."""

    batch: int = 8
    warmup: int = 3
    steps: int = 3


def trace_of(name: str, loop: Loop, folder: Path) -> Path:
    """The trace of ``loop`` on model ``name``, written under ``folder``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    from parallel_kernels.models import workload

    wl = workload(name)
    torch.manual_seed(0)
    model = wl.build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs, targets = wl.batch(loop.batch, 0)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        wl.compute_loss(wl.forward(model, inputs), targets).backward()
        opt.step()

    for _ in range(loop.warmup):
        step()
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=loop.steps),
        on_trace_ready=tensorboard_trace_handler(str(folder)),
    ) as p:
        for _ in range(loop.steps + 1):
            step()
            p.step()
    (path,) = folder.glob("*.pt.trace.json")
    return path


def worst(ops: pd.DataFrame, n: int) -> pd.DataFrame:
    """Per class, the ``n`` ops whose priced time is furthest from their measured time."""
    gap = (ops["priced_us"] - ops["measured_us"]).abs()
    ranked = ops.assign(gap=gap).sort_values("gap", ascending=False)
    return ranked.groupby("op_class", sort=False).head(n).drop(columns="gap")


def _cell(v) -> str:
    if isinstance(v, float):
        return "" if v != v else f"{v:.3g}"
    return str(v)


def _table(df: pd.DataFrame) -> str:
    """A markdown table, times in ms and percentages rounded, as docs/benchmarks.md shows it."""
    us = [c for c in df.columns if c.endswith("_us")]
    out = df.assign(**{c: df[c] / 1e3 for c in us})
    out = out.rename(columns={c: c.removesuffix("_us") + "_ms" for c in us})
    cols = list(out.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in out.itertuples(False)]
    return "\n".join(lines)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.selftime.op_prediction")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch-size", type=int, default=Loop.batch)
    ap.add_argument("--warmup", type=int, default=Loop.warmup)
    ap.add_argument("--steps", type=int, default=Loop.steps)
    ap.add_argument("--device-profile", type=Path, default=None)
    ap.add_argument("--ops", type=int, default=4, help="worst ops shown per model and class")
    ap.add_argument(
        "--fastest-of-steps",
        action="store_true",
        help="each op of a step at its fastest call over the steps (a loaded machine)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    import torch

    from bench.analysis.breakdown import load_trace
    from bench.analysis.op_accuracy import fastest_of_steps, op_accuracy, per_op, summary
    from bench.console import fail
    from bench.roofline.measure import host_profile
    from bench.roofline.profile import RooflineError, read

    torch.set_num_threads(1)
    try:
        roofline = read(args.device_profile) if args.device_profile else host_profile("cpu")
    except RooflineError as e:
        fail(str(e))
    loop = Loop(args.batch_size, args.warmup, args.steps)
    summaries, ops = [], []
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory() as d:
            try:
                path = trace_of(name, loop, Path(d))
            except ValueError as e:
                fail(str(e).splitlines()[0])
            acc = op_accuracy(load_trace(path), roofline)
        calls = fastest_of_steps(acc.calls) if args.fastest_of_steps else acc.calls
        summaries.append(summary(calls).assign(model=name))
        ops.append(worst(per_op(calls), args.ops).assign(model=name))
        for line in acc.unpriced:
            print(f"{name}: not priced: {line}")
    print(f"profile: {roofline.device}; {roofline.source}")
    for tables in (summaries, ops):
        df = pd.concat(tables, ignore_index=True)
        print(_table(df[["model", *[c for c in df.columns if c != "model"]]]))
        print()


if __name__ == "__main__":
    main()
