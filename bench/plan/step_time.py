"""A configuration's step time at the target scale: the cost model's schedules
(``bench.model.predict``: DDP buckets, FSDP units, TP's calls) over the target's links.

Computation is the configuration's own FLOPs per rank (counted by torch's ``FlopCounterMode``
in the step the planner tracks under fake tensors, activation checkpointing's recomputation
included) at the rate of the configuration's precision, plus a cost per micro-batch
(``calibrate.py``: both fitted to profiled steps of the model, here or in ``--compute`` runs
scaled by the devices' peaks; or the peak times an assumed MFU, ``--mfu``). Forward is a
third of a step's FLOPs, backward two thirds (a fourth and three fourths with checkpointing,
which repeats the forward; Narayanan et al., SC'21, section 5.1), and each gradient is ready
when backward has done its parameters' share (backward FLOPs of a linear layer are
proportional to its parameters). The optimiser step is
AdamW's traffic, 28 bytes per parameter a rank holds (reads of the parameter, gradient and two
moments, writes of three), at the device's memory bandwidth.

Links: a group inside a node (TP, HYBRID_SHARD's shard group, a world of one node) runs on
the first ``--link``, a group spanning nodes on the last (rings are as slow as their slowest
hop). With gradient accumulation, the micro-batches before the last compute without
communicating; what FSDP gathers in each of them is not modelled, its own computation is.

FSDP's own computation (copies into and out of its collectives' buffers, its hooks), which its
FLOPs do not count, is measured on a CPU plan (``calibrate.fsdp_extra``) and spread over its
units; elsewhere it is left out (on a GPU its copies are kernels at the memory's bandwidth).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from bench.model import schedule as sch
from bench.model.comm import load_runs
from bench.model.compute import ComputeProfile
from bench.model.links import LinkCosts, parse_link
from bench.model.predict import SIMULATORS, UNMODELLED_KNOBS, Unmodelled, case_of
from bench.plan.calibrate import Rate
from bench.runfolder.points import PointRecord
from parallel_kernels.models import workload

ADAMW_BYTES_PER_PARAM = 28


@dataclass(frozen=True)
class Topology:
    """The costs of a collective inside a node and across nodes (``time(collective, bytes,
    ranks)``: a link preset's, or collectives fitted on this machine), and the share of a core
    computation keeps while communication runs beside it (``predict.overlap_share``)."""

    intra: object
    inter: object
    gpus_per_node: int
    about: str
    share: float = 1.0

    @classmethod
    def of_links(cls, links: str, gpus_per_node: int, share: float = 1.0) -> Topology:
        names = [t for t in links.split(",") if t.strip()] or ["nvlink4"]
        if len(names) > 2:
            raise ValueError(f"--link takes one or two links (intra-node,inter-node), got {links}")
        intra, inter = LinkCosts(parse_link(names[0])), LinkCosts(parse_link(names[-1]))
        about = f"inside a node {intra.link.describe()}; across nodes {inter.link.describe()}"
        return cls(intra, inter, gpus_per_node, about, share)

    @classmethod
    def fitted(cls, run: Path, gpus_per_node: int, share: float) -> Topology:
        """Collectives fitted to a ``--sweep message_size`` run of this machine, both links."""
        costs = load_runs([run])
        return cls(
            costs, costs, gpus_per_node, f"{costs.backend} collectives fitted to {run}", share
        )

    def of_world(self, world: int):
        return self.intra if world <= self.gpus_per_node else self.inter


@functools.cache
def param_bytes(model: str) -> tuple[int, ...]:
    """The plain model's parameters' fp32 bytes in backward's order (registration reversed),
    a tied one once; from the model on the meta device (no memory)."""
    with torch.device("meta"):
        twin = workload(model).build()
    seen, sizes = set(), []
    for p in twin.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            sizes.append(4 * p.numel())
    return tuple(reversed(sizes))


def optimiser_ms(state_bytes: float, bandwidth_GBps: float) -> float:
    """AdamW's step over the parameters a rank holds (ZeRO's 16 bytes of state per parameter)."""
    return 1e3 * state_bytes / 16 * ADAMW_BYTES_PER_PARAM / (bandwidth_GBps * 1e9)


def compute_profile(
    point: PointRecord, flops: float, rate: Rate, bandwidth_GBps: float
) -> ComputeProfile:
    """One micro-batch's computation of the configuration on the target (the schedules
    simulate the last micro-batch, which communicates)."""
    accum = int(point.knobs["grad_accum"])
    total_ms = 1e3 * flops / (rate.tflops * 1e12) / accum + rate.micro_ms
    checkpointed = point.knobs["activation_checkpointing"] == "on"
    if checkpointed:  # what checkpointing costs this host beyond its FLOPs (calibrate.py)
        total_ms *= rate.ckpt_factor
    forward = 0.25 if checkpointed else 1 / 3
    sizes = [b // point.tp_size for b in param_bytes(point.model)]
    done, ready = 0, []
    backward_ms = total_ms * (1 - forward)
    for b in sizes:
        done += b
        ready.append(backward_ms * done / sum(sizes))
    after_ms = optimiser_ms(
        point.figures.get("state_bytes_expected") or 4 * sum(sizes), bandwidth_GBps
    )
    return ComputeProfile(
        forward_ms=total_ms * forward,
        backward_ms=backward_ms,
        after_ms=after_ms,
        grad_ready_ms=tuple(ready),
        grad_bytes=tuple(sizes),
        source="FLOPs counted under fake tensors",
    )


def _modelled_case(point: PointRecord):
    """The point's case with the knobs the planner models itself (precision, accumulation,
    checkpointing: in the computation) at their defaults, which the schedules take."""
    case = case_of(point)
    knobs = dict(case.knobs)
    for k in UNMODELLED_KNOBS:
        if k in knobs:
            knobs[k] = case.defaults[k]
    return replace(case, knobs=knobs)


def _program(point: PointRecord, prof: ComputeProfile, topo: Topology) -> list:
    case, world = _modelled_case(point), point.world_size
    spans = topo.of_world(world)
    if case.schedule == "ddp":
        return SIMULATORS["ddp"](case, prof, spans)
    if case.schedule == "fsdp":
        if case.knobs["sharding_strategy"] == "HYBRID_SHARD":
            shard = case.knobs.get("shard_size") or world // 2
            return SIMULATORS["fsdp"](case, prof, topo.of_world(shard), outer=spans)
        return SIMULATORS["fsdp"](case, prof, spans)
    if case.schedule == "tp":
        return SIMULATORS["tp"](case, prof, topo.of_world(case.tp), outer=spans)
    raise Unmodelled(f"schedule {case.schedule} is not modelled")


def _with_own_work(prof: ComputeProfile, extra_ms: float) -> ComputeProfile:
    """``prof`` with ``extra_ms`` of the implementation's own work per step (TP's: DTensor's
    dispatch, per op), a third in forward and two in backward as FSDP's (``predict.fsdp``: a
    backward op is two of a forward's), the gradients' ready times stretched with backward."""
    if not extra_ms:
        return prof
    backward = prof.backward_ms + 2 * extra_ms / 3
    stretch = backward / prof.backward_ms if prof.backward_ms > 0 else 1.0
    return replace(
        prof,
        forward_ms=prof.forward_ms + extra_ms / 3,
        backward_ms=backward,
        grad_ready_ms=tuple(t * stretch for t in prof.grad_ready_ms),
    )


def predict_step(
    point: PointRecord, flops: float, rate: Rate, bandwidth_GBps: float, topo: Topology
) -> dict:
    """The configuration's predicted step: ``step_ms`` and its communication, or ``time_error``
    where the schedules do not model it."""
    if not (flops > 0 and math.isfinite(flops)):
        return {"time_error": "no FLOPs count (the tracked step failed)"}
    prof = compute_profile(point, flops, rate, bandwidth_GBps)
    if point.schedule == "fsdp":
        extra = rate.fsdp_extra_ms(point.impl, point.knobs["sharding_strategy"])
        prof = replace(prof, fsdp_extra_ms=extra)
    if point.schedule == "tp":
        prof = _with_own_work(prof, rate.tp_extra_ms(point.impl))
    try:
        timeline = sch.simulate(_program(point, prof, topo), share=topo.share)
    except Unmodelled as e:
        return {"time_error": str(e)}
    m = timeline.metrics()
    accum = int(point.knobs["grad_accum"])
    # no communication in them; FSDP's own work in each (its gathers' copies)
    before = (accum - 1) * (prof.forward_ms + prof.backward_ms + prof.fsdp_extra_ms)
    step_ms = m["step_ms"] + before
    return {
        "step_ms": step_ms,
        "compute_ms": m["compute_ms"] + before,
        "comm_ms": m["comm_ms"],
        "exposed_comm_ms": m["exposed_comm_ms"],
        "time_error": "",
    }
