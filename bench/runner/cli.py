"""Command line of ``bench/run.py``: parse, validate, launch, run the sweep, write, report."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.runfolder.folder import has_results
from bench.runner.collectives.sweep import CollectivePlan, run_collective_sweep
from bench.runner.plan.points import build_points
from bench.runner.plan.sweeps import SWEEPS, message_sizes, parse_list, sweep_names
from bench.runner.session.context import resume_problem
from bench.runner.session.distenv import fail, launched_by_torchrun
from bench.runner.train.sweep import run_sweep
from parallel_kernels.collectives import COLLECTIVES, DTYPES, IMPLS

REPO = Path(__file__).resolve().parents[2]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        fail(f"{message} (see --help)")


def _int_at_least(minimum: int):
    """An argparse type: an integer no smaller than ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        return value

    return parse


_positive_int = _int_at_least(1)
DEFAULT_ROUNDS = 3


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="bench/run.py",
        description="Sweep a distributed-training parameter; measure, profile, analyse, report.",
        epilog="Sweeps: " + "; ".join(f"{s.name}: {s.description}" for s in SWEEPS.values()),
    )
    for flags in (_what, _outputs, _steps, _confidence, _job, _message_size):
        flags(p)
    return p


def _what(p: argparse.ArgumentParser) -> None:
    """What is swept: the sweep, its values, models, implementations, fixed knobs."""
    p.add_argument(
        "--sweep",
        required=True,
        help=f"one of: {', '.join(SWEEPS)}; or two training sweeps A,B for their grid",
    )
    p.add_argument("--values", help="comma list of values (default: the sweep's own)")
    p.add_argument("--values2", help="a grid's second sweep's values (default: its own)")
    p.add_argument("--model", help="comma list of models (default: the sweep's own)")
    p.add_argument("--impl", help="comma list of implementations, e.g. native,reference")
    p.add_argument(
        "--strategy",
        help="world_size and training-knob sweeps: the strategy measured (default ddp)",
    )
    p.add_argument("--scaling", help="world_size sweep: weak, strong or both (default weak,strong)")
    p.add_argument(
        "--option",
        action="append",
        metavar="KNOB=VALUE",
        help="a knob fixed for every point, e.g. sharding_strategy=HYBRID_SHARD or "
        "precision=bf16 (repeatable)",
    )


def _outputs(p: argparse.ArgumentParser) -> None:
    """Where the run goes: its folder, resume, the report."""
    p.add_argument("--out", type=Path, help="run folder (default results/<UTC time>-<sweep>)")
    p.add_argument(
        "--resume", action="store_true", help="continue a run in --out, skipping points already ok"
    )
    p.add_argument("--reports-dir", type=Path, default=Path("reports"))
    p.add_argument("--no-report", action="store_true", help="do not write the HTML report")
    p.add_argument(
        "--predict-with",
        type=Path,
        action="append",
        metavar="RUN_DIR",
        help="a --sweep message_size run of this machine: the report adds the cost model's "
        "predictions (measured vs predicted, what-if at scale)",
    )


def _steps(p: argparse.ArgumentParser) -> None:
    """What every visit of a point does: batch, clipping, warm-up and timed steps."""
    p.add_argument("--batch-size", type=_positive_int, default=64, help="per rank (default 64)")
    p.add_argument(
        "--clip-grad-norm",
        type=_positive_float,
        metavar="MAX_NORM",
        help="clip the gradient's global norm before each optimiser step",
    )
    p.add_argument(
        "--warmup-steps", type=_positive_int, default=5, help="untimed steps per visit (default 5)"
    )
    p.add_argument(
        "--steps",
        type=_positive_int,
        default=10,
        help="timed steps every visit of a point makes at least (default 10)",
    )


def _confidence(p: argparse.ArgumentParser) -> None:
    """How long a point is timed, and the rounds."""
    r = p.add_argument_group(
        "confidence (timing continues until the median's 95 %% interval is tight enough or the "
        "budget is spent; rounds repeat every point in a new random order)"
    )
    r.add_argument(
        "--target-ci-pct",
        type=_positive_float,
        default=2.0,
        metavar="PCT",
        help="stop timing a point once its median is known within +-PCT %% (default 2)",
    )
    r.add_argument(
        "--max-steps",
        type=_positive_int,
        default=60,
        help="budget: timed steps per point, all rounds together (message_size: iterations "
        "per size; default 60)",
    )
    r.add_argument(
        "--max-point-s",
        type=_positive_float,
        default=8.0,
        metavar="SECONDS",
        help="budget: seconds of timed steps per point, all rounds together (default 8)",
    )
    r.add_argument(
        "--rounds",
        type=_positive_int,
        help="training sweeps: run every point this many times, each round in a new random "
        "order, and pool them; the spread between rounds is what claims are tested against "
        f"(default {DEFAULT_ROUNDS})",
    )
    r.add_argument("--seed", type=int, default=0, help="seed of the rounds' orders (default 0)")


