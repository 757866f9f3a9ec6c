"""The time stage of a pipelined family (``families.Family.pipelined``: ``pp``): a row's step
simulated over its schedule (``bench.model.pipeline_sim``).

Each stage's forward and backward of one micro-batch are its ops priced on the target's
roofline (``op_prices.py``; without one, their FLOPs at the rate), as the other families'
computation is (``step_time.priced_profile``): checkpointing's measured factor on both, and the
calibrated cost of a micro-batch beyond its ops shared among the stages by their ops. A
stage's output goes to the next over the link between their ranks (a pipeline's ranks are
consecutive, ``parallel_kernels.pipeline.pipe_dims``: inside a node, but where a hop crosses
a node's edge), priced as one step of a two-rank ring. Where FSDP2 shards the stages over
their replicas (``dp_shard``), each micro-batch's forward and backward on a stage add its
all-gathers and reduce-scatter (``stage_replicas.collectives``, on the link the world spans, not
overlapped) and FSDP2's own work, per unit (each block and the stage's root, ``stage_units``):
the ``fsdp2`` family's calibrated cost per unit where the plan's calibration launch measured it
(its own work per step over its units), else its copies (``stage_replicas.unit_copies``) priced
as memory-bound ops on the roofline (at the memory's bandwidth without one); a third in forward,
two in backward, as ``step_time.py`` spreads the ``fsdp2`` family's. After the schedule, as the
implementation steps (``parallel_kernels/pipeline.py``):
the tied weights' gradients summed over the pipeline (their shard, sharded), each stage's
gradients averaged over its replicas where they are replicated (one flat all-reduce, on the link
the world spans, not overlapped), the loss broadcast, then each rank's optimiser step over its
stage: the step ends with the slowest.

The row's computation and waterfall are the busiest stage's; its bubble (``bubble_pct``) the
mean share of the schedule's span the stages idle, beside the theory's (p - 1) / (m + p - 1)
(``bubble_theory_pct``), which holds for equal stages over free links.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.model.pipeline_sim import StageCost, StagedPipeline, simulate_pipeline
from bench.plan.calibration import Target
from bench.plan.families import own_works
from bench.plan.memory import blocks_of
from bench.plan.op_mix import COMPUTE, PHASES, OpClass, OpMix
from bench.plan.op_prices import Priced, priced
from bench.plan.pipeline_memory import PipelineCosts, memory_blocks
from bench.plan.rates import Rate, optimiser_ms
from bench.plan.space import Config
from bench.plan.stage_replicas import (
    AFTER,
    BACKWARD,
    FORWARD,
    SHARDING,
    collectives,
    replicas,
    sharded,
    stage_units,
    unit_copies,
)
from bench.plan.topology import Topology
from parallel_kernels.pipeline_stages import block_ranges
from parallel_kernels.pipeline_theory import Pipeline, bubble_fraction, p2p_bytes_per_step

LOSS_BYTES = 4  # the loss every rank is sent (one fp32 scalar)


@dataclass(frozen=True)
class PipelineStep:
    """A pipeline row's step: what ``step_time.StepTime`` holds, and its own columns."""

    step_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    ops: Priced | None
    columns: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StagePriced:
    """One stage's micro-batch forward and backward and its optimiser step, ms, and its ops
    (a step's, priced; None where priced by FLOPs)."""

    forward_ms: float
    backward_ms: float
    optimiser_ms: float
    ops: Priced | None


def price_stage(
    ops: OpMix, grad_bytes: float, share: float, c: Config, target: Target
) -> StagePriced:
    """A stage's costs from its ops: on the roofline where the rate has one, else their FLOPs
    at the rate and AdamW's traffic over the stage's state (its gradients' bytes, 4 times);
    ``share``, its part of the model's ops, takes that part of the calibrated cost of a
    micro-batch beyond them."""
    rate = target.rate_for(c.knobs)
    factor = rate.recompute_factor(c.checkpointing, blocks_of(c.model))
    if rate.pricing is not None:
        fwd, bwd, opt = (priced(ops.of((p,)), rate.pricing) for p in PHASES)
        step = opt.plus(fwd.plus(bwd), int(c.knobs["pp_microbatches"]))
        f, b, o = fwd.total_ms, bwd.total_ms, opt.total_ms
    else:
        f, b = (1e3 * ops.of((p,)).flops() / (rate.tflops * 1e12) for p in COMPUTE)
        o, step = optimiser_ms(4 * grad_bytes, target.device.bandwidth_GBps), None
    micro = share * rate.micro_ms
    return StagePriced(f * factor + micro / 3, b * factor + 2 * micro / 3, o, step)


