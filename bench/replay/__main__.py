"""``python -m bench.replay TRACE_DIR``: replay a traced job's communication here, and price it
on other links.

    python -m bench.replay TRACE_DIR --nproc-per-node 2 [--steps K] [--impl native,reference]
        [--link ib_ndr,nvlink4] [--collectives RUN] [--out DIR]
    torchrun --standalone --nproc_per_node=2 -m bench.replay TRACE_DIR ...

Reads each rank's Kineto trace (GPU/NCCL or CPU/gloo), extracts each rank's collectives per
profiler step (``bench.analysis.sequence``), checks that the ranks agree, and replays the
sequence in order with the traced sizes, dtypes and groups, at the trace's world size, for each
implementation; ``--link`` and ``--collectives`` price the same calls without running them. The
run folder holds a row per call and per step (``docs/replay.md``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.console import fail
from bench.runner.cli import self_launch, strip_nproc
from bench.runner.session.distenv import launched_by_torchrun

IMPLS = ("native", "reference")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.splitlines()[0])
    p.add_argument("trace_dir", type=Path, help="the job's per-rank traces (*.pt.trace.json[.gz])")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="replay the first K profiler steps present on every rank (default all)",
    )
    p.add_argument(
        "--impl", default="native", help="native, reference, both (comma list), or none: price only"
    )
    p.add_argument("--reps", type=int, default=10, help="timed passes over each step")
    p.add_argument("--warmup", type=int, default=2, help="untimed passes first")
    p.add_argument(
        "--link",
        action="append",
        default=[],
        help="price on a link: presets (comma list) or alpha=SECONDS,beta=S_PER_BYTE",
    )
    p.add_argument(
        "--collectives",
        type=Path,
        default=None,
        help="price with this machine's fitted costs: a --sweep message_size run",
    )
    p.add_argument("--out", type=Path, default=None, help="the run folder to write")
    p.add_argument("--reports-dir", type=Path, default=Path("reports"))
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl", "gloo-cuda"))
    p.add_argument(
        "--point-timeout",
        "--timeout-s",
        type=float,
        default=120.0,
        help="seconds a replayed collective may wait",
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="without torchrun: start this many ranks here",
    )
    return p


def _impls(text: str) -> list[str]:
    if text.strip() == "none":
        return []
    impls = [t.strip() for t in text.split(",") if t.strip()]
    bad = [i for i in impls if i not in IMPLS]
    if bad or not impls:
        raise ValueError(f"unknown --impl {','.join(bad) or text!r} (native, reference, none)")
    return impls


def prepare(args):
    """Everything checked before any rank starts: (sequence, costs); one line and exit 2."""
    from bench.analysis.sequence import SequenceError, job_sequence
    from bench.replay.price import fitted, parse_links

    try:
        args.impls = _impls(args.impl)
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be at least 1, got {args.steps}")
        if args.reps < 1 or args.warmup < 0:
            raise ValueError("--reps must be at least 1 and --warmup at least 0")
        costs = parse_links(args.link)
        if args.collectives is not None:
            costs.append(fitted(args.collectives))
        if not args.impls and not costs:
            raise ValueError("--impl none prices only: give --link or --collectives")
        if args.out is not None and (args.out / "results.csv").exists():
            raise ValueError(f"{args.out} already holds results: choose another --out")
        seq = job_sequence(args.trace_dir, steps=args.steps)
    except (ValueError, SequenceError, OSError) as e:
        fail(str(e).splitlines()[0])
    return seq, costs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    seq, costs = prepare(args)
    from bench.replay import job as run

    if not args.impls:
        return run.price_only(args, argv, seq, costs)
    if not launched_by_torchrun():
        if args.nproc_per_node is None:
            fail(
                "not launched by torchrun: add --nproc-per-node N, or run `torchrun "
                f"--standalone --nproc_per_node=N -m bench.replay {' '.join(argv)}`"
            )
        if args.nproc_per_node < seq.ranks_needed:
            fail(
                f"the traced calls span {seq.ranks_needed} ranks, {args.nproc_per_node} "
                f"asked: launch at least {seq.ranks_needed}"
            )
        return self_launch(args.nproc_per_node, strip_nproc(argv), ["-m", "bench.replay"])
    from bench.runner.faults import launcher
    from bench.runner.session.distenv import init_distributed

    env = init_distributed(backend=args.backend, timeout_s=max(300.0, 3 * args.point_timeout))
    launcher.watch(env.rank)  # a rank whose launcher dies without a word leaves too
    if env.world_size < seq.ranks_needed:
        fail(
            f"the traced calls span {seq.ranks_needed} ranks, {env.world_size} launched: "
            f"launch at least {seq.ranks_needed}"
        )
    for note in seq.notes:
        if env.is_main:
            print(f"note: {note}", flush=True)
    return run.replay_everywhere(args, argv, seq, costs, env)


if __name__ == "__main__":
    sys.exit(main())
