"""World-size sweeps inside one launch: points on the first k ranks while the others wait."""

import pandas as pd
import pytest

from bench.analysis.scaling import scaling_efficiency
from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from tests.test_harness import FAST, run_points


@pytest.mark.unit
def test_points_cover_world_sizes_and_both_scalings():
    points = build_points(RunConfig(sweep="world_size", model="mlp", impl="native"), world_size=4)
    assert [(p.world_size, p.scaling, p.global_batch) for p in points] == [
        (1, "weak", None),
        (2, "weak", None),
        (4, "weak", None),
        (1, "strong", 256),
        (2, "strong", 256),
        (4, "strong", 256),
    ]
    assert points[0].id == "mlp-world_size=1-weak-ddp-native" and points[0].strategy == "ddp"
    tp = build_points(
        RunConfig(
            sweep="world_size",
            values="2,4",
            strategy="tp",
            option=("tp_degree=2",),
            scaling="strong",
            batch_size=8,
        ),
        world_size=4,
    )
    layouts = {(p.world_size, p.knobs["tp_degree"], p.global_batch) for p in tp}
    assert layouts == {(2, 2, 32), (4, 2, 32)}
    with pytest.raises(ValueError, match="world size 8 is larger than the 4 ranks launched"):
        build_points(RunConfig(sweep="world_size", values="1,8"), world_size=4)
    with pytest.raises(ValueError, match="unknown strategy 'zero'"):
        build_points(RunConfig(sweep="world_size", strategy="zero"), world_size=4)
    with pytest.raises(ValueError, match="--strategy is for the world_size sweep"):
        build_points(RunConfig(sweep="bucket_cap_mb", strategy="fsdp"), world_size=2)


@pytest.mark.unit
def test_scaling_efficiency_against_the_smallest_world_size():
    df = pd.DataFrame(
        {
            "model": "m",
            "impl": "native",
            "strategy": "ddp",
            "status": "ok",
            "scaling": ["weak"] * 3 + ["strong"] * 3,
            "world_size": [1, 2, 4] * 2,
            "samples_per_s": [100.0, 180.0, 300.0, 100.0, 200.0, 400.0],
        }
    )
    out = scaling_efficiency(df)
    assert out["efficiency_pct"].round(6).tolist() == [100.0, 90.0, 75.0, 100.0, 100.0, 100.0]
    assert out["ideal_speedup"].tolist() == [1.0, 2.0, 4.0] * 2


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_points_on_part_of_the_ranks(pool, tmp_path):
    """At 4 launched ranks, DDP at 1 and 2 ranks (weak and strong), FSDP and TP x DP meshes on
    2 ranks while ranks 2 and 3 wait, then a 4-rank point: each row is measured on its own
    ranks, with its own batch, and moves the bytes its world size implies."""
    points = build_points(
        RunConfig(
            sweep="world_size", values="1,2", model="mlp", impl="native,reference", batch_size=16
        ),
        world_size=4,
    )
    points += build_points(
        RunConfig(
            sweep="world_size",
            values="2",
            model="mlp",
            strategy="fsdp",
            scaling="weak",
            batch_size=16,
        ),
        world_size=4,
    )
    points += build_points(
        RunConfig(
            sweep="world_size",
            values="2,4",
            model="mlp",
            strategy="tp",
            option=("tp_degree=2",),
            impl="native,reference",
            scaling="weak",
            batch_size=16,
        ),
        world_size=4,
    )
    rows = pool(4).run(run_points, points, str(tmp_path), FAST, timeout=280)[0]
    for p, r in zip(points, rows, strict=True):
        assert r["status"] == "ok", (p.id, r["error"])
        assert r["world_size"] == p.world_size and r["scaling"] == p.scaling
        if p.strategy == "ddp":
            # one replica per rank: strong scaling splits the global batch of 32 over them
            assert r["batch_per_replica"] == (16 if p.scaling == "weak" else 32 // p.world_size)
            # every gradient all-reduced, even on one rank (DDP does not skip it)
            assert r["comm_bytes_per_step"] == r["grad_bytes"]
        elif (p.strategy, p.impl) == ("fsdp", "reference"):
            # it skips re-gathering the first layer in backward (test_fsdp.py says why)
            zero2 = r["comm_bytes_expected"] - r["grad_bytes"] / 2
            assert zero2 < r["comm_bytes_per_step"] < r["comm_bytes_expected"]
        else:
            assert r["comm_bytes_per_step"] == pytest.approx(r["comm_bytes_expected"], rel=1e-6)
        if p.strategy == "tp":  # two ranks of one TP group read the same batch: one replica
            # total samples over total time, not over the median step
            steps_ms = r["samples_ms"]
            assert r["samples_per_s"] == pytest.approx(
                16 * (p.world_size // 2) * len(steps_ms) / (sum(steps_ms) / 1e3)
            )
