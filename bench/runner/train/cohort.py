"""Which points of a sweep are timed together, interleaved (``cycles.py``), and which in
rounds as before.

Candidates can share a launch when they run on the same ranks: one model's points at one world
size, every value of the sweep times every implementation. Points on other world sizes (a
world-size sweep), and a model with one point, run in rounds. ``--interleave auto`` also asks
that the candidates' state fit comfortably: their parameters, gradients and optimiser state
together within half of what the host (or the device) has free, per rank.
"""

from __future__ import annotations

import torch

from bench.runfolder.points import PointRecord
from bench.runner.configure.config import RunConfig
from bench.runner.session.distenv import DistEnv

# fp32 parameter, gradient and AdamW's two moments: bytes of state per parameter, where the
# strategy has no expected figure of its own.
STATE_BYTES_PER_PARAM = 16
SHARE_OF_FREE = 0.5  # of free memory the candidates may hold together (auto)


def free_bytes(device: torch.device) -> int | None:
    """Memory free now on the device (CUDA), or available on the host (Linux MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            line = next(x for x in f if x.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def state_bytes(point: PointRecord) -> int:
    """A candidate's state on one rank: the strategy's expected figure, else every parameter's
    fp32 value, gradient and two AdamW moments."""
    expected = point.figures.get("state_bytes_expected")
    if expected is not None:
        return int(expected)
    return int(point.figures.get("params", 0)) * STATE_BYTES_PER_PARAM


def split_cohorts(
    points: list[PointRecord], config: RunConfig, env: DistEnv, free: int | None
) -> tuple[list[list[PointRecord]], list[PointRecord], str | None]:
    """(cohorts to interleave, points for rounds, a line to say once when auto fell back).
    ``free``: bytes free on rank 0's device (``free_bytes``)."""
    if config.interleave == "off":
        return [], list(points), None
    by_model: dict[str, list[PointRecord]] = {}
    for p in points:
        if p.world_size == env.world_size:
            by_model.setdefault(p.model, []).append(p)
    cohorts = [c for c in by_model.values() if len(c) > 1]
    note = None
    if config.interleave == "auto" and cohorts and free is not None:
        # a GPU of its own per rank under NCCL; the host's memory, or one GPU under gloo-cuda,
        # shared by the host's ranks
        own = env.device.type == "cuda" and env.backend == "nccl"
        per_rank = free * SHARE_OF_FREE / (1 if own else env.local_world_size)
        fit = [c for c in cohorts if sum(state_bytes(p) for p in c) <= per_rank]
        if len(fit) < len(cohorts):
            left = [c[0].model for c in cohorts if c not in fit]
            note = (
                f"interleave: {', '.join(left)} run in rounds: their candidates' state together "
                f"is more than half the free memory ({per_rank / 2**20:.0f} MiB per rank)"
            )
        cohorts = fit
    ids = {p.id for c in cohorts for p in c}
    return cohorts, [p for p in points if p.id not in ids], note
