"""A point of a training run -> its simulated step (``schedule.py``).

The point is read from the run's own points record (``points.jsonl``): its schedule, the facts
of its implementation (does it overlap, whose buckets, do its reductions block), its knobs and
the shapes its figures were resolved from, so the model sees exactly what ran, whatever the
code base says today. Computation comes from traces (``compute.py``). In a bucket sweep, whose
knob changes only how a step communicates, the points of one model and implementation share
one profile (the median of theirs), so the predicted differences between bucket sizes come
from the schedule and the collectives' costs alone. Elsewhere a point's computation is its own
(a sharded optimiser steps over 1/n of the parameters; a TP degree splits the layers), and the
model checks its communication terms.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.analysis.collective_calls import collective_calls, wait_split
from bench.model import schedule as sch
from bench.model.comm import CommModel
from bench.model.compute import ComputeProfile, from_traces, point_traces, pooled
from bench.runfolder.points import PointRecord
from parallel_kernels.facts import size_per_input
from parallel_kernels.fsdp_layout import shard_group_size

MB = 2**20
# Sweeps whose values change communication only: their points share one computation profile.
# (Not sharding strategies: the optimiser steps over 1/n of the parameters when they are
# sharded, so their computation differs.)
POOLED_SWEEPS = {"bucket_cap_mb"}
# Knobs the schedules do not model: a point that sets one away from its default is not
# predicted (the note says which).
UNMODELLED_KNOBS = (
    "precision",
    "grad_accum",
    "activation_checkpointing",
    "mixed_precision",
    "compile",
)


class Unmodelled(ValueError):
    """A point the model does not simulate (yet); the message says what."""


@dataclass(frozen=True)
class Case:
    """What the schedule needs to know about a point (``case_of`` reads it from a record)."""

    schedule: str  # ddp, fsdp, tp
    facts: dict[str, Any]  # the implementation's row
    knobs: dict[str, Any]
    defaults: dict[str, Any]
    world: int
    figures: dict[str, Any]  # fsdp_unit_bytes, tp_comm_calls, dp_bucket_cap_mb, params ...
    tp: int = 1
    # DistributedDataParallel left at its defaults puts 1 MiB in its first bucket (what-if).
    first_bucket_mb: float | None = None


def case_of(point: PointRecord) -> Case:
    return Case(
        schedule=point.schedule,
        facts=dict(point.impl_facts),
        knobs=dict(point.knobs),
        defaults=dict(point.defaults),
        world=point.world_size,
        figures=dict(point.figures),
        tp=point.tp_size,
    )


def _check_knobs(case: Case) -> None:
    for knob in UNMODELLED_KNOBS:
        if knob in case.knobs and case.knobs[knob] != case.defaults[knob]:
            raise Unmodelled(f"{knob}={case.knobs[knob]} is not modelled yet")


def _ddp_buckets(case: Case, prof: ComputeProfile, cap_mb: float) -> list[list[int]]:
    sizes = list(prof.grad_bytes)
    if not sizes:
        raise Unmodelled(f"{prof.source}: the traces show no gradient accumulation to bucket")
    if not any(sizes):
        raise Unmodelled(
            f"{prof.source}: the traces record no gradient sizes (profile with record_shapes=True)"
        )
    cap = int(cap_mb * MB)
    if case.facts["buckets"] == "reference":  # our ReferenceDDP's buckets
        return sch.reference_buckets(sizes, cap)
    first = case.first_bucket_mb
    return sch.native_buckets(sizes, cap, int(first * MB) if first else None)


def _bucket_ms(comm, prof: ComputeProfile, buckets, n: int, wire: float = 1.0) -> list[float]:
    """Each bucket's all-reduce on n ranks, ms; ``wire``: the share of its bytes that travel."""
    return [
        1e3 * comm.time("all_reduce", wire * sum(prof.grad_bytes[i] for i in b), n) for b in buckets
    ]