def _job(p: argparse.ArgumentParser) -> None:
    """How the job runs: traced steps, timeouts, debug, backend, the self-launch."""
    p.add_argument(
        "--profile-steps", type=_positive_int, default=3, help="active steps traced per point"
    )
    p.add_argument(
        "--timeout-s",
        "--point-timeout",
        dest="point_timeout",
        type=_positive_float,
        default=300.0,
        help="seconds a collective may wait before it fails: a hang becomes an error (default 300)",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="TORCH_DISTRIBUTED_DEBUG=DETAIL: collectives issued differently on different "
        "ranks raise instead of hanging (slower)",
    )
    p.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl", "gloo-cuda"],
        default="auto",
        help="auto: nccl with GPUs, else gloo; gloo-cuda: gloo on CUDA tensors (ranks may "
        "share a GPU; DDP only)",
    )
    p.add_argument(
        "--nproc-per-node",
        type=_positive_int,
        help="without torchrun: start this many ranks here (torch elastic launcher)",
    )


def _message_size(p: argparse.ArgumentParser) -> None:
    """The collectives sweep's flags, after nccl-tests'."""
    c = p.add_argument_group("message_size sweep (flags after nccl-tests)")
    c.add_argument("-b", "--min-bytes", default="1K", help="smallest size (default 1K)")
    c.add_argument("-e", "--max-bytes", default="64M", help="largest size (default 64M)")
    c.add_argument("-f", "--factor", default="2", help="size multiplier (default 2)")
    c.add_argument(
        "-n", "--iters", type=_positive_int, default=20, help="timed iterations, at least"
    )
    c.add_argument("-w", "--warmup-iters", type=_int_at_least(0), default=5)
    c.add_argument(
        "-c",
        "--check",
        type=int,
        choices=[0, 1],
        default=1,
        help="count #wrong elements after timing (default 1)",
    )
    c.add_argument("-d", "--dtype", default="float32", help=f"one of {', '.join(DTYPES)}")
    c.add_argument("-o", "--op", default="sum", help="reduction: sum, avg or max")
    c.add_argument("--collectives", help=f"comma list (default all: {', '.join(COLLECTIVES)})")


def check_budget(args: argparse.Namespace, collective: bool) -> None:
    """A budget that cannot hold what every visit does is bad input."""
    least, what = (args.iters, "-n/--iters") if collective else (args.steps, "--steps")
    if args.max_steps < least:
        raise ValueError(f"--max-steps {args.max_steps} is less than {what} {least}")
    warmup = args.warmup_iters if collective else args.warmup_steps
    if args.max_steps < warmup:
        raise ValueError(
            f"--max-steps {args.max_steps} is smaller than the warm-up ({warmup} steps)"
        )
    if collective and args.rounds is not None:
        raise ValueError(
            "--rounds is for training sweeps: message_size repeats sizes adaptively (-n, "
            "--max-steps, --target-ci-pct)"
        )
    if args.rounds is None:
        args.rounds = 1 if collective else DEFAULT_ROUNDS


def collective_plan(args: argparse.Namespace):
    """Validate the message_size flags (before any rank starts)."""
    if args.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {args.dtype!r} (known: {', '.join(DTYPES)})")
    if args.op not in ("sum", "avg", "max"):
        raise ValueError(f"unknown reduction {args.op!r} (known: sum, avg, max)")
    return CollectivePlan(
        sizes=message_sizes(args.min_bytes, args.max_bytes, args.factor),
        collectives=parse_list(args.collectives, "collective", COLLECTIVES)
        if args.collectives
        else list(COLLECTIVES),
        impls=parse_list(args.impl, "implementation", IMPLS) if args.impl else list(IMPLS),
        dtype=args.dtype,
        op=args.op,
        iters=args.iters,
        warmup=args.warmup_iters,
        check=bool(args.check),
        max_iters=args.max_steps,
        max_s=args.max_point_s,
        target_pct=args.target_ci_pct,
    )


