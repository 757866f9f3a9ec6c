"""Command line of ``bench/run.py``: parse once, resolve once, launch, run the sweep.

The configuration is parsed and the points resolved once, in the process the user started;
a self-launch (``--nproc-per-node``) hands both to its ranks as a file, so they start at once
with what the launcher checked. Under the user's own torchrun each rank is that first process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import torch.distributed as dist

from bench.runfolder import lock
from bench.runfolder.atomic import OutputError
from bench.runfolder.folder import has_results
from bench.runfolder.points import RunFolderError
from bench.runner.collectives.message_sweep import CollectivePlan, run_collective_sweep
from bench.runner.configure.config import (
    COLLECTIVE_MAX_STEPS,
    DEFAULT_ROUNDS,
    TRAINING_MAX_STEPS,
    Resolved,
    RunConfig,
    runs_from_json,
    runs_to_json,
)
from bench.runner.configure.flags import parse_config
from bench.runner.configure.resolve import build_points
from bench.runner.configure.sweeps import SWEEPS, message_sizes, parse_list, sweep_names
from bench.runner.session.context import resume_problem
from bench.runner.session.distenv import fail, launched_by_torchrun, pick_backend
from bench.runner.train.sweep import run_sweep
from parallel_kernels.collectives import COLLECTIVES, DTYPES, IMPLS
from parallel_kernels.float8 import converts, unavailable

REPO = Path(__file__).resolve().parents[2]
# A rank's exit code when an output could not be written (sysexits' EX_IOERR): it printed which.
OUTPUT_FAILED = 74
# Where a self-launched rank finds the run its launching process resolved (a JSON file).
RESOLVED_ENV = "BENCH_RESOLVED_RUN"


def resolved_max_steps(config: RunConfig, collective: bool) -> int:
    """--max-steps as given, else the sweep kind's default."""
    if config.max_steps is not None:
        return config.max_steps
    return COLLECTIVE_MAX_STEPS if collective else TRAINING_MAX_STEPS


def resolved_rounds(config: RunConfig, collective: bool) -> int:
    """The rounds the run makes; a budget that cannot hold what every visit does is bad
    input (``config``'s max_steps resolved)."""
    least, what = (config.iters, "-n/--iters") if collective else (config.steps, "--steps")
    if config.max_steps < least:
        raise ValueError(f"--max-steps {config.max_steps} is less than {what} {least}")
    warmup = config.warmup_iters if collective else config.warmup_steps
    if config.max_steps < warmup:
        raise ValueError(
            f"--max-steps {config.max_steps} is smaller than the warm-up ({warmup} steps)"
        )
    if collective and config.budget is not None:
        raise ValueError("--budget is for training sweeps (message_size: -n, --max-steps)")
    if collective and config.rounds is not None:
        raise ValueError(
            "--rounds is for training sweeps: message_size repeats sizes adaptively (-n, "
            "--max-steps, --target-ci-pct)"
        )
    if config.rounds is not None:
        return config.rounds
    return 1 if collective else DEFAULT_ROUNDS


def collective_plan(config: RunConfig) -> CollectivePlan:
    """Validate the message_size flags (before any rank starts)."""
    if config.dtype not in DTYPES:
        raise ValueError(f"unknown dtype {config.dtype!r} (known: {', '.join(DTYPES)})")
    if config.op not in ("sum", "avg", "max"):
        raise ValueError(f"unknown reduction {config.op!r} (known: sum, avg, max)")
    return CollectivePlan(
        sizes=message_sizes(config.min_bytes, config.max_bytes, config.factor),
        collectives=parse_list(config.collectives, "collective", COLLECTIVES, flag="--collectives")
        if config.collectives
        else list(COLLECTIVES),
        impls=parse_list(config.impl, "implementation", IMPLS, flag="--impl")
        if config.impl
        else list(IMPLS),
        dtype=config.dtype,
        op=config.op,
        iters=config.iters,
        warmup=config.warmup_iters,
        check=bool(config.check),
        max_iters=config.max_steps,
        max_s=config.max_point_s,
        target_pct=config.target_ci_pct,
    )


