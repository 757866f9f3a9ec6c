"""The time stage: each configuration's step at the target scale, the cost model's schedules
(``bench.model.predict.simulate_case``: DDP buckets, FSDP units, TP's calls) over the target's
links (``topology.py``).

Computation is the configuration's own ops per rank (``op_mix.py``: counted under fake tensors,
activation checkpointing's recomputation included), each priced on the target's roofline
(``op_prices.py``; ``rank_ops``, ``priced_profile``): the forward's ops, the backward's, then the
optimiser's; plus a calibrated cost per micro-batch. Without a roofline (``--mfu``), its FLOPs
at the rate of its precision plus a cost per micro-batch (``compute_profile``): forward is a
third of the model's FLOPs, backward two thirds and what checkpointing recomputes (a fourth
and three fourths in full, which repeats the forward; Narayanan et al., SC'21, section 5.1),
and each gradient is ready when backward has done its parameters' share (backward FLOPs of a
linear layer are proportional to its parameters). The optimiser step is AdamW's traffic at the
device's memory bandwidth (``rates.optimiser_ms``).

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
from dataclasses import dataclass, field, replace

from bench.model.compute import ComputeProfile
from bench.model.predict import UNMODELLED_KNOBS, Unmodelled, case_of, simulate_case, simulator
from bench.plan.calibration import Target
from bench.plan.families import FAMILIES, OP_DISPATCH, UNIT_COPIES
from bench.plan.memory import blocks_of
from bench.plan.op_mix import COMPUTE, PHASES, OpMix
from bench.plan.op_prices import Priced, Pricing, priced
from bench.plan.pipeline_time import predict_pipeline
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
    # the computation's ops on the roofline, a step's (``op_prices.Priced``); None: not priced
    # op by op (an assumed MFU)
    ops: Priced | None = None
    # columns of a family's own (a pipeline's bubble: ``pipeline_time.PipelineStep``)
    extra: dict = field(default_factory=dict)

    def columns(self) -> dict:
        """plan.csv's columns of it: only ``time_error`` where it has no step. The predicted
        waterfall: the step's computation in compute-bound ops (``matmul_ms``), memory-bound
        ops and the ops' fixed costs, and what the ops do not price (``other_compute_ms``: an
        implementation's own work, checkpointing's measured extra); beside it the exposed
        communication."""
        if self.error:
            return {"time_error": self.error}
        ops = self.ops or Priced(math.nan, math.nan, math.nan)
        return {
            "step_ms": self.step_ms,
            "compute_ms": self.compute_ms,
            "matmul_ms": ops.matmul_ms,
            "memory_bound_ms": ops.memory_ms,
            "op_fixed_ms": ops.fixed_ms,
            "other_compute_ms": self.compute_ms - ops.total_ms,
            "comm_ms": self.comm_ms,
            "exposed_comm_ms": self.exposed_comm_ms,
            "time_error": "",
            **self.extra,
        }


def step_times(configs: list[Config], figures: list[Tracked], target: Target) -> list[StepTime]:
    """Each configuration's step on the target, from its FLOPs as the memory stage counted
    them (``figures``, in the configurations' order); a pipelined family's from its stages'
    ops over its schedule (``pipeline_time.py``)."""
    out = []
    for c, t in zip(configs, figures, strict=True):
        if FAMILIES[c.family].pipelined:
            out.append(pipeline_step(c, t, target))
            continue
        rate = target.rate_for(c.knobs)
        flops = c.step_flops(t.flops)
        bandwidth = target.device.bandwidth_GBps
        out.append(predict_step(c, flops, rate, bandwidth, target.topology, t.ops, t))
    return out


def pipeline_step(c: Config, t: Tracked, target: Target) -> StepTime:
    """A pipeline row's step (``pipeline_time.predict_pipeline``), or why it has none."""
    if t.pipeline is None:
        return StepTime(error="no stage costs (the tracked step failed)")
    got = predict_pipeline(c, t.pipeline, target)
    return StepTime(
        got.step_ms,
        got.compute_ms,
        got.comm_ms,
        got.exposed_comm_ms,
        ops=got.ops,
        extra=got.columns,
    )


@dataclass(frozen=True)
class StepOps:
    """A configuration's ops as one rank runs them, priced: a micro-batch's forward and
    backward, and the optimiser's step."""

    forward: Priced
    backward: Priced
    optimiser: Priced

    def step(self, accum: int) -> Priced:
        return self.optimiser.plus(self.forward.plus(self.backward), accum)


def rank_ops(point: PointRecord, ops: OpMix, pricing: Pricing) -> StepOps:
    """``ops`` (the plain model's, ``memory.step_ops``) as one rank of ``point`` runs them,
    priced: a TP rank computes 1/tp of each forward and backward op, and steps AdamW over
    the share of the state it holds (its row's expected state bytes over the whole model's),
    each tensor's ops launched still."""
    tp = point.tp_size
    state = point.figures.get("state_bytes_expected") or 4 * sum(param_bytes(point.model)) / tp
    share = state / (4 * sum(param_bytes(point.model)))
    mine = ops.shared(1 / tp, COMPUTE).shared(share, ("optimiser",))
    return StepOps(*(priced(mine.of((phase,)), pricing) for phase in PHASES))


def priced_profile(point: PointRecord, ops: StepOps, rate: Rate) -> ComputeProfile:
    """One micro-batch's computation of the configuration on the target priced op by op
    (``compute_profile``'s, on the roofline): its forward and backward as their ops price,
    the gradients ready as backward does their parameters' share, then the optimiser's ops."""
    factor = _factor(point, rate)
    forward_ms = ops.forward.total_ms * factor + rate.micro_ms / 3
    backward_ms = ops.backward.total_ms * factor + 2 * rate.micro_ms / 3
    sizes = [b // point.tp_size for b in param_bytes(point.model)]
    return ComputeProfile(
        forward_ms=forward_ms,
        backward_ms=backward_ms,
        after_ms=ops.optimiser.total_ms,
        grad_ready_ms=_ready(sizes, backward_ms),
        grad_bytes=tuple(sizes),
        source=f"ops counted under fake tensors, {rate.source}",
    )


def _ready(sizes: list[int], backward_ms: float) -> tuple[float, ...]:
    """When each gradient is ready: backward has done its parameters' share (backward FLOPs
    of a linear layer are proportional to its parameters)."""
    done, ready = 0, []
    for b in sizes:
        done += b
        ready.append(backward_ms * done / sum(sizes))
    return tuple(ready)


def _factor(point: PointRecord, rate: Rate) -> float:
    """The point's checkpointing's cost beyond its ops' (``Rate.recompute_factor``)."""
    return rate.recompute_factor(point.knobs["activation_checkpointing"], blocks_of(point.model))


def compute_profile(
    point: PointRecord, flops: float, rate: Rate, bandwidth_GBps: float, recompute_share: float
) -> ComputeProfile:
    """One micro-batch's computation of the configuration on the target (the schedules
    simulate the last micro-batch, which communicates); ``recompute_share``: the share of
    its FLOPs that checkpointing recomputes, in backward."""
    accum = int(point.knobs["grad_accum"])
    total_ms = 1e3 * flops / (rate.tflops * 1e12) / accum + rate.micro_ms
    total_ms *= _factor(point, rate)  # what checkpointing costs beyond its FLOPs (rates.py)
    forward = (1 - recompute_share) / 3  # a third of the model's FLOPs; 1/4 with full's
    sizes = [b // point.tp_size for b in param_bytes(point.model)]
    backward_ms = total_ms * (1 - forward)
    ready = _ready(sizes, backward_ms)
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
    c: Config,
    flops: float,
    rate: Rate,
    bandwidth_GBps: float,
    topo: Topology,
    ops: OpMix | None = None,
    figures: Tracked | None = None,
) -> StepTime:
    """The configuration's predicted step: ``step_ms`` and its communication, or its error
    where the schedules do not model it. Its computation is its ``ops`` priced on the
    rate's roofline where it has one (``rank_ops``), else its FLOPs at the rate, of which
    its ``figures`` say what checkpointing recomputes."""
    if not (flops > 0 and math.isfinite(flops)):
        return StepTime(error="no FLOPs count (the tracked step failed)")
    point = c.point()
    mine = None
    if rate.pricing is not None and ops is not None:
        mine = rank_ops(point, ops, rate.pricing)
        prof = priced_profile(point, mine, rate)
    else:
        again = figures.recompute_flops / figures.flops if figures is not None else 0.0
        prof = compute_profile(point, flops, rate, bandwidth_GBps, again)
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
        ops=mine.step(accum) if mine is not None else None,
    )