def self_launch(nproc: int, argv: list[str], entry: list[str] | None = None) -> int:
    """Start the ranks through torchrun's own launcher (what ``torchrun --standalone`` does),
    each running ``entry`` (default: bench/run.py; ``["-m", "bench.replay"]``: a module)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    entry = entry or [str(REPO / "bench" / "run.py")]
    launcher_args = get_args_parser().parse_args(
        ["--standalone", f"--nproc-per-node={nproc}", *entry, *argv]
    )
    try:
        run(launcher_args)
    except ChildFailedError as e:
        codes = {f.exitcode for f in e.failures.values()}
        if codes == {2}:  # bad input found after start-up: each rank printed its line
            return 2
        print(f"error: {describe_failures(e.failures)}", file=sys.stderr)
        return 1
    return 0


def describe_failures(failures: dict) -> str:
    """One line naming each rank that failed and how: killed by a signal, or its exit code.
    Ranks killed by a signal come first (a rank that lost its peer exits with an error, at
    times before the launcher has seen the killed one), then by time of failure."""
    parts = []
    order = sorted(failures.items(), key=lambda kv: (kv[1].exitcode >= 0, kv[1].timestamp))
    for rank, f in order:
        how = f"killed by {f.signal_name()}" if f.exitcode < 0 else f"exit code {f.exitcode}"
        parts.append(f"rank {rank} (pid {f.pid}) {how}")
    return "; ".join(parts) + " (results.csv keeps every point finished before)"


def strip_nproc(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc-per-node":
            skip = True
        elif not a.startswith("--nproc-per-node="):
            out.append(a)
    return out


def _launch_hint(argv: list[str]) -> str:
    return (
        "not launched by torchrun: run `torchrun --standalone --nproc_per_node=N "
        f"bench/run.py {' '.join(argv)}` or add --nproc-per-node N"
    )


def _world_size(args: argparse.Namespace) -> int | None:
    if launched_by_torchrun():
        return int(os.environ.get("WORLD_SIZE", "1"))
    return args.nproc_per_node


def _resolve(args: argparse.Namespace, sweeps: list, world: int | None):
    """(the collectives plan, None) or (None, the training points), or one line and exit 2."""
    collective = sweeps[0].kind == "collective"
    try:
        check_budget(args, collective)
        if collective:
            if args.strategy or args.scaling:
                raise ValueError("--strategy and --scaling are for the world_size sweep")
            return collective_plan(args), []
        return None, build_points(
            args.sweep,
            values=args.values,
            values2=args.values2,
            models=args.model,
            impls=args.impl,
            options=args.option,
            # without a launch yet, checked as for one rank (the launch hint follows)
            world_size=world or 1,
            strategy=args.strategy,
            scaling=args.scaling,
            batch_size=args.batch_size,
            steps=args.steps,
            warmup_steps=args.warmup_steps,
            profile_steps=args.profile_steps,
        )
    except ValueError as e:
        fail(str(e))


def _check_out(args: argparse.Namespace) -> None:
    """--out and --resume agree with what the folder holds, or one line and exit 2."""
    if args.resume and args.out is None:
        fail("--resume needs --out RUN_DIR (the run to continue)")
    if args.resume:
        problem = resume_problem(args.out, args, _world_size(args))
        if problem:
            fail(problem)
    if args.out is not None and not args.resume and has_results(args.out):
        # Checked here too (rank 0 checks again after start-up) so that it fails before launch.
        fail(
            f"{args.out} already holds results: pass --resume to continue it, or choose "
            "another --out"
        )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        sweeps = [SWEEPS[n] for n in sweep_names(args.sweep)]
    except ValueError as e:
        fail(str(e))
    world = _world_size(args)
    needs_world = any(s.expand is not None or s.kind == "scaling" for s in sweeps)
    if needs_world and world is None:
        fail(_launch_hint(argv))  # its values are checked against the world size
    if args.debug:
        # read when process groups are created: set before any rank starts (self-launch
        # passes the environment on) and before this rank's group (under torchrun)
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    plan, points = _resolve(args, sweeps, world)
    _check_out(args)
    if not launched_by_torchrun():
        if args.nproc_per_node is None:
            fail(_launch_hint(argv))
        return self_launch(args.nproc_per_node, strip_nproc(argv))

    if plan is not None:
        return run_collective_sweep(args, plan, argv)
    return run_sweep(args, points, argv)
