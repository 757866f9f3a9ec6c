"""Every point checked against the plain model (bench/runner/train/plain_check.py): the suite's
strategies on the built-in and example models pass with ``checked == "ok ..."``; a wrong
tensor-parallel plan, a wrong FSDP unit list and a rank-dependent batch are error rows that
name the check's figures; the check costs one plain step and no parallel one.

Each test is one call into the session's rank pool: the worker runs every point of its case
through the harness and returns the rows."""

import dataclasses
import importlib.util
import math
import os
from pathlib import Path

import pytest
import torch.distributed as dist

from bench.runner.measure.peak_memory import MEMORY_STEPS, WARM_STEPS
from bench.runner.measure.timing import Budget
from bench.runner.train import plain_check, plain_compare
from bench.runner.train.candidate import Visit
from bench.runner.train.lifecycle import run_point
from parallel_kernels.strategies import STRATEGIES
from tests.test_harness import FAST, checked_only, make_point, pool_env, run_points

MODELS = "tests/data/models/plain_check_models.py"
CUSTOM = "examples/custom_model.py:workload"
COUNTED = "tests.data.models.plain_check_models:counted"  # by module: one FORWARDS per rank
HAS_ACCELERATE = importlib.util.find_spec("accelerate") is not None


def case(i: int, model: str, strategy: str, impl: str, *, world_size: int = 2, **knobs):
    """A point of its own id (``case=i``) with the tests' steps and a small batch."""
    return make_point(
        "case", model, i, impl, strategy, knobs=knobs, batch_size=8, world_size=world_size
    )


RIGHT = [
    ("mlp", "ddp", "native", {}),
    ("mlp", "ddp", "reference", {}),
    ("mlp", "ddp", "native", {"comm_hook": "powersgd"}),
    ("mlp", "ddp", "reference", {"comm_hook": "fp16"}),
    ("mlp", "ddp", "native", {"precision": "bf16"}),
    (CUSTOM, "ddp", "native", {}),
    (CUSTOM, "ddp", "reference", {}),
    (CUSTOM, "fsdp", "native", {}),
    (CUSTOM, "fsdp", "native_fsdp1", {}),
    (CUSTOM, "fsdp", "reference", {}),
    (CUSTOM, "fsdp", "native", {"precision": "bf16"}),
    (CUSTOM, "tp", "native", {"tp_degree": 2}),
    (CUSTOM, "tp", "reference", {"tp_degree": 2}),
    (CUSTOM, "tp", "native", {"dp_shard": True}),  # the (dp, tp) mesh's sharded dp dimension
    (CUSTOM, "ddp", "native", {"grad_accum": 2}),
    (CUSTOM, "fsdp", "native", {"activation_checkpointing": "on"}),
    ("transformer", "fsdp", "native", {}),
    ("transformer", "tp", "reference", {"tp_degree": 2}),
    (f"{MODELS}:swiglu", "tp", "native", {"tp_degree": 2}),  # the gated MLP written right
    *([(CUSTOM, "accelerate", "accelerate", {})] if HAS_ACCELERATE else []),
]


def _torchrun_env() -> None:
    """What torchrun would have set: Accelerate reads it to know it is distributed (without
    it, each rank trains alone, which the replica check catches)."""
    os.environ.update(
        RANK=str(dist.get_rank()),
        LOCAL_RANK=str(dist.get_rank()),
        WORLD_SIZE=str(dist.get_world_size()),
        LOCAL_WORLD_SIZE=str(dist.get_world_size()),
    )


def right_worker(root: str) -> list[tuple]:
    _torchrun_env()
    points = [case(i, m, s, impl, **k) for i, (m, s, impl, k) in enumerate(RIGHT)]
    with checked_only():
        rows = run_points(points, root)
    return [(r["point"], r["status"], r["error"], r.get("checked")) for r in rows]


@pytest.mark.ranks
@pytest.mark.timeout(280)
def test_the_suites_strategies_pass_the_check(pool, tmp_path):
    rows = pool(2).run(right_worker, str(tmp_path), timeout=270)[0]
    assert len(rows) == len(RIGHT)
    for (point, status, error, checked), (_, _, _, knobs) in zip(rows, RIGHT, strict=True):
        assert status == "ok", (point, error)
        assert checked.startswith("ok ("), (point, checked)
        print(point, checked)
        if knobs.get("precision") == "bf16":
            assert "reduced-precision tolerance" in checked, checked
        elif knobs.get("comm_hook") == "fp16":
            assert "compressed-gradient tolerance" in checked, checked
        elif knobs.get("comm_hook") == "powersgd":
            assert "PowerSGD's first step being uncompressed" in checked, checked
        else:
            assert checked.startswith("ok (fp32 tolerance"), checked


