"""The planner's pipeline rows (the ``pp`` family): the schedule's simulation against the theory,
the space of degrees, schedules and micro-batch counts with commands ``bench/run.py`` resolves,
each rank's memory extrapolated from proxies against the rank tracked in full, and a plan of
them on this machine, ranked with their memory and bubble columns filled. No launch: the
figures measured against runs are in docs/benchmarks.md."""

from __future__ import annotations

import functools
import shlex
from types import SimpleNamespace

import pandas as pd
import pytest

from bench.model.pipeline_sim import StageCost, StagedPipeline, simulate_pipeline
from bench.plan import __main__ as plan_cli
from bench.plan import calibration, pipeline_memory, pipeline_time, stage_replicas
from bench.plan.calibration import Target
from bench.plan.devices import Device
from bench.plan.families import FAMILIES
from bench.plan.op_mix import OpMix
from bench.plan.rates import Rate
from bench.plan.request import OPTIONS, PlanRequest
from bench.plan.space import Config, enumerate_space
from bench.plan.topology import Topology
from bench.runner.cli import resolve
from bench.runner.configure.flags import parse_config
from parallel_kernels.models import TRANSFORMER_CUT, Block, Transformer, workload
from parallel_kernels.pipeline_theory import Pipeline, bubble_fraction
from parallel_kernels.workload import Workload

# a transformer of eight small blocks: enough to cut into 8 stages, or 2 of four blocks
DEEP = "tests/test_plan_pipeline.py:deep"


def deep() -> Workload:
    tiny = workload("transformer")
    return Workload(
        name="deep",
        build=functools.partial(Transformer, vocab=64, dim=32, heads=2, layers=8, seq=8),
        batch=_tokens,
        loss=tiny.loss,
        tokens_per_sample=8,
        fsdp_units=(Block,),
        pipeline=TRANSFORMER_CUT,
    )