@dataclass(frozen=True)
class OwnWork:
    """FSDP2's own work on each stage's rank per micro-batch, ms, in forward and in backward
    (0 on a replicated stage), and where its figure comes from (plan.csv's
    ``fsdp_own_work_source``; "" where there is none)."""

    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    source: str = ""


def own_work(c: Config, grad_bytes: tuple[float, ...], target: Target) -> OwnWork:
    """What FSDP2 does itself on each stage of ``c`` (its parameters' bytes ``grad_bytes``)
    per micro-batch: its units times the calibrated cost per unit where the rate has one for
    the sharding family's implementation, else its units' copies priced op by op."""
    blocks = memory_blocks(c.model)
    sizes = [len(r) for r in block_ranges(blocks, int(c.knobs["pp_degree"]))]
    units = [stage_units(c.knobs, c.world_size, b) for b in sizes]
    if not any(units):
        return OwnWork((0.0,) * len(units), (0.0,) * len(units))
    rate, by = target.rate_for(c.knobs), own_works(c.family, c.knobs)[-1]
    if by.impl in rate.fsdp_ms:
        unit = rate.fsdp_extra_ms(by.impl, SHARDING) / (blocks + 1)
        each = [u * unit for u in units]
        why = f"calibrated: {by.name}'s own work per step over its {blocks + 1} units"
        return OwnWork(tuple(e / 3 for e in each), tuple(2 * e / 3 for e in each), why)
    r = replicas(c.knobs, c.world_size)
    pairs = list(zip(grad_bytes, units, strict=True))
    each = [(u, _copies_ms(unit_copies(g, u, r), rate, target, c)) for g, u in pairs]
    return OwnWork(
        tuple(u * p[FORWARD] for u, p in each),
        tuple(u * p[BACKWARD] for u, p in each),
        "op model: its copies into and out of the collectives' buffers, memory-bound",
    )


def _copies_ms(copies, rate: Rate, target: Target, c: Config) -> dict[str, float]:
    """One unit's copies (``stage_replicas.unit_copies``), ms by phase: each reads and writes
    its bytes, on the rate's roofline as an op in a step, else at the memory's bandwidth."""
    out = dict.fromkeys((FORWARD, BACKWARD), 0.0)
    for k in copies:
        moved = 2 * k.nbytes
        if rate.pricing is None:
            out[k.phase] += 1e3 * moved / (target.device.bandwidth_GBps * 1e9)
            continue
        copy = OpClass(k.phase, "aten::copy_", c.knobs["precision"], 0.0, moved)
        out[k.phase] += priced(OpMix({copy: 1}), rate.pricing).total_ms
    return out


def _p2p_ms(topo: Topology, nbytes: float, crosses: bool) -> float:
    """A send of ``nbytes`` between two ranks: one step of a two-rank ring, what a two-rank
    all-gather of twice the bytes costs (the one collective every cost model here prices)."""
    link = topo.inter if crosses else topo.intra
    return 1e3 * link.time("all_gather", 2 * nbytes, 2)


def _all_reduce_ms(link, nbytes: float, ranks: int) -> float:
    return 1e3 * link.time("all_reduce", nbytes, ranks) if nbytes > 0 and ranks > 1 else 0.0


def sends_ms(c: Config, costs: PipelineCosts, topo: Topology) -> tuple[float, ...]:
    """Each hop's send of a micro-batch's activation: inside a node, but where the pipeline's
    consecutive ranks cross a node's edge."""
    degree, per_node = int(c.knobs["pp_degree"]), topo.gpus_per_node
    crosses = [degree > per_node and (s + 1) % per_node == 0 for s in range(degree - 1)]
    return tuple(_p2p_ms(topo, b, x) for b, x in zip(costs.sends, crosses, strict=True))