def ddp(
    case: Case, prof: ComputeProfile, comm: CommModel, n: int | None = None, outer=None
) -> list[sch.Op]:
    """``outer``: unused (DDP's one group spans the world, on ``comm``); taken as ``fsdp`` and
    ``tp`` take it."""
    del outer
    n = n or case.world
    hook = case.knobs.get("comm_hook")
    if hook not in (None, "none", "fp16", "bf16"):
        raise Unmodelled(f"comm_hook={hook} is not modelled")
    wire = 0.5 if hook in ("fp16", "bf16") else 1.0  # the bucket cast to 16 bits
    buckets = _ddp_buckets(case, prof, float(case.knobs["bucket_cap_mb"]))
    bucket_ms = _bucket_ms(comm, prof, buckets, n, wire)
    prog = sch.ddp_program(
        forward_ms=prof.forward_ms,
        backward_ms=prof.backward_ms,
        after_ms=prof.after_ms,
        ready_ms=list(prof.grad_ready_ms),
        buckets=buckets,
        bucket_ms=bucket_ms,
        overlap=case.facts["overlap"],
    )
    return prog


def fsdp(
    case: Case, prof: ComputeProfile, comm: CommModel, n: int | None = None, outer=None
) -> list[sch.Op]:
    """``outer``: the costs of HYBRID_SHARD's all-reduce across shard groups, where it runs
    on another link (across nodes; the planner's topology, bench/plan/step_time.py)."""
    n, outer = n or case.world, outer or comm
    strategy = case.knobs["sharding_strategy"]
    s = shard_group_size(strategy, n, case.knobs.get("shard_size"))
    # Units in forward order with their fp32 bytes (the root's leftovers, if any, first: they
    # are gathered first and reduced last), as the record resolved them from the model.
    # Computation is split by parameter share (flops of a linear layer are proportional to its
    # parameters).
    sizes = list(case.figures["fsdp_unit_bytes"])
    total = sum(sizes)
    units = []
    # FSDP's own work, alike per unit: a third in forward (the gather's copy out), two thirds in
    # backward (the gather's again and the reduction's copy in)
    extra = prof.fsdp_extra_ms / len(sizes) if sizes else 0.0
    for nbytes in sizes:
        share = nbytes / total
        if s > 1:
            gather = 1e3 * comm.time("all_gather", nbytes, s)
            reduce = 1e3 * comm.time("reduce_scatter", nbytes, s)
            if s < n:  # HYBRID_SHARD: then the shard is all-reduced across the n/s replicas
                reduce += 1e3 * outer.time("all_reduce", nbytes / s, n // s)
        else:
            gather, reduce = 0.0, 1e3 * comm.time("all_reduce", nbytes, n)
        forward = prof.forward_ms * share + extra / 3
        backward = prof.backward_ms * share + 2 * extra / 3
        units.append(sch.Unit(forward, backward, gather, reduce))
    prog = sch.fsdp_program(
        units,
        after_ms=prof.after_ms,
        reshard_after_forward=strategy in ("FULL_SHARD", "HYBRID_SHARD"),
        shard=s > 1,
        reduce_blocks=case.facts["reduce_blocks"],
    )
    return prog


def tp(
    case: Case, prof: ComputeProfile, comm: CommModel, n: int | None = None, outer=None
) -> list[sch.Op]:
    """``outer``: the costs of the data-parallel all-reduces, where they run on another link
    than the TP group's (across nodes; the planner's topology, bench/plan/step_time.py)."""
    n, outer = n or case.world, outer or comm
    calls = case.figures.get("tp_comm_calls")
    if calls is None:
        raise Unmodelled("the record holds no TP collectives for this point")
    tp_n, dp_n = case.tp, max(1, n // case.tp)
    fwd, bwd = [], []
    for collective, phase, elements in calls:
        # nccl-tests' S: an all-gather's whole output (the traces count its input, 1/n of it)
        nbytes = 4 * elements * size_per_input(collective, tp_n)
        (fwd if phase == "forward" else bwd).append(1e3 * comm.time(collective, nbytes, tp_n))
    if case.knobs.get("dp_shard") and dp_n > 1:
        return _fsdp_over_tp(case, prof, outer, tp_n, dp_n, fwd, bwd)
    kw = {}
    if dp_n > 1:
        buckets = _ddp_buckets(case, prof, float(case.figures["dp_bucket_cap_mb"]))
        kw = dict(
            buckets=sch.Buckets(
                list(prof.grad_ready_ms), buckets, _bucket_ms(outer, prof, buckets, dp_n)
            )
        )
    prog = sch.tp_program(
        forward_ms=prof.forward_ms,
        backward_ms=prof.backward_ms,
        after_ms=prof.after_ms,
        forward_comm_ms=fwd,
        backward_comm_ms=bwd,
        **kw,
    )
    return prog


def _fsdp_over_tp(
    case: Case, prof: ComputeProfile, dp_comm, tp_n: int, dp_n: int, fwd: list, bwd: list
) -> list[sch.Op]:
    """FULL_SHARD over the data-parallel ranks of a TP mesh (``dp_shard``): ``fsdp``'s schedule
    of each unit's TP-local parameters among the ``dp_n`` ranks that hold the same TP slice,
    with TP's blocking calls spread through forward and backward on the TP group's own
    communicator (``schedule.with_blocking_calls``). A unit's TP-local bytes are its bytes over
    the degree: the few parameters TP leaves whole (norms, biases of row-parallel layers) are
    counted as split."""
    local = replace(
        case,
        knobs={**case.knobs, "sharding_strategy": "FULL_SHARD"},
        figures={
            **case.figures,
            "fsdp_unit_bytes": [b / tp_n for b in case.figures["fsdp_unit_bytes"]],
        },
    )
    prog = fsdp(local, prof, dp_comm, dp_n)
    prog = sch.with_blocking_calls(prog, "forward", prof.forward_ms, fwd)
    return sch.with_blocking_calls(prog, "backward", prof.backward_ms, bwd)


@dataclass(frozen=True)
class Simulator:
    """A schedule's program, as ``simulate_case`` dispatches on the strategy's schedule."""

    # (case, prof, comm, n, outer) -> the step's ops: its own group's collectives on ``comm``,
    # those across its replicas on ``outer`` (``comm`` where not given)
    program: Callable[..., list[sch.Op]]
    # The ranks of the group its own collectives run in (a group laid from the first rank:
    # the planner prices it on the link it fits in)
    group: Callable[[Case], int]


def _shard_group(case: Case) -> int:
    """FSDP's own group: HYBRID_SHARD's shard group, else the world (NO_SHARD's all-reduce
    spans it)."""
    s = shard_group_size(case.knobs["sharding_strategy"], case.world, case.knobs.get("shard_size"))
    return s if 1 < s < case.world else case.world


SIMULATORS = {  # by the strategy's schedule
    "ddp": Simulator(ddp, lambda case: case.world),
    "fsdp": Simulator(fsdp, _shard_group),
    "tp": Simulator(tp, lambda case: case.tp),
}


def overlap_share(meta: dict) -> float:
    """``schedule.simulate``'s share: on CPU ranks with fewer than two cores each, the main
    thread and gloo's thread time-share a core while both run (0.5); else 1."""
    if meta.get("device", "cpu") != "cpu":
        return 1.0
    cores = meta.get("cpu_count") or os.cpu_count() or 1
    per_rank = cores / max(1, int(meta.get("ranks_per_node") or meta.get("world_size") or 1))
    return 1.0 if per_rank >= 2 else 0.5


def simulator(case: Case) -> Simulator:
    if case.schedule not in SIMULATORS:
        raise Unmodelled(f"schedule {case.schedule} is not modelled")
    return SIMULATORS[case.schedule]


def simulate_case(
    case: Case,
    prof: ComputeProfile,
    comm: CommModel,
    n: int | None = None,
    share: float = 1.0,
    outer: CommModel | None = None,
) -> sch.Timeline:
    """The case's step simulated: its own group's collectives on ``comm``, those across its
    replicas on ``outer`` (``comm`` where not given)."""
    _check_knobs(case)
    return sch.simulate(simulator(case).program(case, prof, comm, n, outer), share=share)


def traced_comm(traces) -> dict[str, float]:
    """Per step (median over profiled steps), from a point's traces: the collectives' transfer
    time (each call's shortest duration across ranks, when its last rank had joined) and the
    ranks' mean wait for the slowest one; what the model's communication term is checked by."""
    calls = pd.concat([collective_calls(t) for t in traces], ignore_index=True)
    calls = wait_split(calls[calls["step"] >= 0]) if len(calls) else calls
    if calls.empty or calls["transfer_us"].isna().all():
        return {"traced_transfer_ms": np.nan, "traced_wait_ms": np.nan}
    first = calls[calls["rank"] == calls["rank"].min()]
    transfer = first.groupby("step")["transfer_us"].sum().median() / 1e3
    ranks = calls["rank"].nunique()
    wait = (calls.groupby("step")["wait_us"].sum() / ranks).median() / 1e3
    return {"traced_transfer_ms": float(transfer), "traced_wait_ms": float(wait)}


def point_profile(folder: Path) -> tuple[ComputeProfile, dict[str, float]]:
    """A point's own computation profile and ``traced_comm``, from one read of its traces.
    Kept per folder and trace files (name, size, mtime): a report validates a run and then
    prices its DDP points again for the what-if, and the traces are read once."""
    files = tuple(
        (f.name, f.stat().st_size, f.stat().st_mtime_ns)
        for f in sorted(Path(folder).glob("*.pt.trace.json*"))
    )
    return _point_profile(str(folder), files)


@lru_cache(maxsize=512)
def _point_profile(folder: str, files: tuple) -> tuple[ComputeProfile, dict[str, float]]:
    del files  # part of the key only
    traces = point_traces(Path(folder))
    return from_traces(traces, folder), traced_comm(traces)


def compute_profiles(run_dir: Path, meta: dict, ok: pd.DataFrame) -> dict[str, ComputeProfile]:
    """Each ok point's computation profile: pooled over the points of the same model and
    implementation in the sweeps of ``POOLED_SWEEPS``, its own elsewhere."""
    own = {
        r["point"]: point_profile(run_dir / "traces" / str(r["point"]))[0] for _, r in ok.iterrows()
    }
    if meta.get("sweep") not in POOLED_SWEEPS:
        return own
    out = {}
    for (model, impl), g in ok.groupby(["model", "impl"]):
        shared = pooled([own[p] for p in g["point"]], f"{run_dir.name}: {model} {impl}")
        out.update({p: shared for p in g["point"]})
    return out


def predict_run(
    run_dir: Path, meta: dict, ok: pd.DataFrame, comm: CommModel, points: dict[str, PointRecord]
) -> pd.DataFrame:
    """Measured next to predicted, one row per ok point of a training run (``points``: its
    records, by id)."""
    profiles = compute_profiles(run_dir, meta, ok)
    share = overlap_share(meta)
    rows = []
    for _, r in ok.iterrows():
        out = {
            "run": run_dir.name,
            "point": r["point"],
            "sweep": r["sweep"],
            "value": r["value"],
            "model": r["model"],
            "impl": r["impl"],
            "strategy": r["strategy"],
            "world_size": int(r["world_size"]),
            "measured_step_ms": r["step_ms_median"],
            # the profiled steps the computation is read from (no barrier between steps)
            "measured_window_ms": r.get("window_ms", np.nan),
            "measured_step_ms_p10": r.get("step_ms_p10", np.nan),
            "measured_step_ms_p90": r.get("step_ms_p90", np.nan),
            "measured_exposed_comm_ms": r["exposed_comm_ms"],
            "measured_overlap_pct": r["overlap_pct"],
            "measured_comm_ms": r["comm_ms"],
            **point_profile(run_dir / "traces" / str(r["point"]))[1],
        }
        prof = profiles[r["point"]]
        out["compute_source"] = "pooled" if prof.points > 1 else "own"
        point = points.get(r["point"])
        try:
            if point is None:
                raise Unmodelled("the run's points record has no such point")
            tl = simulate_case(case_of(point), prof, comm, share=share)
            m = tl.metrics()
            out.update(
                {
                    "predicted_step_ms": m["step_ms"],
                    "predicted_exposed_comm_ms": m["exposed_comm_ms"],
                    "predicted_overlap_pct": m["overlap_pct"],
                    "predicted_comm_ms": m["comm_ms"],
                    "note": "",
                }
            )
        except Unmodelled as e:
            out["note"] = str(e)
        rows.append(out)
    df = pd.DataFrame(rows)
    for col in (
        "predicted_step_ms",
        "predicted_exposed_comm_ms",
        "predicted_overlap_pct",
        "predicted_comm_ms",
    ):
        if col not in df:
            df[col] = np.nan
    df["step_error_pct"] = 100.0 * (df["predicted_step_ms"] / df["measured_step_ms"] - 1.0)
    df["window_error_pct"] = 100.0 * (df["predicted_step_ms"] / df["measured_window_ms"] - 1.0)
    return df