def self_launch(nproc: int, argv: list[str], entry: list[str] | None = None) -> int:
    """Start the ranks through torchrun's own launcher (what ``torchrun --standalone`` does),
    each running ``entry`` (default: bench/run.py; ``["-m", "bench.replay"]``: a module)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The agent's warnings retell what the ranks and ``describe_failures`` say in one line each
    # (the signal it passed on, the ranks it stopped); its errors still show.
    for name in ("agent.server.api", "multiprocessing.api"):
        logging.getLogger(f"torch.distributed.elastic.{name}").setLevel(logging.ERROR)
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
        if OUTPUT_FAILED in codes:  # rank 0 printed which output it could not write
            return OUTPUT_FAILED
        print(f"error: {describe_failures(e.failures)}", file=sys.stderr)
        return 1
    except (SignalException, KeyboardInterrupt) as e:
        # Ctrl-C or SIGTERM: torchrun's agent passed the signal on and waited for the ranks,
        # which ended the running point as an error row, recorded the run's end and printed why.
        return 128 + int(getattr(e, "sigval", signal.SIGINT))
    return 0


def describe_failures(failures: dict) -> str:
    """One line naming each rank that failed and how: killed by a signal, or its exit code.
    Ranks killed by a signal come first (a rank that lost its peer exits with an error, at
    times before the launcher has noticed the killed one), then by time of failure."""
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


def _world_size(config: RunConfig) -> int | None:
    if launched_by_torchrun():
        return int(os.environ.get("WORLD_SIZE", "1"))
    return config.nproc_per_node


def resolve(config: RunConfig, world: int | None) -> Resolved:
    """The configuration with its rounds, and the training points or the collectives plan;
    bad input: one line and exit 2."""
    try:
        sweeps = [SWEEPS[n] for n in sweep_names(config.sweep)]
        if world is None and any(s.expand is not None or s.kind == "scaling" for s in sweeps):
            fail(_launch_hint(list(config.argv)))  # its values are checked against the world
        collective = sweeps[0].kind == "collective"
        config = replace(config, max_steps=resolved_max_steps(config, collective))
        config = replace(config, rounds=resolved_rounds(config, collective))
        if collective:
            if config.strategy or config.scaling:
                raise ValueError("--strategy and --scaling are for the world_size sweep")
            return Resolved(config=config, collective_plan=asdict(collective_plan(config)))
        # without a launch yet, checked as for one rank (the launch hint follows)
        points = build_points(config, world_size=world or 1)
        _float8_ready(points, config.backend)
        return Resolved(config=config, points=tuple(points))
    except ValueError as e:
        fail(str(e))


def _float8_ready(points: list, backend: str) -> None:
    """Where every point asks for fp8, that it can run here (torchao installed, a GPU with
    float8 or a CPU to emulate it on), or a one-line ValueError; where only some do, those
    points fail as error rows that say why."""
    if points and all(converts(p.knobs["precision"]) for p in points):
        reason = unavailable(pick_backend(backend)[1])
        if reason is not None:
            raise ValueError(reason)


def _check_out(config: RunConfig) -> None:
    """--out and --resume agree with what the folder holds, and no other run holds it now, or
    one line and exit 2."""
    if config.resume and config.out is None:
        fail("--resume needs --out RUN_DIR (the run to continue)")
    if config.out is not None:
        try:
            lock.check_free(config.out)  # checked here to fail before launch; rank 0 holds it
        except RunFolderError as e:
            fail(str(e))
    if config.resume:
        problem = resume_problem(config.out, config, _world_size(config))
        if problem:
            fail(problem)
    if config.out is not None and not config.resume and has_results(config.out):
        # Checked here too (rank 0 checks again after start-up) so that it fails before launch.
        fail(
            f"{config.out} already holds results: pass --resume to continue it, or choose "
            "another --out"
        )


def _handed_over() -> list[Resolved] | None:
    """Under a self-launch: the runs the launching process resolved (its file), else None."""
    path = os.environ.get(RESOLVED_ENV) if launched_by_torchrun() else None
    if not path:
        return None
    try:
        return runs_from_json(Path(path).read_text())
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"cannot read the run handed over by the launcher ({path}): {e}")


def _launch(run: Resolved) -> int:
    """Start the ranks here, handing them the resolved run (a file they read, not argv);
    their command line, as meta.json records it, is the one torchrun would have run."""
    argv = strip_nproc(list(run.config.argv))
    ranks = replace(run, config=replace(run.config, argv=tuple(argv)))
    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        path = Path(tmp) / "resolved.json"
        path.write_text(runs_to_json([ranks]))
        os.environ[RESOLVED_ENV] = str(path)
        try:
            return self_launch(run.config.nproc_per_node, argv)
        finally:
            os.environ.pop(RESOLVED_ENV, None)


def main(argv: list[str] | None = None) -> int:
    runs = _handed_over()
    if runs is None:
        argv = list(sys.argv[1:] if argv is None else argv)
        config = parse_config(argv)
        runs = [resolve(config, _world_size(config))]
        _check_out(runs[0].config)
    if runs[0].config.debug:
        # read when process groups are created: set before any rank starts (self-launch
        # passes the environment on) and before this rank's group (under torchrun)
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    if not launched_by_torchrun():
        if runs[0].config.nproc_per_node is None:
            fail(_launch_hint(list(runs[0].config.argv)))
        return _launch(runs[0])
    try:
        for run in runs:  # a launch's runs in turn, on one process group
            code = _run_here(run)
            if code:
                return code
    except OutputError as e:  # a full disk: the rows before are whole, this one is reported
        print(f"error: {e}", file=sys.stderr, flush=True)
        return OUTPUT_FAILED
    if dist.is_initialized():  # every run finished
        dist.destroy_process_group()
    return 0


def _run_here(run: Resolved) -> int:
    """One run on this rank: the message-size sweep or the training points."""
    if run.collective_plan is not None:
        return run_collective_sweep(run.config, CollectivePlan(**run.collective_plan))
    return run_sweep(run.config, list(run.points))
