"""Gradient accumulation through the harness: one synchronisation per optimiser step, so the
bytes per sample fall with the number of micro-batches (the equality of accumulation with the
large-batch step is proven in test_ddp.py for DDP, test_fsdp.py for FSDP1 and FSDP2)."""

import pytest

from bench.runner.plan.points import build_points
from tests.test_harness import FAST, run_points


@pytest.mark.unit
def test_grad_accum_points():
    points = build_points("grad_accum", world_size=2, models="mlp", impls="native")
    assert [(p.value, p.knobs["grad_accum"], p.strategy) for p in points] == [
        (k, k, "ddp") for k in (1, 2, 4, 8)
    ]
    # every other knob at its default
    assert all(p.knobs["bucket_cap_mb"] == p.defaults["bucket_cap_mb"] for p in points)
    fsdp = build_points("grad_accum", world_size=2, values="2", strategy="fsdp", impls="native")
    assert fsdp[0].strategy == "fsdp" and fsdp[0].knobs["sharding_strategy"] == "FULL_SHARD"


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_accumulation_syncs_once_per_optimiser_step(pool, tmp_path):
    points = build_points(
        "grad_accum", world_size=2, values="1,4", models="mlp", impls="native,reference"
    )
    points += build_points(
        "grad_accum",
        world_size=2,
        values="4",
        models="mlp",
        strategy="fsdp",
        impls="native,native_fsdp1",
    )
    points += build_points(
        "grad_accum", world_size=2, values="2", models="mlp", strategy="tp", impls="reference"
    )
    rows = pool(2).run(run_points, points, str(tmp_path), FAST)[0]
    by = {(r["strategy"], r["value"], r["impl"]): r for r in rows}
    for impl in ("native", "reference"):
        one, four = by[("ddp", 1, impl)], by[("ddp", 4, impl)]
        assert one["status"] == four["status"] == "ok", (one["error"], four["error"])
        # every gradient byte once per optimiser step, whatever the micro-batches
        assert one["comm_bytes_per_step"] == four["comm_bytes_per_step"] == one["grad_bytes"]
        assert four["comm_bytes_per_sample"] == pytest.approx(one["comm_bytes_per_sample"] / 4)
        assert four["grad_accum"] == 4
    ddp = by[("ddp", 4, "native")]
    assert ddp["loss"] != by[("ddp", 1, "native")]["loss"]  # accumulation changed the training
    for impl in ("native", "native_fsdp1"):  # FSDP2's set_requires_gradient_sync, FSDP1's no_sync
        fsdp = by[("fsdp", 4, impl)]
        assert fsdp["status"] == "ok", fsdp["error"]
        # the harness's step trains FSDP as it trains DDP: the same start, data, micro-batches
        # and AdamW steps give the same loss (measured: equal to the last bit)
        assert fsdp["loss"] == pytest.approx(ddp["loss"], rel=1e-5), (impl, fsdp["loss"])
    tp = by[("tp", 2, "reference")]
    assert tp["status"] == "error" and "no way to skip gradient synchronisation" in tp["error"]
