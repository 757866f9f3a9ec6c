"""The command line of ``bench/run.py``: its flags, parsed once into a ``RunConfig``.

Every flag's default is ``RunConfig``'s (``configure/config.py``): the parser leaves an unset flag
out (``argparse.SUPPRESS``) and the dataclass fills it, so a default is written once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.console import fail, parse_duration
from bench.runner.configure.config import (
    COLLECTIVE_MAX_STEPS,
    DEFAULT_ROUNDS,
    DEFAULTS,
    INTERLEAVE,
    TRAINING_MAX_STEPS,
    RunConfig,
)
from bench.runner.configure.sweeps import SWEEPS
from parallel_kernels.collectives import COLLECTIVES, DTYPES


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


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="bench/run.py",
        argument_default=argparse.SUPPRESS,
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
    p.add_argument(
        "--reports-dir",
        type=Path,
        help=f"where the HTML report goes (default {DEFAULTS.reports_dir})",
    )
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
    p.add_argument(
        "--batch-size", type=_positive_int, help=f"per rank (default {DEFAULTS.batch_size})"
    )
    p.add_argument(
        "--clip-grad-norm",
        type=_positive_float,
        metavar="MAX_NORM",
        help="clip the gradient's global norm before each optimiser step",
    )
    p.add_argument(
        "--warmup-steps",
        type=_positive_int,
        help=f"untimed steps per visit (default {DEFAULTS.warmup_steps})",
    )
    p.add_argument(
        "--steps",
        type=_positive_int,
        help=f"timed steps every visit of a point makes at least (default {DEFAULTS.steps})",
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
        metavar="PCT",
        help=f"stop timing a point once its median is known within +-PCT %% "
        f"(default {DEFAULTS.target_ci_pct:g})",
    )
    r.add_argument(
        "--max-steps",
        type=_positive_int,
        help="budget: timed steps per point, all rounds together, interleaved candidates' "
        f"shared (default {TRAINING_MAX_STEPS}); message_size: iterations per size (default "
        f"{COLLECTIVE_MAX_STEPS})",
    )
    r.add_argument(
        "--max-point-s",
        type=_positive_float,
        metavar="SECONDS",
        help="budget: seconds of timed steps per point, all rounds together "
        f"(default {DEFAULTS.max_point_s:g})",
    )
    r.add_argument(
        "--rounds",
        type=_positive_int,
        help="training sweeps: run every point this many times, each round in a new random "
        "order, and pool them; the spread between rounds is what claims are tested against "
        f"(default {DEFAULT_ROUNDS})",
    )
    r.add_argument("--seed", type=int, help=f"seed of the rounds' orders (default {DEFAULTS.seed})")
    r.add_argument(
        "--interleave",
        choices=INTERLEAVE,
        help="training sweeps: build the candidates of one model together and time them in "
        "cycles, one step of each per cycle in a random order, compared pair by pair; auto: "
        "where their state fits in half the free memory, else rounds (default "
        f"{DEFAULTS.interleave})",
    )
    r.add_argument(
        "--tie-band-pct",
        "--tie-band",
        type=_positive_float,
        metavar="PCT",
        help="interleaved cycles stop once every comparison with the best excludes 1 or lies "
        f"within +-PCT %% (a tie; default {DEFAULTS.tie_band_pct:g})",
    )
    r.add_argument(
        "--budget",
        type=_duration,
        metavar="TIME",
        help="training sweeps: the whole sweep's wall time, e.g. 10m: every point is visited "
        "once, later rounds' visits run while they fit, and each visit's timing shrinks to its "
        "share (default: none)",
    )


def _job(p: argparse.ArgumentParser) -> None:
    """How the job runs: traced steps, timeouts, debug, backend, the self-launch."""
    p.add_argument(
        "--profile-steps",
        type=_positive_int,
        help=f"active steps traced per point (default {DEFAULTS.profile_steps})",
    )
    p.add_argument(
        "--point-timeout",
        "--timeout-s",
        dest="point_timeout",
        type=_positive_float,
        help="seconds a collective may wait before it fails: a hang becomes an error "
        f"(default {DEFAULTS.point_timeout:g})",
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
        help="auto: nccl with GPUs, else gloo; gloo-cuda: gloo on CUDA tensors (ranks may "
        f"share a GPU; DDP only; default {DEFAULTS.backend})",
    )
    p.add_argument(
        "--nproc-per-node",
        type=_positive_int,
        help="without torchrun: start this many ranks here (torch elastic launcher)",
    )


def _message_size(p: argparse.ArgumentParser) -> None:
    """The collectives sweep's flags, after nccl-tests'."""
    c = p.add_argument_group("message_size sweep (flags after nccl-tests)")
    c.add_argument("-b", "--min-bytes", help=f"smallest size (default {DEFAULTS.min_bytes})")
    c.add_argument("-e", "--max-bytes", help=f"largest size (default {DEFAULTS.max_bytes})")
    c.add_argument("-f", "--factor", help=f"size multiplier (default {DEFAULTS.factor})")
    c.add_argument(
        "-n",
        "--iters",
        type=_positive_int,
        help=f"timed iterations, at least (default {DEFAULTS.iters})",
    )
    c.add_argument(
        "-w",
        "--warmup-iters",
        type=_int_at_least(0),
        help=f"untimed iterations per size (default {DEFAULTS.warmup_iters})",
    )
    c.add_argument(
        "-c",
        "--check",
        type=int,
        choices=[0, 1],
        help=f"count #wrong elements after timing (default {DEFAULTS.check})",
    )
    c.add_argument("-d", "--dtype", help=f"one of {', '.join(DTYPES)} (default {DEFAULTS.dtype})")
    c.add_argument("-o", "--op", help=f"reduction: sum, avg or max (default {DEFAULTS.op})")
    c.add_argument("--collectives", help=f"comma list (default all: {', '.join(COLLECTIVES)})")


def parse_config(argv: list[str]) -> RunConfig:
    """The run's configuration from its command line (bad flags: one line, exit 2)."""
    given = vars(build_parser().parse_args(argv))
    for name in ("option", "predict_with"):  # repeatable flags: frozen as tuples
        if name in given:
            given[name] = tuple(given[name])
    return RunConfig(**given, argv=tuple(argv))
