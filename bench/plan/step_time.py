"""The time stage: each configuration's step at the target scale, the cost model's schedules
(``bench.model.predict.simulate_case``: DDP buckets, FSDP units, TP's calls) over the target's
links (``topology.py``).

Computation is the configuration's own FLOPs per rank (counted by torch's ``FlopCounterMode``
in the step the planner tracks under fake tensors, activation checkpointing's recomputation
included) at the rate of the configuration's precision, plus a cost per micro-batch
(``rates.py``: both fitted to profiled steps of the model, here or in ``--compute`` runs
scaled by the devices' peaks; or the peak times an assumed MFU, ``--mfu``). Forward is a
third of a step's FLOPs, backward two thirds (a fourth and three fourths with checkpointing,
which repeats the forward; Narayanan et al., SC'21, section 5.1), and each gradient is ready
when backward has done its parameters' share (backward FLOPs of a linear layer are
proportional to its parameters). The optimiser step is AdamW's traffic at the device's memory
bandwidth (``rates.optimiser_ms``).

Links: a schedule's own group (its ``Simulator.group``: TP's, HYBRID_SHARD's shard group, else
the world) runs on the first ``--link`` where it fits in a node, on the last where it spans
nodes (rings are as slow as their slowest hop), and what crosses its replicas on the world's.
With gradient accumulation, the micro-batches before the last compute without communicating;
what FSDP gathers in each of them is not modelled, its own computation is.

An implementation's own computation, which its FLOPs do not count, is its family's fact
(``families.Family.own_work``), measured on a CPU plan and left out elsewhere (on a GPU FSDP's
copies are kernels at the memory's bandwidth): FSDP's copies into and out of its collectives'
buffers and its hooks, spread over its units (``rates.fsdp_extra``); TP's dispatch per op, a
third in forward and two in backward (``rates.tp_extra``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bench.model.compute import ComputeProfile
from bench.model.predict import UNMODELLED_KNOBS, Unmodelled, case_of, simulate_case, simulator
from bench.plan.calibration import Target
from bench.plan.families import FAMILIES, OP_DISPATCH, UNIT_COPIES
from bench.plan.rates import Rate, optimiser_ms, param_bytes
from bench.plan.space import Config
from bench.plan.topology import Topology
from bench.plan.tracked import Tracked
from bench.runfolder.points import PointRecord


@dataclass(frozen=True)
class StepTime:
    """A configuration's predicted step, or why it has none (``error``)."""

    step_ms: float = math.nan
    compute_ms: float = math.nan
    comm_ms: float = math.nan
    exposed_comm_ms: float = math.nan
    error: str = ""

    def columns(self) -> dict:
        """plan.csv's columns of it: only ``time_error`` where it has no step."""
        if self.error:
            return {"time_error": self.error}
        return {
            "step_ms": self.step_ms,
            "compute_ms": self.compute_ms,
            "comm_ms": self.comm_ms,
            "exposed_comm_ms": self.exposed_comm_ms,
            "time_error": "",
        }


def step_times(configs: list[Config], figures: list[Tracked], target: Target) -> list[StepTime]:
    """Each configuration's step on the target, from its FLOPs as the memory stage counted
    them (``figures``, in the configurations' order)."""
    out = []
    for c, t in zip(configs, figures, strict=True):
        rate = target.rates[c.knobs["precision"]]
        flops = c.step_flops(t.flops)
        out.append(predict_step(c, flops, rate, target.device.bandwidth_GBps, target.topology))
    return out


def compute_profile(
    point: PointRecord, flops: float, rate: Rate, bandwidth_GBps: float
) -> ComputeProfile:
    """One micro-batch's computation of the configuration on the target (the schedules
    simulate the last micro-batch, which communicates)."""
    accum = int(point.knobs["grad_accum"])
    total_ms = 1e3 * flops / (rate.tflops * 1e12) / accum + rate.micro_ms
    checkpointed = point.knobs["activation_checkpointing"] == "on"
    if checkpointed:  # what checkpointing costs this host beyond its FLOPs (rates.py)
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


# What a family's implementation computes beyond its FLOPs (``families.Family.own_work``),
# added to the micro-batch's computation: (profile, rate, point) -> profile.
OWN_WORK = {
    "": lambda prof, rate, point: prof,
    # spread over FSDP's units by its schedule, in every micro-batch (its gathers' copies)
    UNIT_COPIES: lambda prof, rate, point: replace(
        prof, fsdp_extra_ms=rate.fsdp_extra_ms(point.impl, point.knobs["sharding_strategy"])
    ),
    OP_DISPATCH: lambda prof, rate, point: _with_own_work(prof, rate.tp_extra_ms(point.impl)),
}


def predict_step(
    c: Config, flops: float, rate: Rate, bandwidth_GBps: float, topo: Topology
) -> StepTime:
    """The configuration's predicted step: ``step_ms`` and its communication, or its error
    where the schedules do not model it."""
    if not (flops > 0 and math.isfinite(flops)):
        return StepTime(error="no FLOPs count (the tracked step failed)")
    point = c.point()
    prof = compute_profile(point, flops, rate, bandwidth_GBps)
    prof = OWN_WORK[FAMILIES[c.family].own_work](prof, rate, point)
    case = _modelled_case(point)
    try:
        own = topo.of_world(simulator(case).group(case))
        spans = topo.of_world(point.world_size)
        timeline = simulate_case(case, prof, own, share=topo.share, outer=spans)
    except Unmodelled as e:
        return StepTime(error=str(e))
    m = timeline.metrics()
    accum = int(point.knobs["grad_accum"])
    # no communication in them; FSDP's own work in each (its gathers' copies)
    before = (accum - 1) * (prof.forward_ms + prof.backward_ms + prof.fsdp_extra_ms)
    return StepTime(
        step_ms=m["step_ms"] + before,
        compute_ms=m["compute_ms"] + before,
        comm_ms=m["comm_ms"],
        exposed_comm_ms=m["exposed_comm_ms"],
    )
