"""``python -m bench.plan``: every configuration of a model at the scale it will run, memory and
step time predicted, ranked; the best verified here with ``--verify K``.

    python -m bench.plan --model llama:1b --world-size 64 --gpus-per-node 8 --device h100 \\
        --link nvlink4,ib_ndr --global-batch 512 [--strategy ddp,fsdp2,fsdp1,tp] \\
        [--option precision=bf16] [--mfu 40 | --compute RUN] [--allowance-gib 2] [--out DIR]

Bad input (an unknown model, device, link, strategy or option; a world size the nodes cannot
divide; a global batch no layout splits) prints one line and exits 2 before any work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import bench.plan.one_thread  # noqa: F401 - first: one thread before torch loads
from bench.plan import inputs, table
from bench.plan.plan_page import write_page
from bench.plan.planner import plan_rows
from bench.plan.space import enumerate_space, names_checkpoint_units
from bench.runfolder.atomic import OutputError, write_text, write_with
from parallel_kernels.strategies import STRATEGIES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        print(f"bench.plan: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m bench.plan", description=__doc__.splitlines()[0])
    _target(p)
    _how(p)
    return p


def _target(p: argparse.ArgumentParser) -> None:
    """What is planned: the model, the machines and links, the batch, the space."""
    p.add_argument("--model", required=True, help="a model of the zoo or the registry")
    p.add_argument("--world-size", type=int, required=True, help="ranks the job will run on")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default 8)")
    p.add_argument("--device", default="h100", help="h100, h200, a100, a100_40g, b200, cpu")
    p.add_argument(
        "--link",
        help="intra-node[,inter-node] link presets (bench.model.links) or alpha=..,bw=.. "
        "(default nvlink4,ib_ndr; on --device cpu, this machine's collectives measured)",
    )
    p.add_argument(
        "--collectives",
        type=Path,
        help="a --sweep message_size run of this machine: its fitted collectives for both links",
    )
    p.add_argument("--global-batch", type=int, required=True, help="samples per optimiser step")
    p.add_argument("--strategy", help="comma list of ddp, fsdp2, fsdp1, tp (default all)")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KNOB=VALUES",
        help="narrow a dimension: activation_checkpointing=off, precision=bf16 (repeatable)",
    )


def _how(p: argparse.ArgumentParser) -> None:
    """How it is predicted, verified and shown."""
    p.add_argument(
        "--mfu", type=float, help="assumed model FLOPs utilisation, %% (default 40 on GPUs)"
    )
    p.add_argument(
        "--compute",
        type=lambda t: [Path(x) for x in t.split(",") if x],
        help="RUN[,RUN]: --sweep precision runs of the model on one rank (one micro-batch, "
        "and accumulated ones) to fit the computation's rate to (default on cpu: made here)",
    )
    p.add_argument(
        "--allowance-gib",
        type=float,
        help="memory per rank the allocator does not see (default 2 on GPUs, 0 on cpu)",
    )
    p.add_argument(
        "--tie-pct",
        type=float,
        default=15.0,
        help="predicted steps within this of the best are tied with it (default 15: the "
        "step-time error the planner is held to, docs/plan.md)",
    )
    p.add_argument(
        "--verify",
        type=int,
        default=0,
        metavar="K",
        help="run the K best here (a plan for this machine: --device cpu) and compare",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=min(8, os.cpu_count() or 1),
        help="processes tracking configurations at once (default: the cores, at most 8)",
    )
    p.add_argument("--top", type=int, default=15, help="rows printed (default 15)")
    p.add_argument("--out", type=Path, help="folder for plan.csv (default results/plan-...)")


def _measured(args, target, configs: list, out: Path):
    """The target with its computation's rates and its links, measured here where the plan
    is for this machine (``inputs.rates``, ``inputs.collectives_here``)."""
    precisions = tuple(dict.fromkeys(c.knobs["precision"] for c in configs))
    # what a calibrated CPU plan measures beyond DDP: the FSDP and TP implementations' own
    # work, and checkpointing's cost, where the plan holds them
    fsdp = tuple(
        dict.fromkeys(c.impl for c in configs if STRATEGIES[c.strategy].schedule == "fsdp")
    )
    # a model without checkpoint units has no checkpointed row to time: its point would fail
    ckpt = names_checkpoint_units(args.model) and any(
        c.knobs["activation_checkpointing"] == "on" for c in configs
    )
    tp = tuple(dict.fromkeys(c.impl for c in configs if STRATEGIES[c.strategy].schedule == "tp"))
    target = replace(target, rates=inputs.rates(args, target, precisions, out, fsdp, ckpt, tp))
    return replace(target, topology=inputs.collectives_here(args, target, out))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verify and (args.device != "cpu" or args.verify < 0):
        print(
            "bench.plan: --verify K runs the plan's best here: plan for this machine "
            "(--device cpu, --world-size the ranks to launch here)",
            file=sys.stderr,
        )
        return 2
    try:
        target, families, options = inputs.resolve(args)
    except ValueError as e:
        print(f"bench.plan: {e}", file=sys.stderr)
        return 2
    configs = enumerate_space(
        args.model,
        world_size=args.world_size,
        gpus_per_node=args.gpus_per_node,
        global_batch=args.global_batch,
        families=families,
        options=options,
    )
    if not configs:
        print("bench.plan: no configuration of the space makes that global batch", file=sys.stderr)
        return 2
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("results") / f"plan-{stamp}-{args.model.replace(':', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    try:
        target = _measured(args, target, configs, out)
    except (ValueError, OSError, subprocess.SubprocessError) as e:
        print(f"bench.plan: {e}", file=sys.stderr)
        return 2
    print(table.header(args, target, len(configs)), flush=True)
    t0 = time.perf_counter()
    rows = plan_rows(
        configs,
        target,
        gpus_per_node=args.gpus_per_node,
        workers=max(1, args.workers),
        progress=table.progress_printer(),
    )
    took = time.perf_counter() - t0
    meta = table.meta(args, target, took, len(configs))
    try:
        return _outputs(args, rows, meta, out, f"in {took:.1f} s")
    except OutputError as e:  # a full disk: whatever was written before is whole
        print(f"bench.plan: {e}", file=sys.stderr)
        return 1


def _outputs(args, rows, meta: dict, out: Path, took: str) -> int:
    """plan.csv, plan.json and plan.html, each whole or not at all, the table, and the
    verification where asked for (verify.csv, plan.json again with its summary)."""
    write_with(out / "plan.csv", lambda f: rows.to_csv(f, index=False))
    write_text(out / "plan.json", json.dumps(meta, indent=2, default=str) + "\n")
    page = write_page(rows, meta, args.tie_pct, out / "plan.html")
    print(table.render(rows, args.top, args.tie_pct))
    print(f"planned {meta['configurations']} configurations {took}; {out / 'plan.csv'}, {page}")
    if args.verify:
        # imported here: it brings scipy (0.8 s of a plan's start), which only a verification uses
        from bench.plan.verify import verify

        checked, summary = verify(rows, args.verify, args.world_size, out)
        meta["verify"] = summary
        write_with(out / "verify.csv", lambda f: checked.to_csv(f, index=False))
        write_text(out / "plan.json", json.dumps(meta, indent=2, default=str) + "\n")
        print(table.render_verify(checked, summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