def _tokens(n: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 64, (n, 9), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _run(schedule, m, costs, sends=None):
    p = len(costs)
    stages = tuple(StageCost(f, b) for f, b in costs)
    return simulate_pipeline(StagedPipeline(schedule, m, stages, sends or (0.0,) * (p - 1)))


@pytest.mark.unit
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equal_stages_over_free_links_idle_the_theorys_bubble_exactly(schedule):
    for p, m in ((2, 2), (2, 8), (3, 5), (4, 4), (8, 16)):
        for f, b in ((1.0, 1.0), (1.0, 2.0), (0.3, 0.7)):
            t = _run(schedule, m, [(f, b)] * p)
            theory = bubble_fraction(Pipeline(p, m))
            for s in range(p):
                assert t.bubble(s) == pytest.approx(theory, abs=1e-12), (p, m, f, b, s)
            assert t.makespan_ms == pytest.approx((m + p - 1) * (f + b))


@pytest.mark.unit
def test_1f1b_holds_p_minus_s_in_flight_where_gpipe_holds_every_micro_batch():
    p, m = 4, 8
    one = _run("1f1b", m, [(1.0, 2.0)] * p)
    gpipe = _run("gpipe", m, [(1.0, 2.0)] * p)
    assert [one.most_in_flight(s) for s in range(p)] == [4, 3, 2, 1]
    assert [gpipe.most_in_flight(s) for s in range(p)] == [m] * p
    # fewer micro-batches than stages: 1F1B's first stage holds them all
    assert _run("1f1b", 2, [(1.0, 2.0)] * p).most_in_flight(0) == 2


@pytest.mark.unit
def test_a_slow_stage_and_slow_links_idle_more_than_the_theory_says():
    theory = bubble_fraction(Pipeline(3, 6))
    slow = _run("1f1b", 6, [(1.0, 2.0), (2.0, 4.0), (1.0, 2.0)])
    assert slow.mean_bubble() > theory + 0.05
    assert slow.bubble(1) < theory < slow.bubble(0)  # the slow stage sets the pace, the rest wait
    sent = _run("1f1b", 6, [(1.0, 2.0)] * 3, sends=(0.5, 0.5))
    assert sent.makespan_ms > _run("1f1b", 6, [(1.0, 2.0)] * 3).makespan_ms


def _space(model, world, batch, options=None):
    request = PlanRequest(
        model=model,
        world_size=world,
        global_batch=batch,
        gpus_per_node=8,
        families=("pp",),
        options={**OPTIONS, **(options or {})},
    )
    return enumerate_space(request)


@pytest.mark.unit
def test_the_space_cuts_models_that_name_their_blocks_and_its_commands_resolve():
    configs = _space(DEEP, 16, 64, {"precision": ("fp32",), "activation_checkpointing": ("off",)})
    degrees = {c.knobs["pp_degree"] for c in configs}
    assert degrees == {2, 4, 8}  # divide the world, at most the model's 8 blocks
    assert {c.knobs["pp_schedule"] for c in configs} == {"gpipe", "1f1b"}
    for c in configs:
        d, m = c.knobs["pp_degree"], c.knobs["pp_microbatches"]
        assert m in (d, 2 * d, 4 * d) and c.micro_batch % m == 0
        assert c.micro_batch * (16 // d) == 64 and c.knobs["grad_accum"] == 1
    assert not _space("resnet:tiny", 4, 8)  # names no blocks to cut
    assert {c.knobs["pp_degree"] for c in _space("llama:tiny", 8, 16)} == {2}  # 2 blocks
    for c in [c for c in configs if c.knobs["pp_microbatches"] == 2 * c.knobs["pp_degree"]]:
        args = shlex.split(c.command())
        (point,) = resolve(parse_config(args[args.index("bench/run.py") + 1 :]), 16).points
        assert (point.strategy, point.impl) == ("pp", FAMILIES["pp"].impl)
        assert (
            point.batch_per_replica == c.micro_batch and point.dp_size == 16 // c.knobs["pp_degree"]
        )
        for knob in ("pp_degree", "pp_schedule", "pp_microbatches"):
            assert point.knobs[knob] == c.knobs[knob]


@pytest.mark.unit
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "degree,schedule,m,ckpt",
    [(2, "gpipe", 4, "off"), (8, "1f1b", 8, "on")],
    ids=["2 stages of 4 blocks", "8 stages, checkpointed"],
)
def test_a_ranks_memory_composed_over_its_order_is_the_rank_tracked_over_it(
    degree, schedule, m, ckpt
):
    """Each tracked rank composed from one step of two micro-batches of a proxy (of 3 stages
    at most, of one and two blocks a stage) against the rank tracked over its own schedule at
    its own degree (4 blocks a stage: extrapolated; 8 stages: 1F1B's in-flight counts)."""
    knobs = {"pp_degree": degree, "pp_schedule": schedule, "pp_microbatches": m}
    knobs |= {"activation_checkpointing": ckpt, "precision": "fp32", "grad_accum": 1}
    c = Config("pp", "pp", DEEP, "pp", FAMILIES["pp"].impl, knobs, 2 * m, degree)
    got = {}
    for js in pipeline_memory.jobs_of(c).values():
        for j in js:
            (got[pipeline_memory._key(j)],) = pipeline_memory.track_stage_build((j,), 8, False)
    pipe = Pipeline(degree, m)
    for role in pipeline_memory.roles(degree):
        stage = pipeline_memory.stage_index(role, degree)
        mem = pipeline_memory.role_memory(c, role, got)
        composed = pipeline_memory.compose(mem, schedule, pipe, stage)
        tracked = pipeline_memory.track_over_order(c, role)
        assert not tracked.error, tracked.error
        assert composed.peak_mib == pytest.approx(tracked.peak_mib, rel=0.01), role


@pytest.mark.unit
@pytest.mark.timeout(180)
def test_a_plan_of_pipelines_ranks_them_with_their_stage_memory_and_bubble(tmp_path):
    out = tmp_path / "plan"
    argv = ["--model", "llama:tiny", "--world-size", "2", "--device", "cpu"]
    argv += ["--global-batch", "8", "--family", "pp", "--no-calibration-launch"]
    argv += ["--link", "nvlink4", "--option", "precision=fp32"]
    argv += ["--only", "activation_checkpointing=off,selective:layer=2", "--workers", "1"]
    assert plan_cli.main([*argv, "--out", str(out)]) == 0
    rows = pd.read_csv(out / "plan.csv", keep_default_na=False)
    # every N-th block checkpointed is not planned for pipelines (their proxies' stages of one
    # and two blocks do not lay it out as the row does): error rows, unbuilt
    layer = rows["activation_checkpointing"] == "selective:layer=2"
    assert layer.sum() == 6 and set(rows.loc[layer, "error"]) == {pipeline_memory.UNALIKE}
    rows = rows[~layer]
    # 2 stages, gpipe and 1f1b, 2, 4 and 8 micro-batches of the batch of 8
    assert len(rows) == 6 and set(rows["family"]) == {"pp"}
    assert list(rows["rank"]) == list(range(1, 7))
    assert rows["step_ms"].astype(float).is_monotonic_increasing
    for _, r in rows.iterrows():
        assert r["error"] == "" and r["time_error"] == "" and r["cannot_run"] == ""
        assert float(r["peak_mem_gib"]) > 0 and float(r["peak_stage"]) in (0, 1)
        theory = 100 / (int(r["pp_microbatches"]) + 1)
        assert float(r["bubble_theory_pct"]) == pytest.approx(theory)
        assert 0 < float(r["bubble_pct"]) < 100 and float(r["p2p_bytes_per_step"]) > 0
    gpipe = rows[(rows["pp_schedule"] == "gpipe") & (rows["pp_microbatches"] == 8)]
    one = rows[(rows["pp_schedule"] == "1f1b") & (rows["pp_microbatches"] == 8)]
    # GPipe holds all 8 micro-batches' activations on a stage, 1F1B at most 2
    assert float(gpipe["peak_mem_gib"].iloc[0]) > float(one["peak_mem_gib"].iloc[0])


def _shard_pair(model, world, degree, m=4):
    """A pipeline row with replicas and its twin whose replicas FSDP2 shards."""
    knobs = {"pp_degree": degree, "pp_schedule": "1f1b", "pp_microbatches": m}
    knobs |= {"activation_checkpointing": "off", "precision": "fp32", "grad_accum": 1}
    dp = Config("pp", f"pp{degree} 1f1b x dp", model, "pp", FAMILIES["pp"].impl, knobs, m, world)
    fsdp = Config(
        "pp",
        f"pp{degree} 1f1b x fsdp",
        model,
        "pp",
        FAMILIES["pp"].impl,
        {**knobs, "dp_shard": True},
        m,
        world,
    )
    return dp, fsdp


@pytest.mark.unit
def test_pipelines_with_replicas_shard_them_by_fsdp2_beside_ddp_and_their_commands_say_so():
    configs = _space(DEEP, 8, 64, {"precision": ("fp32",), "activation_checkpointing": ("off",)})
    labels = {c.label for c in configs}
    for d, schedule in ((2, "gpipe"), (4, "1f1b")):
        assert {f"pp{d} {schedule} x dp", f"pp{d} {schedule} x fsdp"} <= labels
    assert "pp8 1f1b" in labels and not any(label.startswith("pp8 1f1b x") for label in labels)
    sharded = [c for c in configs if c.label.endswith("x fsdp")]
    assert sharded and all(c.knobs["dp_shard"] is True for c in sharded)
    assert not any(c.knobs.get("dp_shard") for c in configs if not c.label.endswith("x fsdp"))
    for c in sharded:
        args = shlex.split(c.command())
        (point,) = resolve(parse_config(args[args.index("bench/run.py") + 1 :]), 8).points
        assert point.knobs["dp_shard"] is True and point.knobs["pp_degree"] == c.knobs["pp_degree"]
        assert point.dp_size == 8 // c.knobs["pp_degree"]


@pytest.mark.unit
def test_fsdp2_over_a_stages_replicas_gathers_and_reduce_scatters_its_bytes_each_micro_batch():
    dp, fsdp = _shard_pair(DEEP, 8, 2, m=4)
    stage = 1e6
    (reduce,) = stage_replicas.collectives(dp.knobs, 8, stage)
    assert (reduce.name, reduce.nbytes, reduce.ranks, reduce.per_step) == (
        "all_reduce",
        stage,
        4,
        1,
    )
    got = {(k.name, k.phase): k for k in stage_replicas.collectives(fsdp.knobs, 8, stage)}
    assert set(got) == {
        ("all_gather", "forward"),
        ("all_gather", "backward"),
        ("reduce_scatter", "backward"),
    }
    assert all((k.nbytes, k.ranks, k.per_step) == (stage, 4, 4) for k in got.values())
    # priced on the world's link: in each micro-batch's actions, none after the schedule
    topo = Topology.of_links("nvlink4,ib_ndr", 8)
    link = topo.of_world(8)
    ms = pipeline_time.replica_ms(fsdp, stage, topo)
    assert ms["forward"] == pytest.approx(1e3 * link.time("all_gather", stage, 4))
    gather, scatter = (1e3 * link.time(k, stage, 4) for k in ("all_gather", "reduce_scatter"))
    assert ms["backward"] == pytest.approx(gather + scatter) and ms["after"] == 0
    assert pipeline_time.replica_ms(dp, stage, topo)["after"] == pytest.approx(
        1e3 * link.time("all_reduce", stage, 4)
    )
    # no replicas, nothing to shard
    assert not stage_replicas.collectives({**fsdp.knobs, "pp_degree": 8}, 8, stage)


@pytest.mark.unit
@pytest.mark.timeout(180)
def test_a_sharded_stages_state_is_the_replicated_ones_over_its_replicas():
    """pp2 at 8 ranks (4 replicas): the x fsdp row's builds are the x dp row's with the stages
    sharded by FSDP2; its parameters, gradients and AdamW state in the optimiser's step are the
    x dp row's over 4, and its peak is lower."""
    dp, fsdp = _shard_pair(DEEP, 8, 2)
    both = pipeline_memory.plan_stages([dp, fsdp], False)
    alone = pipeline_memory.plan_stages([dp], False).items
    builds = [item for item in both.items if isinstance(item[0], pipeline_memory.StageJob)]
    assert len(builds) == 2 * len([i for i in alone if isinstance(i[0], pipeline_memory.StageJob)])
    assert {item[0].sharded for item in builds} == {False, True}
    point = next(item[0] for item in builds if item[0].sharded).point()
    assert point.knobs["dp_shard"] is True and point.dp_size == 2
    done = [pipeline_memory.run_item(item, 8, False) for item in both.items]
    one, sharded = both.assemble(done)
    assert not one.error and not sharded.error, (one.error, sharded.error)
    assert sharded.peak_mib < one.peak_mib
    (_, dp_opt), (_, fsdp_opt) = (t.stages[-1] for t in (one, sharded))  # the optimiser's
    for part in ("params", "grads", "optim"):
        assert dp_opt[part] > 0 and fsdp_opt[part] == pytest.approx(dp_opt[part] / 4, rel=0.01)
    assert "FSDP2" in sharded.how and one.pipeline.peaks.keys() == sharded.pipeline.peaks.keys()


def _costs_target(fsdp_ms: dict) -> tuple[pipeline_memory.PipelineCosts, Target]:
    """A pp2 row's stage costs (no ops: only what the replicas add) and a target whose rate
    is given, with FSDP's calibrated own work per step ``fsdp_ms`` (empty: none calibrated)."""
    costs = pipeline_memory.PipelineCosts(
        ops=(OpMix(), OpMix()), sends=(1e3,), grad_bytes=(1e6, 2e6), shared_bytes=0.0, peaks={}
    )
    target = Target(
        device=Device("test", 16.0, 100.0, "", "a device for the test"),
        topology=Topology.of_links("nvlink4,ib_ndr", 8),
        peak_tflops=lambda p: 1.0,
        peak_source=lambda p: "test",
        allowance_gib=0.0,
        global_batch=64,
        rates={"fp32": Rate(0.05, 0.0, "test rate", fsdp_ms=fsdp_ms)},
    )
    return costs, target


def _simulated_ms(c, costs, target, own=(0.0, 0.0)) -> float:
    """``c``'s step as the schedule runs its stages' actions, each longer by ``own`` (a
    stage's FSDP2 own work per micro-batch), then what follows the schedule."""
    m, topo = c.knobs["pp_microbatches"], target.topology
    stages = [
        pipeline_time.price_stage(o, g, 0.0, c, target)
        for o, g in zip(costs.ops, costs.grad_bytes, strict=True)
    ]
    rep = [pipeline_time.replica_ms(c, g, topo) for g in costs.grad_bytes]
    each = tuple(
        StageCost(s.forward_ms + r["forward"] + w / 3, s.backward_ms + r["backward"] + 2 * w / 3)
        for s, r, w in zip(stages, rep, own, strict=True)
    )
    sends = pipeline_time.sends_ms(c, costs, topo)
    span = simulate_pipeline(StagedPipeline(c.knobs["pp_schedule"], m, each, sends)).makespan_ms
    return (
        span + pipeline_time.after_schedule_ms(c, costs, topo) + max(s.optimiser_ms for s in stages)
    )


@pytest.mark.unit
def test_fsdp2s_own_work_lengthens_a_sharded_stages_actions_and_leaves_replicated_rows_alone():
    """pp2 of DEEP's 8 blocks at 8 ranks: each stage 4 blocks, 5 FSDP2 units with its root.
    Calibrated (9 ms a step over the fsdp2 family's 9 units: 1 ms a unit), each micro-batch's
    actions on a sharded stage are 5 ms longer; not calibrated, its copies at the memory's
    bandwidth. The x dp row is what the schedule gives without any, calibrated or not."""
    dp, fsdp = _shard_pair(DEEP, 8, 2, m=4)
    plain, _ = _costs_target({})
    for calibrated in ({}, {"native": {"FULL_SHARD": 9.0, "NO_SHARD": 99.0}}):
        costs, target = _costs_target(calibrated)
        got = pipeline_time.predict_pipeline(dp, costs, target)
        assert got.step_ms == pytest.approx(_simulated_ms(dp, costs, target))
        assert "fsdp_own_work_source" not in got.columns
    costs, target = _costs_target({"native": {"FULL_SHARD": 9.0, "NO_SHARD": 99.0}})
    own = pipeline_time.own_work(fsdp, costs.grad_bytes, target)
    assert own.forward_ms == pytest.approx((5 / 3, 5 / 3))
    assert own.backward_ms == pytest.approx((10 / 3, 10 / 3))
    got = pipeline_time.predict_pipeline(fsdp, costs, target)
    bare = pipeline_time.predict_pipeline(dp, costs, target)
    assert got.compute_ms - bare.compute_ms == pytest.approx(4 * 5 * 1.0)  # m x units x 1 ms
    assert got.step_ms == pytest.approx(_simulated_ms(fsdp, costs, target, own=(5.0, 5.0)))
    assert got.step_ms > _simulated_ms(fsdp, costs, target) + 4 * 5.0
    assert got.columns["fsdp_own_work_source"].startswith("calibrated")
    # not calibrated: per unit, the gathers' shard in and whole unit out (forward, and again in
    # backward) and the gradients into the reduce-scatter's buffer and its shard out, each
    # read and written at 100 GB/s; 4 replicas
    own = pipeline_time.own_work(fsdp, plain.grad_bytes, _costs_target({})[1])
    bw = 100e9 / 1e3  # bytes a ms
    for s, stage in enumerate(plain.grad_bytes):
        assert own.forward_ms[s] == pytest.approx(2 * stage * (1 / 4 + 1) / bw)
        assert own.backward_ms[s] == pytest.approx(2 * 2 * stage * (1 / 4 + 1) / bw)
    got = pipeline_time.predict_pipeline(fsdp, plain, _costs_target({})[1])
    assert got.columns["fsdp_own_work_source"].startswith("op model")


@pytest.mark.unit
def test_a_plan_of_sharded_pipelines_calibrates_fsdp2s_own_work():
    _, fsdp = _shard_pair(DEEP, 8, 2)
    dp, _ = _shard_pair(DEEP, 8, 2)
    request = SimpleNamespace(
        model=DEEP, ranks_here=2, global_batch=64, world_size=8, launch_seconds=None
    )
    assert calibration.launch_plan(request, [fsdp]).fsdp == (FAMILIES["fsdp2"].impl,)
    assert calibration.launch_plan(request, [dp]).fsdp == ()