WRONG = [
    # the wrong TP plan: `up` column-wise although forward splits its output in two
    (f"{MODELS}:gated_mlp", "tp", "native", {"tp_degree": 2}),
    (f"{MODELS}:gated_mlp", "tp", "reference", {"tp_degree": 2}),
    # the wrong FSDP units: the tied embedding a unit apart from the head (the root's)
    (f"{MODELS}:tied_split", "fsdp", "reference", {}),
    (f"{MODELS}:tied_split", "fsdp", "native", {}),  # FSDP2 refuses it: not silent
    (f"{MODELS}:tied", "fsdp", "reference", {}),  # the right units
    # each rank its own data set
    (f"{MODELS}:rank_batch", "ddp", "native", {}),
    (f"{MODELS}:rank_batch", "fsdp", "native", {}),
    (f"{MODELS}:swiglu", "ddp", "native", {}),  # and the sweep goes on
]


def wrong_worker(root: str) -> list[dict]:
    points = [case(i, m, s, impl, **k) for i, (m, s, impl, k) in enumerate(WRONG)]
    with checked_only():
        return run_points(points, root)


@pytest.mark.ranks
@pytest.mark.timeout(200)
def test_a_wrong_plan_unit_list_or_batch_is_the_points_error_row(pool, tmp_path):
    per_rank = pool(2).run(wrong_worker, str(tmp_path), timeout=190)
    rows = per_rank[0]
    plan_native, plan_reference, split, split_fsdp2, tied, batch_ddp, batch_fsdp, fine = rows
    for r in (plan_native, plan_reference):
        assert r["status"] == "error", r
        assert r["error"].startswith(
            "rank 0: PlainModelMismatch: checked against the plain model (fp32 tolerance): loss "
        ), r["error"]
        assert r["error"].endswith(
            "; tensor-parallel plan entries involved: blocks.*.up colwise, blocks.*.down rowwise"
        ), r["error"]
        assert r["checked"] == "mismatch: see error"
        assert not r.get("diagnosis"), r["diagnosis"]  # an agreed verdict: no hang to diagnose
    print(plan_native["error"])
    # the reference FSDP trains the split tie silently: the first step's loss is right, the
    # parameters are not
    assert split["status"] == "error" and "PlainModelMismatch" in split["error"], split
    assert "first parameter that differs: embed.weight, largest difference" in split["error"]
    assert "(2 parameters differ)" in split["error"]  # the embedding and the head apart
    assert "shared with a parameter already managed by another FSDP group" in split_fsdp2["error"]
    assert not split_fsdp2["error"].count("PlainModelMismatch")
    assert tied["status"] == "ok" and tied["checked"].startswith("ok (fp32"), tied
    for r in (batch_ddp, batch_fsdp):
        assert r["status"] == "error" and "PlainModelMismatch" in r["error"], r
        assert "first parameter that differs" in r["error"]
    assert fine["status"] == "ok" and fine["checked"].startswith("ok ("), fine
    # every rank agrees on the outcome and its reason
    assert [(r["status"], r["error"]) for r in per_rank[1]] == [
        (r["status"], r["error"]) for r in rows
    ]


def mesh_worker(root: str) -> list[dict]:
    four = {"world_size": 4, "tp_degree": 2}
    points = [
        case(0, CUSTOM, "tp", "native", dp_shard=True, **four),
        case(1, f"{MODELS}:gated_mlp", "tp", "reference", dp_shard=True, **four),
    ]
    for p in points:
        assert (p.dp_size, p.tp_size) == (2, 2)
    with checked_only():
        return run_points(points, root)


@pytest.mark.ranks
@pytest.mark.timeout(400)
def test_a_two_dimensional_mesh_is_checked(pool, tmp_path):
    sharded, wrong = pool(4).run(mesh_worker, str(tmp_path), timeout=390)[0]
    assert sharded["status"] == "ok" and sharded["checked"].startswith("ok (fp32"), sharded
    assert "PlainModelMismatch" in wrong["error"] and "blocks.*.up colwise" in wrong["error"]


def _forwards(point, root: str) -> tuple[list[int], dict]:
    from tests.data.models import plain_check_models as m

    m.FORWARDS.clear()
    row = run_point(dataclasses.replace(point), pool_env(), FAST, Path(root)).as_dict()
    return list(m.FORWARDS.values()), row


