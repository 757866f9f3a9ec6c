"""Replay one traced step's collectives on the launched ranks, in order, with the traced sizes,
dtypes and groups, for one implementation: warm-up passes, then timed passes, every call timed on
every rank; then each call once more on fresh buffers, checked against its exact result as the
``message_size`` sweep checks (``#wrong``).

A call's replayed time is, per pass, its shortest duration across the ranks (what the trace's
``traced_us`` is too: the transfer, without the wait for a late rank), and the median over the
passes. The calls run back to back as the job issued them; the device is synchronised after each
so that each has its own time.
"""

from __future__ import annotations

import datetime
import time
import warnings

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from bench.runner.session.distenv import DistEnv, synchronize
from parallel_kernels.collectives import CHECKED_DTYPES, COLLECTIVES, count_wrong


def registry_count(op: str, count: int, group_size: int) -> int:
    """The registry sizes a collective by nccl-tests' count (all-gather: its output); a trace
    gives each rank's input (elements, or bytes for nccl-tests' S): the count whose input is
    ``count``, by the registry row's own ``in_count`` (an op it lacks: as given)."""
    coll = COLLECTIVES.get(op)
    n = max(1, group_size)
    return count if coll is None else count * n // coll.in_count(n, n)


def why_not(row: dict) -> str:
    """Why a call cannot be replayed, or "": the registry's collectives, dtypes it knows."""
    if row["op"] not in COLLECTIVES:
        return f"not replayed: {row['op']} is not one of the registry's collectives"
    if pd.isna(row["count"]) or not row["dtype"]:
        return "not replayed: the trace gives no size or dtype for this call"
    if row["dtype"] not in CHECKED_DTYPES:
        return f"not replayed: dtype {row['dtype']} unknown"
    coll = COLLECTIVES[row["op"]]
    n = int(row["group_size"])
    count = registry_count(row["op"], int(row["count"]), n)
    if coll.needs_multiple_of_n and count % n:
        return f"not replayed: {count} elements do not split over {n} ranks"
    return ""


class Groups:
    """One process group per distinct rank list of the sequence, created by every rank in the
    same order (torch names groups by a per-process counter)."""

    def __init__(self, rank_lists: list[tuple[int, ...]], timeout_s: float):
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.lists = sorted(set(rank_lists))
        self.groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
        self.renew()

    def renew(self) -> None:
        """Fresh groups (after a call failed: its group may be broken)."""
        self.release()
        self.groups = {
            ranks: dist.new_group(list(ranks), timeout=self.timeout, group_desc="replay")
            for ranks in self.lists
        }

    def release(self) -> None:
        """Every group destroyed (the job's own group stays)."""
        for ranks, g in self.groups.items():
            if dist.get_rank() in ranks:  # a rank outside a group holds no group to destroy
                dist.destroy_process_group(g)
        self.groups = {}

    def of(self, ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
        """The group, or None where this rank is not in it."""
        return self.groups[ranks] if dist.get_rank() in ranks else None


def _buffers(row: dict, group, device: torch.device):
    coll = COLLECTIVES[row["op"]]
    n = int(row["group_size"])
    count = registry_count(row["op"], int(row["count"]), n)
    op = "sum" if "sum" in coll.ops else "none"
    dtype = CHECKED_DTYPES[row["dtype"]]
    inp, out, expected = coll.buffers(count, dtype, dist.get_rank(group), n, op, device)
    return coll.impl, inp, out, expected, op


def replay(
    calls: list[dict], impl: str, groups: Groups, env: DistEnv, *, warmup: int, reps: int
) -> tuple[list[dict], np.ndarray]:
    """Replay ``calls`` (one step, issue order; SEQUENCE rows); return per call this rank's
    outcome ({"error", "wrong"}) and its durations (reps x calls, seconds; NaN where this rank
    is not in the call's group or the call was not replayed)."""
    outcome = [{"error": why_not(c), "wrong": 0} for c in calls]
    # a first call of each: a backend that cannot run it says so here, on every rank alike
    prepared: list = [None] * len(calls)
    for i, c in enumerate(calls):
        group = groups.of(tuple(c["group_ranks"]))
        if outcome[i]["error"] or group is None:
            continue
        try:
            get, inp, out, expected, op = _buffers(c, group, env.device)
            run = get(impl)
            run(inp, out, op, group)
            synchronize(env.device)
            prepared[i] = (run, inp, out, op, group)
        except Exception as e:  # noqa: BLE001  (the backend's message is the row's error)
            outcome[i]["error"] = f"{type(e).__name__}: {e}".replace("\n", " ")[:300]
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, [o["error"] for o in outcome])
    failed = [next((e[i] for e in errors if e[i]), "") for i in range(len(calls))]
    if any(failed) and any(not why_not(c) and failed[i] for i, c in enumerate(calls)):
        groups.renew()  # a failed call may leave its group unusable
        prepared = [
            None if failed[i] else _rebind(p, groups, calls[i]) for i, p in enumerate(prepared)
        ]
    durations = np.full((reps, len(calls)), np.nan)
    for r in range(warmup + reps):
        for i, p in enumerate(prepared):
            if p is None:
                continue
            run, inp, out, op, group = p
            t0 = time.perf_counter()
            run(inp, out, op, group)
            synchronize(env.device)
            if r >= warmup:
                durations[r - warmup, i] = time.perf_counter() - t0
    for i, c in enumerate(calls):  # fresh buffers, one call each, checked
        if prepared[i] is None:
            continue
        get, inp, out, expected, op = _buffers(c, prepared[i][4], env.device)
        get(impl)(inp, out, op, prepared[i][4])
        synchronize(env.device)
        outcome[i]["wrong"] = count_wrong(out, expected)
    for i in range(len(calls)):
        outcome[i]["error"] = failed[i]
    return outcome, durations


def _rebind(p, groups: Groups, call: dict):
    if p is None:
        return None
    run, inp, out, op, _ = p
    return run, inp, out, op, groups.of(tuple(call["group_ranks"]))


def gather_times(outcome: list[dict], durations: np.ndarray) -> tuple[pd.DataFrame, list]:
    """Every rank's durations and outcomes, on every rank: (per call: time_us, time_us_max,
    wrong; the first error)."""
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (outcome, durations))
    stack = np.stack([d for _, d in everyone])  # ranks x reps x calls
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: calls not replayed
        fastest = np.nanmin(stack, axis=0)  # reps x calls
        slowest = np.nanmax(stack, axis=0)
        table = pd.DataFrame(
            {
                "time_us": np.nanmedian(fastest, axis=0) * 1e6,
                "time_us_max": np.nanmedian(slowest, axis=0) * 1e6,
                "wrong": [sum(o[i]["wrong"] for o, _ in everyone) for i in range(stack.shape[2])],
            }
        )
    errors = [
        next((o[i]["error"] for o, _ in everyone if o[i]["error"]), "")
        for i in range(stack.shape[2])
    ]
    return table, errors