def replica_ms(c: Config, stage_bytes: float, topo: Topology) -> dict[str, float]:
    """A stage's collectives over its replicas (``stage_replicas.collectives``), ms, by where
    they run: in each micro-batch's forward, in its backward, and after the schedule."""
    link, m = topo.of_world(c.world_size), int(c.knobs["pp_microbatches"])
    out = dict.fromkeys((FORWARD, BACKWARD, AFTER), 0.0)
    for k in collectives(c.knobs, c.world_size, stage_bytes):
        times = k.per_step if k.phase == AFTER else k.per_step / m
        out[k.phase] += times * 1e3 * link.time(k.name, k.nbytes, k.ranks)
    return out


def after_schedule_ms(c: Config, costs: PipelineCosts, topo: Topology) -> float:
    """What follows the schedule before the optimiser: the tied weights' gradients summed over
    the pipeline (a rank's shard of them where FSDP2 shards), each stage's collectives after
    the schedule (DDP's all-reduce over its replicas), the loss broadcast (priced as a
    scalar's all-reduce)."""
    degree = int(c.knobs["pp_degree"])
    shared = costs.shared_bytes / (
        replicas(c.knobs, c.world_size) if sharded(c.knobs, c.world_size) else 1
    )
    pipe = topo.of_world(degree)
    return (
        _all_reduce_ms(pipe, shared, degree)
        + max(replica_ms(c, g, topo)[AFTER] for g in costs.grad_bytes)
        + _all_reduce_ms(pipe, LOSS_BYTES, degree)
    )


def _sent(c: Config, costs: PipelineCosts) -> int:
    """The most bytes a rank sends in a step (``pipeline_theory.p2p_bytes_per_step``)."""
    degree, m = int(c.knobs["pp_degree"]), int(c.knobs["pp_microbatches"])
    edges = [0, *map(int, costs.sends), 0]
    pipe = Pipeline(degree, m)
    return max(p2p_bytes_per_step(pipe, s, edges[s], edges[s + 1]) for s in range(degree))


def predict_pipeline(c: Config, costs: PipelineCosts, target: Target) -> PipelineStep:
    """``c``'s step on ``target``: its schedule simulated over its stages' costs, then the
    collectives and the optimiser steps after it."""
    degree, m = int(c.knobs["pp_degree"]), int(c.knobs["pp_microbatches"])
    total = sum(o.of(COMPUTE).ops() for o in costs.ops) or 1.0
    stages = [
        price_stage(o, g, o.of(COMPUTE).ops() / total, c, target)
        for o, g in zip(costs.ops, costs.grad_bytes, strict=True)
    ]
    own = own_work(c, costs.grad_bytes, target)
    stages = [
        replace(s, forward_ms=s.forward_ms + f, backward_ms=s.backward_ms + b)
        for s, f, b in zip(stages, own.forward_ms, own.backward_ms, strict=True)
    ]
    sends = sends_ms(c, costs, target.topology)
    rep = [replica_ms(c, g, target.topology) for g in costs.grad_bytes]
    each = tuple(
        StageCost(s.forward_ms + r[FORWARD], s.backward_ms + r[BACKWARD])
        for s, r in zip(stages, rep, strict=True)
    )
    timeline = simulate_pipeline(StagedPipeline(c.knobs["pp_schedule"], m, each, sends))
    after = after_schedule_ms(c, costs, target.topology)
    busiest = max(stages, key=lambda s: s.forward_ms + s.backward_ms)
    in_actions = m * max(r[FORWARD] + r[BACKWARD] for r in rep)  # FSDP2's: not overlapped
    pipe = Pipeline(degree, m)
    return PipelineStep(
        step_ms=timeline.makespan_ms + after + max(s.optimiser_ms for s in stages),
        compute_ms=m * (busiest.forward_ms + busiest.backward_ms) + busiest.optimiser_ms,
        comm_ms=after + in_actions + m * sum(sends),
        exposed_comm_ms=after + in_actions,
        ops=busiest.ops,
        columns={
            "bubble_pct": 100 * timeline.mean_bubble(),
            "bubble_theory_pct": 100 * bubble_fraction(pipe),
            "p2p_bytes_per_step": _sent(c, costs),
            **({"fsdp_own_work_source": own.source} if own.source else {}),
        },
    )
