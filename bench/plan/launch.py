"""What the planner's own runs share: ``bench/run.py`` launched here (the calibration's runs and
``--verify``'s), and a row's configuration in words (console, page, ``verify.csv``)."""

from __future__ import annotations

import numbers
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from bench.runner.cli import RESOLVED_ENV, resolve
from bench.runner.configure.config import Resolved, runs_to_json
from bench.runner.configure.flags import parse_config
from parallel_kernels.compiling import compiles

RUN_PY = Path(__file__).resolve().parents[2] / "bench" / "run.py"


def timing(seconds: float, traced: int) -> list[str]:
    """A launched point's timing: ``seconds`` of interleaved cycles in one round, after three
    warm-up steps, then ``traced`` profiled steps."""
    return [
        "--max-point-s",
        f"{seconds:g}",
        "--rounds",
        "1",
        "--warmup-steps",
        "3",
        "--profile-steps",
        str(traced),
    ]


def launch_points(
    named: list[tuple[str, str, list[str]]], world: int, out: Path, group: str, timeout_s: float
) -> str:
    """Several ``bench/run.py`` commands' points in one launch of ``world`` ranks here
    (``points_run``): "" when it ran, else why not, in one line."""
    try:
        run = points_run(named, world, out, group)
    except ValueError as e:
        return str(e)
    return launch_runs([run], world, timeout_s)


def points_run(
    named: list[tuple[str, str, list[str]]], world: int, out: Path, group: str
) -> Resolved:
    """One run of several ``bench/run.py`` commands' points, interleaved in its cycles as one
    verdict's candidates (``group``): each ``(name, what, args)`` resolved as ``bench/run.py
    args`` resolves it at ``world`` ranks, its points' ids prefixed ``name-`` (unique in the
    folder ``out``, and what a reader of it tells them by); the run's settings (its budget, its
    rounds) the first command's. A ValueError names a command that does not resolve."""
    points, runs = [], []
    for name, what, args in named:
        args = [*args, "--out", str(out), "--no-report", "--interleave", "on"]
        runs.append(command_run(args, world, what))
        points += [replace(p, id=f"{name}-{p.id}", verdict_group=group) for p in runs[-1].points]
    return Resolved(config=replace(runs[0].config, argv=()), points=tuple(points))


def command_run(args: list[str], world: int, what: str) -> Resolved:
    """``bench/run.py args`` resolved at ``world`` ranks, or a ValueError naming ``what``."""
    try:
        return resolve(parse_config(args), world)
    except SystemExit:
        raise ValueError(f"{what} does not resolve at {world} ranks") from None


def launch_runs(runs: list[Resolved], world: int, timeout_s: float) -> str:
    """``runs`` one after the other in one launch of ``world`` ranks here, handed to the ranks
    as ``bench/run.py`` hands them a resolved run (a launch's start-up paid once): "" when they
    ran, else why not, in one line."""
    with tempfile.TemporaryDirectory(prefix="plan-launch-") as tmp:
        handed = Path(tmp) / "resolved.json"
        handed.write_text(runs_to_json(runs))
        env = {**os.environ, RESOLVED_ENV: str(handed), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += [f"--nproc-per-node={world}", str(RUN_PY)]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout_s:g} s"
    return outcome(done)


def role(point_id: str) -> str:
    """The name a point of ``launch_points`` was handed under (its id's prefix)."""
    return str(point_id).split("-", 1)[0]


def outcome(done: subprocess.CompletedProcess) -> str:
    """ "" for a run that exited 0, else its output's last line (what a one-line error says)."""
    if not done.returncode:
        return ""
    last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    return last[0][:300]


def describe(row) -> str:
    """A plan row's configuration: layout, checkpointing, precision (and compile where on),
    micro-batch x accumulation (a pipeline's: its batch in its micro-batches)."""
    split = f"{row['micro_batch']} x {row['grad_accum']}"
    m = row.get("pp_microbatches")
    if isinstance(m, numbers.Real) and m == m:  # a pipeline row's (NaN on the others)
        split = f"{row['micro_batch']} in {int(m)} micro-batches"
    mode = row.get("compile")  # NaN or "" where the row has none
    compiled = isinstance(mode, str) and mode != "" and compiles({"compile": mode})
    levers = f"{row['precision']}" + (f", compile {mode}" if compiled else "")
    return f"{row['config']}, ckpt {row['activation_checkpointing']}, {levers}, {split}"
