"""The precision sweep: bf16 next to fp32, under autocast (DDP) and FSDP's policy."""

import pytest

from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from tests.test_harness import FAST, run_points

pytestmark = pytest.mark.ranks

# After FAST's 10 AdamW steps (2 warm-up, 4 timed, 4 under the profiler) from the same start
# and data, the bf16 loss stays within these fractions of the fp32 loss. Measured on the seed
# MLP (torch 2.13 CPU): under autocast (DDP, Accelerate) 0.045 % (2.07675 against 2.07581; the
# loss itself is computed in fp32); under FSDP's bf16 policy 0.64 % (2.0625: the loss is a bf16
# number, whose neighbours near 2 are 0.78 % apart). The same point untrained (lr 0) is 11 %
# away (2.3091), and one trained with a 10 % smaller learning rate about 1 %.
AUTOCAST_TOLERANCE = 0.002
BF16_POLICY_TOLERANCE = 0.02
LOSS_TOLERANCE = {"ddp": AUTOCAST_TOLERANCE, "fsdp": BF16_POLICY_TOLERANCE}


@pytest.mark.timeout(300)
def test_bf16_trains_like_fp32_and_fsdp_halves_its_bytes(pool, tmp_path):
    points = build_points(
        RunConfig(sweep="precision", model="mlp", impl="native,reference"), world_size=2
    )
    points += build_points(
        RunConfig(sweep="precision", model="mlp", strategy="fsdp", impl="native,reference"),
        world_size=2,
    )
    rows = pool(2).run(run_points, points, str(tmp_path), FAST)[0]
    by = {(r["strategy"], r["value"], r["impl"]): r for r in rows}
    for (strategy, value, impl), r in by.items():
        assert r["status"] == "ok", (strategy, value, impl, r["error"])
        fp32 = by[(strategy, "fp32", impl)]
        print(
            f"{strategy} {impl} {value}: loss {r['loss']:.4f} (fp32 {fp32['loss']:.4f}), "
            f"{r['comm_bytes_per_step']:.0f} B, {r['step_ms_median']:.1f} ms"
        )
        assert abs(r["loss"] - fp32["loss"]) <= LOSS_TOLERANCE[strategy] * fp32["loss"], (
            strategy,
            value,
            impl,
            r["loss"],
            fp32["loss"],
        )
        if (strategy, impl) == ("fsdp", "reference"):  # it skips the first layer's re-gather
            assert r["comm_bytes_per_step"] < r["comm_bytes_expected"]
        else:
            assert r["comm_bytes_per_step"] == pytest.approx(r["comm_bytes_expected"], rel=1e-3)
    for impl in ("native", "reference"):
        # bf16 really ran: the loss moved, if only a little
        assert by[("ddp", "bf16", impl)]["loss"] != by[("ddp", "fp32", impl)]["loss"]
        # autocast computes in bf16, but DDP's gradients stay fp32: the same bytes
        assert (
            by[("ddp", "bf16", impl)]["comm_bytes_per_step"]
            == by[("ddp", "fp32", impl)]["comm_bytes_per_step"]
        )
        # FSDP's policy gathers and reduces in bf16: half the bytes
        assert by[("fsdp", "bf16", impl)]["comm_bytes_per_step"] == pytest.approx(
            by[("fsdp", "fp32", impl)]["comm_bytes_per_step"] / 2, rel=1e-3
        )
