"""A point's process group, how its ranks agree on its outcome, and its row from what they
agreed.

A point runs in a process group of its own, created with a short timeout, so that a point that
raises on one rank makes the others time out of their collectives instead of hanging. Each rank
then ends with its outcome (its figures, or its error, and the verdict of its check against
the plain model); the ranks gather them over the default group, whose timeout outwaits any
point's, so a point that failed on any rank is failed on all and every rank moves on
together. A peer that cannot be reached there is a lost job (``LostRanksError``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from bench.runfolder.points import PointRecord
from bench.runner.faults import watchdog
from bench.runner.faults.hangs import diagnosis, hang_dir
from bench.runner.faults.root_cause import root_cause
from bench.runner.session.distenv import DistEnv
from bench.runner.train import plain_check
from bench.runner.train.candidate import Candidate
from bench.runner.train.figures import aggregate
from bench.runner.train.row import Row, VisitResult
from parallel_kernels.groups import mesh_lines, prepare
from parallel_kernels.strategies import STRATEGIES


class LostRanksError(RuntimeError):
    """The ranks could not agree on a point's outcome: a rank or a node is gone."""

    def __init__(self, message: str, hangs: Path | None = None):
        super().__init__(message)
        self.hangs = hangs  # where the ranks that could still act left their dumps


@dataclass(frozen=True)
class Outcome:
    """One rank's end of a point: its figures (None if it failed), its error, and what its
    check against the plain model returned (a failed point's row keeps it too)."""

    figures: dict | None
    error: str | None
    checked: str | None


def first_line(e: BaseException) -> str:
    """An exception as one short line: its type and its message's first line."""
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"


def new_point_group(
    point: PointRecord, env: DistEnv, members: list[int], timeout_s: float
) -> dist.ProcessGroup | None:
    """The point's own process group (None on a rank outside it), its collectives timing out
    after ``timeout_s``. Every rank takes part in creating it (a fresh one each point, so that
    a point that broke its group cannot harm the next); only members get one. On part of the
    job, every rank also creates the subgroups the strategy will ask for (groups.py)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        group = dist.new_group(members, timeout=timeout, group_desc="point")
        if len(members) < env.world_size:
            try:
                shape = STRATEGIES[point.strategy].mesh_shape(len(members), **point.knobs)
            except ValueError:  # a bad layout: the members' apply raises it as the point's error
                shape = None
            if shape:
                prepare(members, mesh_lines(shape), timeout)
    except Exception as e:  # noqa: BLE001  (a peer gone between points: say so, no traceback)
        raise LostRanksError(
            f"point {point.id}: lost contact with the other ranks while forming the point's "
            f"group ({first_line(e)})"
        ) from None
    return group


def gather(env: DistEnv, mine, lost: Callable[[Exception], LostRanksError]) -> list:
    """Every rank's ``mine``, by rank (a collective call on every rank of the job); a peer that
    cannot be reached raises ``lost(its exception)``."""
    gathered: list = [None] * env.world_size
    try:
        dist.all_gather_object(gathered, mine)
    except Exception as e:  # noqa: BLE001  (the job cannot go on: say what is known)
        raise lost(e) from None
    return gathered


def point_row(c: Candidate, env: DistEnv, outcomes: list[Outcome]) -> VisitResult:
    """The point's row from its members' outcomes: its figures aggregated over the ranks, or
    its root cause and, on rank 0, the diagnosis of the dumps its ranks left."""
    errors = [o.error for o in outcomes]
    if any(errors):
        checks = [o.checked for o in outcomes]
        cells = {
            "status": "error",
            "error": root_cause(errors),
            "checked": plain_check.checked_of_failed(errors, checks),
        }
        # a mismatch with the plain model is every rank's agreed verdict after its
        # collectives completed: no hang to diagnose
        if env.is_main and not plain_check.is_mismatch(errors):
            cells.update(diagnosis(hang_dir(c.trace_dir)))
    else:
        cells = {"status": "ok", "error": "", **aggregate([o.figures for o in outcomes])}
    samples, skew = cells.pop("samples_ms", ()), cells.pop("skew_ms", ())
    row = Row.of(
        c.point,
        backend=env.backend,
        device=env.device.type,
        trace_dir=str(c.trace_dir),
        round=c.visit.round,
        method=c.method,
        cohort=c.cohort,
        **cells,
    )
    return VisitResult(row, tuple(samples), tuple(skew))


def agree_on_failures(ctx, cands: list[Candidate], stage: str) -> list[VisitResult]:
    """Every rank's errors of a cohort's ``stage`` gathered: a candidate that failed on any
    rank is failed on all, its group dropped and its error row written. Those rows."""
    mine = [Outcome(None, c.error, c.checked) for c in cands]
    gathered = gather(ctx.env, mine, lambda e: lost_in_cohort(stage, e))
    failed = []
    for i, c in enumerate(cands):
        per_rank = [g[i] for g in gathered]
        if any(o.error for o in per_rank):
            c.error = c.error or next(o.error for o in per_rank if o.error)
            c.drop()
            failed.append(point_row(c, ctx.env, per_rank))
            write_row(ctx, c, failed[-1])
    return failed


def lost_in_cohort(stage: str, e: Exception) -> LostRanksError:
    return LostRanksError(
        f"interleaved candidates: lost contact with the other ranks {stage} ({first_line(e)})"
    )


def write_row(ctx, c: Candidate, result: VisitResult) -> None:
    """Rank 0 writes a cohort's candidate's row as soon as it has one (more are to come)."""

    def write() -> None:
        ctx.write(result.as_dict())
        c.written = True

    if ctx.env.is_main:
        watchdog.write_row(write, last=False)
