"""Gradient accumulation through the harness: one synchronisation per optimiser step, so the
bytes per sample fall with the number of micro-batches (the equality of accumulation with the
large-batch step is proven in test_ddp.py for DDP, test_fsdp.py for FSDP1 and FSDP2)."""

import pytest

from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from tests.test_harness import FAST, run_points


@pytest.mark.unit
def test_grad_accum_points():
    points = build_points(RunConfig(sweep="grad_accum", model="mlp", impl="native"), world_size=2)
    assert [(p.value, p.knobs["grad_accum"], p.strategy) for p in points] == [
        (k, k, "ddp") for k in (1, 2, 4, 8)
    ]
    # every other knob at its default
    assert all(p.knobs["bucket_cap_mb"] == p.defaults["bucket_cap_mb"] for p in points)
    fsdp = build_points(
        RunConfig(sweep="grad_accum", values="2", strategy="fsdp", impl="native"), world_size=2
    )
    assert fsdp[0].strategy == "fsdp" and fsdp[0].knobs["sharding_strategy"] == "FULL_SHARD"


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_accumulation_syncs_once_per_optimiser_step(pool, tmp_path):
    points = build_points(
        RunConfig(sweep="grad_accum", values="1,4", model="mlp", impl="native,reference"),
        world_size=2,
    )
    points += build_points(
        RunConfig(
            sweep="grad_accum", values="4", model="mlp", strategy="fsdp", impl="native,native_fsdp1"
        ),
        world_size=2,
    )
    points += build_points(
        RunConfig(sweep="grad_accum", values="2", model="mlp", strategy="tp", impl="reference"),
        world_size=2,
    )
    # TP's native implementation over each data-parallel wrapper it can have at 2 ranks: DDP
    # over both (TP of one), FSDP2 over both (dp_shard), and none (TP over both)
    meshes = {
        "tp1 ddp": ("tp_degree=1",),
        "tp1 fsdp2": ("tp_degree=1", "dp_shard=True"),
        "tp2": ("tp_degree=2",),
    }
    tp_points = {
        (name, k): build_points(
            RunConfig(
                sweep="grad_accum",
                values=str(k),
                model="mlp",
                strategy="tp",
                impl="native",
                option=options,
            ),
            world_size=2,
        )[0]
        for name, options in meshes.items()
        for k in (1, 4)
    }
    rows = pool(2).run(run_points, points + list(tp_points.values()), str(tmp_path), FAST)[0]
    tp_rows = dict(zip(tp_points, rows[len(points) :], strict=True))
    rows = rows[: len(points)]
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
    for name in meshes:
        one, four = tp_rows[(name, 1)], tp_rows[(name, 4)]
        assert one["status"] == four["status"] == "ok", (name, one["error"], four["error"])
        # its first step, accumulated, against one step of the plain model on the global batch
        assert str(four["checked"]).startswith("ok"), (name, four["checked"])
        if name != "tp2":  # DDP's data, micro-batches and AdamW steps: DDP's training
            assert four["loss"] == pytest.approx(ddp["loss"], rel=1e-5), (name, four["loss"])
            assert one["loss"] == pytest.approx(by[("ddp", 1, "native")]["loss"], rel=1e-5)
        # the data-parallel gradients synchronised once per optimiser step; TP's own calls
        # (activations) and FSDP2's gathers once per micro-batch
        if name == "tp2":
            assert four["comm_calls_per_step"] == 4 * one["comm_calls_per_step"], name
        elif name == "tp1 ddp":
            assert four["comm_bytes_per_step"] == one["comm_bytes_per_step"] == one["grad_bytes"]
        else:  # three of four micro-batches' reduce-scatters skipped, every gather made
            gathers_and_one_reduce = 4 * one["comm_bytes_per_step"] - 3 * one["grad_bytes"]
            assert four["comm_bytes_per_step"] < 4 * one["comm_bytes_per_step"], name
            assert four["comm_bytes_per_step"] == pytest.approx(gathers_and_one_reduce, rel=0.05)