def cost_worker(root: str) -> dict:
    """Forward calls per model instance with the check and without it; the rows of a plain
    model that does not fit and of a later visit."""
    point = case(0, COUNTED, "ddp", "native", grad_accum=2)
    out = {}
    skip = plain_check.skip_reason  # run() looks it up at each call
    plain_check.skip_reason = lambda *a: "not checked: switched off by the test"
    try:  # first: the FLOP counter's one real forward (then cached) falls in this run
        out["unchecked"], _ = _forwards(point, f"{root}/b")
    finally:
        plain_check.skip_reason = skip
    out["checked"], out["checked_row"] = _forwards(point, f"{root}/a")
    available = plain_check._available_bytes
    plain_check._available_bytes = lambda device: 1024.0
    try:
        out["no_fit"] = run_point(point, pool_env(), FAST, Path(root, "c")).as_dict()
    finally:
        plain_check._available_bytes = available
    later = Visit(
        budget=Budget(min_steps=2, max_steps=2, max_s=math.inf, target_pct=0.0),
        round=2,
        profile=False,
    )
    out["later"] = run_point(point, pool_env(), FAST, Path(root, "d"), visit=later).as_dict()
    return out


@pytest.mark.ranks
@pytest.mark.timeout(150)
def test_the_check_costs_one_plain_step_and_says_when_it_did_not_run(pool, tmp_path):
    got = pool(2).run(cost_worker, str(tmp_path), timeout=140)[0]
    assert got["checked_row"]["status"] == "ok", got["checked_row"]["error"]
    # the parallel model runs the same steps either way; the plain one, one step of the
    # global batch: 2 replicas x 2 micro-batches; the memory's build of its own, its warm
    # steps and the measured ones, 2 micro-batches each
    parallel, plain, memory = got["checked"]
    assert [parallel, memory] == got["unchecked"][-2:]
    assert parallel > 2 * 2
    assert plain == 2 * 2
    assert memory == (WARM_STEPS + MEMORY_STEPS) * 2
    no_fit = got["no_fit"]
    assert no_fit["status"] == "ok"
    assert no_fit["checked"].startswith(
        "not checked: the plain model does not fit one device"
        " (~0.0 GiB of parameters, gradients and AdamW state"
    )
    assert got["later"]["status"] == "ok" and "checked" not in got["later"]  # the runner carries


@pytest.mark.unit
def test_tolerances_and_messages():
    """Which tolerance a point gets, and a mismatch's message, without ranks."""
    from parallel_kernels.models import build_model

    assert plain_compare.tolerance_for(case(0, "mlp", "ddp", "native")) is plain_compare.FP32
    bf16 = case(0, CUSTOM, "fsdp", "native", precision="bf16")
    assert plain_compare.tolerance_for(bf16) is plain_compare.REDUCED
    fp16_hook = case(0, "mlp", "ddp", "reference", comm_hook="fp16")
    assert plain_compare.tolerance_for(fp16_hook) is plain_compare.COMPRESSED
    no_warmup = dataclasses.replace(case(0, "mlp", "ddp", "native"), warmup_steps=0)
    assert plain_compare.tolerance_for(no_warmup) == "not checked: no warm-up step to check"
    model = build_model(f"{MODELS}:gated_mlp")
    diffs = [plain_compare.ParamDiff("blocks.1.down.weight", 2048, 700, 2e-3, 2.0)]
    text = plain_compare.mismatch((2.5, 2.0), diffs, plain_compare.FP32, model)
    assert text == (
        "checked against the plain model (fp32 tolerance): loss 2.5 vs 2 unsharded "
        "(rel 2.5e-01, tolerance 1e-04); first parameter that differs: "
        "blocks.1.down.weight, largest difference 2.0e-03 (2.0 x lr), 700 of 2,048 "
        "elements beyond tolerance; tensor-parallel plan entries involved: "
        "blocks.*.up colwise, blocks.*.down rowwise"
    )
    within = [plain_compare.ParamDiff("w", 2048, 0, 1e-5, 0.01)]
    assert plain_compare.mismatch((2.0, 2.0), within, plain_compare.FP32) is None
    # the built-in transformer's plan names modules: read as patterns, each entry once
    entries = plain_compare.plan_entries(build_model("transformer"), ["blocks.2.fc2.weight"])
    assert entries == ["blocks.*.fc1 colwise", "blocks.*.fc2 rowwise"]
    # the implementations' full-state functions are code, not facts a run folder records
    facts = STRATEGIES["tp"].impl("reference").facts()
    assert "full_state" not in facts and "apply" not in facts
