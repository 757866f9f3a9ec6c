"""The cost model's parts on inputs whose answer is known: fits of synthetic timings, hand-
computed timelines, PyTorch's own bucket assignment, a synthetic trace, link presets."""

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
from torch import nn

from bench.model import schedule as sch
from bench.model.__main__ import main as model_main
from bench.model.comm import ALGORITHMS, FitError, fit_rows
from bench.model.compute import ComputeProfile, from_trace_dir
from bench.model.fitting import RESAMPLES, interval, nonneg_lstsq
from bench.model.links import PRESETS, LinkCosts, parse_link
from bench.model.predict import case_of, fsdp, tp
from bench.model.runs import read_collectives_runs
from bench.model.whatif import DEFAULT_DDP, predict_scales, recommend
from bench.report.model_section import _outliers
from parallel_kernels.ddp import plan_buckets
from parallel_kernels.fsdp_layout import zero_state_bytes
from tests.kineto_writer import write_trace
from tests.test_harness import make_point

pytestmark = pytest.mark.unit

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB


def synthetic(backend, alpha, beta, worlds, noise=0.0, seed=0, iters=0, jitter=0.1, colls=None):
    """The model's own timings, each size off by ``noise`` (relative, one draw per size); with
    ``iters``, that many timed iterations per size spread by ``jitter`` (relative), ``time_us``
    their median, as a run reports them."""
    rng = np.random.default_rng(seed)
    rows = []
    for coll, algo in ALGORITHMS[backend].items():
        if colls and coll not in colls:
            continue
        for n in worlds:
            for s in SIZES:
                t = algo.time(s, n, alpha, beta) * (1 + noise * rng.standard_normal())
                row = {
                    "collective": coll,
                    "impl": "native",
                    "world_size": n,
                    "size_bytes": s,
                    "time_us": t * 1e6,
                    "status": "ok",
                }
                if iters:
                    ms = t * 1e3 * (1 + jitter * rng.standard_normal(iters))
                    row.update(samples_ms=ms, time_us=float(np.median(ms)) * 1e3)
                rows.append(row)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("worlds", [[2], [4], [2, 4, 8]])
def test_fit_recovers_alpha_and_beta_from_the_models_own_timings(backend, worlds):
    alpha, beta = 35e-6, 1 / 4.2e9
    model = fit_rows(synthetic(backend, alpha, beta, worlds), backend=backend)
    assert model.world_sizes == tuple(worlds)
    for coll in ALGORITHMS[backend]:
        f = model.fit(coll)
        assert f.alpha == pytest.approx(alpha, rel=0.01), coll
        assert f.beta == pytest.approx(beta, rel=0.01), coll
        assert f.r2_log > 0.9999
        assert len(f.residuals) == len(SIZES) * len(worlds)
        assert f.max_abs_residual_pct < 1e-6


def test_fit_under_noise_reports_its_quality_per_size():
    model = fit_rows(synthetic("gloo", 50e-6, 1e-9, [2], noise=0.05), backend="gloo")
    f = model.fit("all_reduce")
    assert f.alpha == pytest.approx(50e-6, rel=0.1) and f.beta == pytest.approx(1e-9, rel=0.05)
    assert 0.99 < f.r2_log < 1.0
    res = f.residuals.set_index("size_bytes")["residual_pct"]
    assert list(res.index) == SIZES and res.abs().max() < 20 and res.abs().max() > 0
    table = model.table()
    assert set(table["collective"]) == set(ALGORITHMS["gloo"])


def test_each_measured_world_size_gets_its_own_fit():
    """Latency that grows faster than the algorithm's n (an oversubscribed CPU): the joint fit
    misses it, the fit at each world size does not."""
    at2 = synthetic("gloo", 100e-6, 1e-9, [2])
    at4 = synthetic("gloo", 400e-6, 1.2e-9, [4])
    model = fit_rows(pd.concat([at2, at4]), backend="gloo")
    assert model.fit("all_reduce", n=2).alpha == pytest.approx(100e-6, rel=0.01)
    assert model.fit("all_reduce", n=4).alpha == pytest.approx(400e-6, rel=0.01)
    joint = model.fit("all_reduce", n=8)  # unmeasured size: the fit over both
    assert joint is model.fits["native", "all_reduce"]
    assert model.time("all_reduce", 1 << 20, 4) == pytest.approx(
        ALGORITHMS["gloo"]["all_reduce"].time(1 << 20, 4, 400e-6, 1.2e-9), rel=0.01
    )
    assert set(model.table()["ranks"]) == {"2,4", "2", "4"}


def test_gamma_is_derived_from_all_reduce_against_all_gather():
    rows = synthetic("gloo", 20e-6, 1e-9, [2, 4])
    ar = rows["collective"] == "all_reduce"
    algo = ALGORITHMS["gloo"]["all_reduce"]
    gamma = 0.5e-9  # reduction cost per byte, added to the all-reduce's timings only
    rows.loc[ar, "time_us"] = [
        algo.time(s, n, 20e-6, 1e-9, gamma) * 1e6
        for s, n in zip(rows.loc[ar, "size_bytes"], rows.loc[ar, "world_size"], strict=True)
    ]
    assert fit_rows(rows, backend="gloo").gamma == pytest.approx(gamma, rel=0.01)


def test_nonnegative_least_squares_clamps_what_would_go_negative():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    X = np.column_stack([np.ones(4), x])
    y = 2.0 * x - 1.0  # unconstrained intercept -1
    c = nonneg_lstsq(X, y)
    assert c[0] == 0.0 and c[1] > 0
    assert np.allclose(nonneg_lstsq(X, 3 + 2 * x), [3, 2])


def test_a_fit_needs_two_sizes_and_ok_rows():
    one = synthetic("gloo", 1e-5, 1e-9, [2])
    with pytest.raises(FitError, match="two sizes"):
        fit_rows(one[one["size_bytes"] == SIZES[0]], backend="gloo")
    with pytest.raises(FitError, match="no ok rows"):
        fit_rows(one.assign(status="error"), backend="gloo")
    model = fit_rows(one[one["collective"] == "broadcast"], backend="gloo", source="R")
    with pytest.raises(FitError, match="has no native all_reduce"):
        model.fit("all_reduce")


def _all_reduce(times_s, sizes=SIZES, **extra) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "collective": "all_reduce",
            "impl": "native",
            "world_size": 2,
            "size_bytes": sizes,
            "time_us": np.asarray(times_s) * 1e6,
            "status": "ok",
            **extra,
        }
    )


def test_r2_is_reported_on_the_fits_own_scale_log_time():
    """Large sizes on the model, the four smallest twice or half their time: R^2 of absolute
    times reads 0.9999 (the 64 MiB point's variance is all of it), log time's says the fit
    misses by up to 80 %."""
    algo = ALGORITHMS["gloo"]["all_reduce"]
    t = np.array([algo.time(s, 2, 50e-6, 1e-9) for s in SIZES])
    t *= [2, 0.5, 2, 0.5, 1, 1, 1, 1, 1]
    f = fit_rows(_all_reduce(t), backend="gloo").fit("all_reduce")
    pred = f.residuals["predicted_us"].to_numpy() * 1e-6
    absolute = 1 - np.sum((t - pred) ** 2) / np.sum((t - t.mean()) ** 2)
    assert absolute > 0.9999  # what R^2 of absolute times said
    log_t, log_p = np.log(t), np.log(pred)
    expected = 1 - np.sum((log_t - log_p) ** 2) / np.sum((log_t - log_t.mean()) ** 2)
    assert f.r2_log == pytest.approx(expected, rel=1e-12)
    assert f.r2_log < 0.95
    assert fit_rows(_all_reduce(t), backend="gloo").table()["r2_log"].iloc[0] == f.r2_log


def test_outliers_are_named_with_their_residuals_in_the_table():
    algo = ALGORITHMS["gloo"]["all_reduce"]
    t = np.array([algo.time(s, 2, 50e-6, 1e-9) for s in SIZES])
    t[3] *= 5  # 64 KiB: a scheduling hiccup
    model = fit_rows(_all_reduce(t), backend="gloo")
    f = model.fit("all_reduce")
    res = f.residuals.set_index("size_bytes")
    assert list(res.index[res["outlier"]]) == [64 << 10]
    assert res.loc[64 << 10, "residual_pct"] == pytest.approx(-80, abs=0.1)
    assert f.max_abs_residual_pct < 1e-6  # the sizes fitted: the hiccup is not among them
    row = model.table().iloc[0]
    assert row["outliers"] == 1 and row["outlier_residuals"] == "64 KiB -80 %"
    assert "native all_reduce (2 ranks): 64 KiB -80 %" in _outliers(model.table())
    at2, at4 = synthetic("gloo", 50e-6, 1e-9, [2]), synthetic("gloo", 50e-6, 1e-9, [4])
    at4.loc[at4["size_bytes"] == 1 << 20, "time_us"] *= 4
    joint = fit_rows(pd.concat([at2, at4]), backend="gloo").fit("all_gather")
    assert joint.outlier_residuals == "1 MiB at 4 ranks -75 %"
    assert _outliers(fit_rows(at2, backend="gloo").table()).startswith("no size set aside")


def test_the_fit_takes_in_place_rows_where_the_collective_has_them():
    """Out-of-place all-reduce pays a copy into the output that DDP never pays (placement.py):
    the in-place rows are the cost; a collective with no ok in-place row is fit out of place."""
    rows = synthetic("gloo", 50e-6, 1e-9, [2])
    copying = rows.assign(inplace=False, time_us=rows["time_us"] * 3)
    both = pd.concat([copying, rows.assign(inplace=True)], ignore_index=True)
    for marked in (both, both.assign(inplace=both["inplace"].astype(str))):  # as read from CSV
        f = fit_rows(marked, backend="gloo").fit("all_reduce")
        assert f.alpha == pytest.approx(50e-6, rel=1e-6) and len(f.residuals) == len(SIZES)
    none_in_place = both.assign(status=np.where(both["inplace"], "unsupported", "ok"))
    f = fit_rows(none_in_place, backend="gloo").fit("all_reduce")
    assert f.alpha == pytest.approx(150e-6, rel=1e-6)


def test_bootstrap_intervals_cover_the_true_costs_and_are_seeded():
    alpha, beta = 50e-6, 1e-9
    covered = np.zeros(2, dtype=int)
    for seed in range(40):
        rows = synthetic("gloo", alpha, beta, [2], seed=seed, iters=30, colls=["all_reduce"])
        f = fit_rows(rows, backend="gloo").fit("all_reduce")
        assert f.replicates.shape == (RESAMPLES, 2)
        (a_lo, a_hi), (b_lo, b_hi) = f.alpha_interval, f.beta_interval
        assert a_lo <= f.alpha <= a_hi and b_lo <= f.beta <= b_hi
        covered += [a_lo <= alpha <= a_hi, b_lo <= beta <= b_hi]
    # 95 % nominal (38 of 40): 40 and 37 here. 34 or fewer would be below 95 % beyond chance
    # (binomial, p < 0.02).
    assert (covered >= 35).all(), covered
    again = fit_rows(rows, backend="gloo").fit("all_reduce")
    assert np.array_equal(again.replicates, f.replicates)  # seeded: the same run, the same

    def beta_width(iters):
        widths = []
        for seed in range(8):
            rows = synthetic("gloo", alpha, beta, [2], seed=seed, iters=iters, colls=["all_reduce"])
            lo, hi = fit_rows(rows, backend="gloo").fit("all_reduce").beta_interval
            widths.append(hi - lo)
        return np.median(widths)

    assert 0.35 < beta_width(120) / beta_width(30) < 0.65  # four times the iterations: half


def test_a_predicted_times_interval_comes_from_the_refitted_pairs():
    rows = synthetic("gloo", 50e-6, 1e-9, [2, 4], iters=20, colls=["all_reduce", "all_gather"])
    model = fit_rows(rows, backend="gloo")
    f = model.fit("all_reduce", n=4)
    alpha, beta = f.replicates.T
    nbytes = 3 << 20
    times = 6 * alpha + nbytes * 1.5 * beta  # ring all-reduce at n = 4: 2(n-1), 2(n-1)/n
    assert f.time_interval(nbytes, 4) == pytest.approx(tuple(np.percentile(times, [2.5, 97.5])))
    low, high = model.interval_ends()
    assert low.time("all_reduce", nbytes, 4) == f.time_interval(nbytes, 4)[0]
    assert high.time("all_reduce", nbytes, 4) == f.time_interval(nbytes, 4)[1]
    assert low.time("all_reduce", nbytes, 4) < model.time("all_reduce", nbytes, 4)
    assert high.time("all_reduce", nbytes, 4) > model.time("all_reduce", nbytes, 4)
    assert f.time_interval(nbytes, 1) == (0.0, 0.0)  # one rank moves nothing
    table = model.table().set_index(["ranks", "collective"])
    a_lo, a_hi = f.alpha_interval
    assert table.loc[("4", "all_reduce"), "alpha_us_low"] == pytest.approx(a_lo * 1e6)
    assert table.loc[("4", "all_reduce"), "alpha_us_high"] == pytest.approx(a_hi * 1e6)
    # no samples: no interval, said as NaN, and no range to simulate
    bare = fit_rows(rows.drop(columns="samples_ms"), backend="gloo")
    assert bare.interval_ends() is None
    assert bare.table()[["alpha_us_low", "beta_ns_per_B_high"]].isna().all().all()
    assert math.isnan(bare.fit("all_reduce").time_interval(nbytes, 2)[0])


def _collectives_run(folder: Path, world: int, rows: pd.DataFrame) -> Path:
    """A message_size run folder: meta.json, results.csv, and samples.csv from ``samples_ms``."""
    folder.mkdir()
    meta = {
        "schema_version": "2.1",
        "kind": "collective",
        "sweep": "message_size",
        "backend": "gloo",
        "host": "h",
        "device": "cpu",
        "world_size": world,
        "collective_plan": {"dtype": "float32", "op": "sum"},
    }
    (folder / "meta.json").write_text(json.dumps(meta))
    ids = zip(rows["collective"], rows["size_bytes"], rows["impl"], strict=True)
    rows = rows.assign(point=[f"{c}-{s}-{i}" for c, s, i in ids], round=1)
    rows.drop(columns="samples_ms").to_csv(folder / "results.csv", index=False)
    samples = [
        (p, 1, k, ms)
        for p, x in zip(rows["point"], rows["samples_ms"], strict=True)
        for k, ms in enumerate(x)
    ]
    pd.DataFrame(samples, columns=["point", "round", "index", "ms"]).to_csv(
        folder / "samples.csv", index=False
    )
    return folder


def test_each_run_keeps_its_own_samples(tmp_path):
    """Runs at 2 and 4 ranks name their sizes alike (all_reduce-1024-native): each row gets the
    samples of its own folder."""
    at2 = synthetic("gloo", 50e-6, 1e-9, [2], iters=7, colls=["all_reduce"])
    at4 = synthetic("gloo", 50e-6, 1e-9, [4], iters=9, seed=1, colls=["all_reduce"])
    dirs = [_collectives_run(tmp_path / "c2", 2, at2), _collectives_run(tmp_path / "c4", 4, at4)]
    _, df = read_collectives_runs(dirs)
    expected = [*at2["samples_ms"], *at4["samples_ms"]]
    for want, got in zip(expected, df["samples_ms"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_fit_command_prints_intervals_and_outliers(tmp_path, capsys):
    rows = synthetic("gloo", 50e-6, 1e-9, [2], iters=10, colls=["all_reduce"])
    rows.loc[3, "samples_ms"] = rows.loc[3, "samples_ms"] * 5  # 64 KiB: a hiccup
    rows.loc[3, "time_us"] *= 5
    run = _collectives_run(tmp_path / "coll", 2, rows)
    assert model_main(["fit", "--collectives", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (fit,) = out["fits"]
    (hiccup,) = [r for r in out["residuals"][0]["sizes"] if r["outlier"]]
    assert hiccup["size_bytes"] == 64 << 10 and -82 < hiccup["residual_pct"] < -78
    named = f"64 KiB {hiccup['residual_pct']:+.0f} %"
    assert fit["outlier_residuals"] == named and fit["outliers"] == 1
    assert fit["alpha_us_low"] < fit["alpha_us"] < fit["alpha_us_high"]
    assert fit["beta_ns_per_B_low"] < fit["beta_ns_per_B"] < fit["beta_ns_per_B_high"]
    assert "log time" in out["notes"]["r2_log"]
    assert model_main(["fit", "--collectives", str(run)]) == 0
    text = capsys.readouterr().out
    assert "# r2_log: R^2 of log time" in text and named in text
    assert f"64 KiB {hiccup['residual_pct']:+.0f}% (outlier)" in text


# -- schedules: timelines computed by hand -------------------------------------------------------
def test_one_bucket_without_overlap():
    prog = sch.ddp_program(
        forward_ms=10,
        backward_ms=20,
        after_ms=5,
        ready_ms=[5, 20],
        buckets=[[0, 1]],
        bucket_ms=[8],
        overlap=False,
    )
    tl = sch.simulate(prog)
    assert tl.comm == [(30.0, 38.0, "bucket0")]
    m = tl.metrics()
    assert m["step_ms"] == 43 and m["exposed_comm_ms"] == 8 and m["overlap_ms"] == 0
    assert m["compute_ms"] == 35 and m["overlap_pct"] == 0


def test_two_buckets_fully_hidden_by_backward():
    prog = sch.ddp_program(
        forward_ms=10,
        backward_ms=30,
        after_ms=5,
        ready_ms=[10, 20, 30],
        buckets=[[0], [1], [2]],
        bucket_ms=[5, 5, 0],
    )
    tl = sch.simulate(prog)
    assert tl.comm == [(20.0, 25.0, "bucket0"), (30.0, 35.0, "bucket1")]
    m = tl.metrics()
    assert m["step_ms"] == 45 and m["exposed_comm_ms"] == 0 and m["overlap_pct"] == 100


def test_buckets_go_out_in_order_and_queue_behind_each_other():
    # bucket 0's last gradient comes after bucket 1's: bucket 1 waits for it (issued in order);
    # bucket 1 then queues behind bucket 0 on the one communicator.
    prog = sch.ddp_program(
        forward_ms=0,
        backward_ms=10,
        after_ms=0,
        ready_ms=[2, 8, 4],
        buckets=[[0, 1], [2]],
        bucket_ms=[6, 6],
    )
    tl = sch.simulate(prog)
    assert tl.comm == [(8.0, 14.0, "bucket0"), (14.0, 20.0, "bucket1")]
    assert tl.metrics()["exposed_comm_ms"] == 10


def test_time_shared_core_halves_both_while_they_overlap():
    prog = sch.ddp_program(
        forward_ms=10,
        backward_ms=20,
        after_ms=5,
        ready_ms=[5, 10, 20],
        buckets=[[0, 1], [2]],
        bucket_ms=[8, 8],
    )
    full = sch.simulate(prog)
    assert full.comm == [(20.0, 28.0, "bucket0"), (30.0, 38.0, "bucket1")] and full.end_ms == 43
    half = sch.simulate(prog, share=0.5)
    # bucket 0 (8 ms of work) runs beside the last 10 ms of backward at half speed: 16 ms;
    # backward does 8 ms in that time and its last 2 ms alone; bucket 1 then runs alone.
    assert half.comm == [(20.0, 36.0, "bucket0"), (38.0, 46.0, "bucket1")]
    assert half.end_ms == 51
    with pytest.raises(ValueError, match="share"):
        sch.simulate(prog, share=0)


UNITS = [sch.Unit(forward_ms=10, backward_ms=20, gather_ms=4, reduce_ms=3)] * 2


def test_fsdp_without_prefetch_waits_for_every_gather():
    tl = sch.simulate(sch.fsdp_program(UNITS, after_ms=5, prefetch=False))
    # fwd: ag0 0-4, f0 4-14, ag1 14-18, f1 18-28; bwd: ag_b1 28-32, b1 32-52, rs1 52-55 (hidden
    # under ag_b0 queued behind it: 55-59), b0 59-79, rs0 79-82, after 82-87
    assert [c[:2] for c in tl.comm] == [(0, 4), (14, 18), (28, 32), (52, 55), (55, 59), (79, 82)]
    assert tl.end_ms == 87
    assert tl.metrics()["exposed_comm_ms"] == 4 + 4 + 4 + 3 + 4 + 3 - 0


def test_fsdp_with_prefetch_hides_the_next_gather():
    tl = sch.simulate(sch.fsdp_program(UNITS, after_ms=5, prefetch=True))
    # fwd: ag0 0-4, f0 4-14 with ag1 prefetched 4-8; f1 14-24. bwd: ag_b1 24-28, b1 28-48 with
    # ag_b0 prefetched 28-32; rs1 48-51; b0 48-68; rs0 68-71; after 71-76
    assert [c[:2] for c in tl.comm] == [(0, 4), (4, 8), (24, 28), (28, 32), (48, 51), (68, 71)]
    assert tl.end_ms == 76
    m = tl.metrics()
    assert m["exposed_comm_ms"] == 4 + 4 + 3 and m["overlap_ms"] == 4 + 4 + 3


def test_sharding_strategies_change_the_gathers():
    no_reshard = sch.simulate(sch.fsdp_program(UNITS, after_ms=0, reshard_after_forward=False))
    assert not any(name.startswith("ag_b") for _, _, name in no_reshard.comm)
    no_shard = sch.simulate(sch.fsdp_program(UNITS, after_ms=0, shard=False))
    assert [name for _, _, name in no_shard.comm] == ["rs1", "rs0"]
    blocking = sch.simulate(sch.fsdp_program(UNITS, after_ms=0, shard=False, reduce_blocks=True))
    assert blocking.end_ms == 20 + 40 + 6 and blocking.metrics()["overlap_ms"] == 0


def test_tensor_parallel_all_reduces_sit_on_the_critical_path():
    tl = sch.simulate(
        sch.tp_program(
            forward_ms=10, backward_ms=20, after_ms=4, forward_comm_ms=[1, 1], backward_comm_ms=[2]
        )
    )
    m = tl.metrics()
    assert tl.end_ms == 10 + 20 + 4 + 1 + 1 + 2 and m["overlap_ms"] == 0
    assert m["exposed_comm_ms"] == 4


def test_hybrid_shard_reduces_in_its_group_then_across_replicas():
    comm = fit_rows(synthetic("gloo", 50e-6, 1e-9, [2, 4]), backend="gloo")
    prof = ComputeProfile(forward_ms=10, backward_ms=20, after_ms=5)
    record = make_point(
        "sharding_strategy",
        "wide_mlp",
        "HYBRID_SHARD",
        "native",
        "fsdp",
        world_size=4,
        knobs={"sharding_strategy": "HYBRID_SHARD"},
    )
    prog = fsdp(case_of(record), prof, comm)
    unit0 = 4 * (784 * 2048 + 2048)  # wide_mlp's first linear layer, fp32
    gathers = {op.name: op.ms for op in prog if isinstance(op, sch.Issue)}
    assert gathers["ag_f0"] == pytest.approx(1e3 * comm.time("all_gather", unit0, 2))
    assert gathers["ag_b0"] == gathers["ag_f0"]  # resharded after forward, as FULL_SHARD
    expected = comm.time("reduce_scatter", unit0, 2) + comm.time("all_reduce", unit0 / 2, 2)
    assert gathers["rs0"] == pytest.approx(1e3 * expected)


def test_collectives_of_two_communicators_run_beside_each_other():
    # a and b share a communicator and queue; c runs beside them on its own
    prog = [sch.Issue("a", 4), sch.Issue("b", 2), sch.Issue("c", 3, "tp"), sch.Wait("c")]
    prog += [sch.Compute(1), sch.Wait("b")]
    tl = sch.simulate(prog)
    assert tl.comm == [(0, 3, "c"), (0, 4, "a"), (4, 6, "b")]
    assert tl.compute == [(3, 4, "compute")] and tl.end_ms == 6
    assert tl.metrics()["comm_ms"] == 6  # their union


def test_fsdp_over_tp_blocks_on_tp_calls_beside_fsdps_collectives():
    prog = sch.fsdp_program(UNITS, after_ms=5)
    prog = sch.with_blocking_calls(prog, "forward", 20, [1])
    prog = sch.with_blocking_calls(prog, "backward", 40, [2])
    tl = sch.simulate(prog)
    # as test_fsdp_with_prefetch_hides_the_next_gather, with forward's call at 10 ms of its
    # computation (f1's start: 14-15) and backward's at 20 (b0's start, 49): the latter on its
    # own communicator beside rs1 (49-52), not queued behind it
    assert [c[:2] for c in tl.comm] == [
        (0, 4), (4, 8), (14, 15), (25, 29), (29, 33), (49, 51), (49, 52), (71, 74),
    ]  # fmt: skip
    assert tl.end_ms == 79
    with pytest.raises(ValueError, match="past the program's forward"):
        sch.with_blocking_calls([sch.Compute(1, "backward")], "forward", 2, [1])


def test_fsdp_over_tp_gathers_each_units_tp_local_bytes_among_its_dp_ranks():
    comm = fit_rows(synthetic("gloo", 50e-6, 1e-9, [2, 4]), backend="gloo")
    prof = ComputeProfile(10, 20, 5, grad_ready_ms=(10, 20), grad_bytes=(4000, 4000))
    knobs = {"tp_degree": 2, "dp_shard": True}
    record = make_point("tp_degree", "transformer", 2, "native", "tp", world_size=4, knobs=knobs)
    case = case_of(record)
    issued = [op for op in tp(case, prof, comm) if isinstance(op, sch.Issue)]
    units = case.figures["fsdp_unit_bytes"]
    by = {op.name: op for op in issued}
    for u, nbytes in enumerate(units):
        assert by[f"ag_f{u}"].ms == pytest.approx(1e3 * comm.time("all_gather", nbytes / 2, 2))
        assert by[f"rs{u}"].ms == pytest.approx(1e3 * comm.time("reduce_scatter", nbytes / 2, 2))
    on_tp = [op for op in issued if op.queue == "tp"]
    assert len(on_tp) == len(case.figures["tp_comm_calls"]) > 0
    assert {op.queue for op in issued} == {"tp", sch.COMM}
    # the same mesh replicated: DDP's buckets, no gathers
    ddp_case = case_of(replace(record, knobs={**record.knobs, "dp_shard": False}))
    names = {op.name for op in tp(ddp_case, prof, comm) if isinstance(op, sch.Issue)}
    assert not any(n.startswith("ag_") for n in names) and "bucket0" in names


def test_programs_are_checked():
    with pytest.raises(ValueError, match="issued twice"):
        sch.simulate([sch.Issue("a", 1), sch.Issue("a", 1)])
    with pytest.raises(ValueError, match="never issued"):
        sch.simulate([sch.Wait("a")])


# -- buckets: the same assignment as PyTorch and as our reference ---------------------------------
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("cap_mb", [0.25, 1, 5, 25])
def test_native_buckets_are_pytorchs(seed, cap_mb):
    rng = np.random.default_rng(seed)
    numels = [int(x) for x in rng.choice([10, 2048, 65536, 1 << 20, 4 << 20], size=12)]
    sizes = [4 * n for n in numels]
    cap = int(cap_mb * 2**20)
    tensors = [torch.empty(n) for n in numels]
    for first in (None, 2**20):
        theirs, _ = dist._compute_bucket_assignment_by_size(tensors, [first or cap, cap])
        assert sch.native_buckets(sizes, cap, first) == [list(b) for b in theirs]


@pytest.mark.parametrize("cap_mb", [0.01, 0.25, 1, 25])
def test_reference_buckets_are_plan_buckets(cap_mb):
    params = [nn.Parameter(torch.empty(n)) for n in [10, 2048, 65536, 300, 1 << 18, 7, 4096]]
    theirs = plan_buckets(params, cap_mb)
    index = {id(p): i for i, p in enumerate(params)}
    ours = sch.reference_buckets([4 * p.numel() for p in params], int(cap_mb * 2**20))
    assert ours == [[index[id(p)] for p in b] for b in theirs]


# -- computation read from a trace ---------------------------------------------------------------
def _op(name, ts, dur, tid=1, cat="cpu_op", **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": tid, "ts": ts, "dur": dur}
    return {**e, "args": args} if args else e


def test_compute_profile_from_a_trace(tmp_path):
    acc = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    events = []
    for step, t0 in ((1, 0.0), (2, 1000.0)):
        events += [
            _op(f"ProfilerStep#{step}", t0, 1000, cat="user_annotation"),
            _op("aten::addmm", t0 + 10, 200),  # forward: 200 us
            _op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 300, 100),
            _op(acc, t0 + 400, 20),
            _op(
                "torch::autograd::AccumulateGrad",
                t0 + 405,
                10,
                **{"Input Dims": [[256, 128]], "Input type": ["float"]},
            ),
            _op("autograd::engine::evaluate_function: AddmmBackward0", t0 + 420, 180),
            _op(acc, t0 + 600, 20),
            _op(
                "torch::autograd::AccumulateGrad",
                t0 + 605,
                10,
                **{"Input Dims": [[10]], "Input type": ["float"]},
            ),
            _op("c10d::allreduce_", t0 + 650, 100),  # waiting: not computation
            _op("gloo:all_reduce", t0 + 640, 100, tid=2, cat="user_annotation"),
            _op("Optimizer.step#AdamW.step", t0 + 800, 150),
        ]
    folder = tmp_path / "point"
    folder.mkdir()
    write_trace(folder / "rank0.1.pt.trace.json", events)
    p = from_trace_dir(folder)
    assert p.forward_ms == pytest.approx(0.2)
    assert p.backward_ms == pytest.approx(0.32)  # 300..620 all busy
    assert p.after_ms == pytest.approx(0.15)
    assert p.grad_bytes == (256 * 128 * 4, 40)
    assert p.grad_ready_ms == pytest.approx((0.115, 0.315))


def test_compute_profile_of_a_real_gpu_trace():
    """HolisticTraceAnalysis's NCCL trace (tests/data/hta, MIT licence, Meta Platforms): kernels
    placed by their CPU launch; 161 gradients in backward order, inside backward."""
    p = from_trace_dir(Path(__file__).parent / "data" / "hta", pattern="nccl_data.json.gz")
    assert p.forward_ms == pytest.approx(12.66, abs=0.05)
    assert p.backward_ms == pytest.approx(25.1, abs=0.1) and 0 < p.after_ms < 1
    ready = np.array(p.grad_ready_ms)
    assert len(ready) == 161 and (np.diff(ready) >= 0).all()
    assert ready[0] > 0 and ready[-1] <= p.backward_ms + 1e-9


# -- links and what-if ---------------------------------------------------------------------------
def test_link_presets_and_custom_links():
    assert parse_link("ib_ndr") is PRESETS["ib_ndr"]
    custom = parse_link("alpha=5e-6,beta=2e-11")
    assert custom.bandwidth_GBps == pytest.approx(50) and custom.alpha_s == 5e-6
    assert parse_link("alpha=1e-6,bw=100").beta_s_per_byte == pytest.approx(1e-11)
    for bad, msg in (
        ("infiniband9", "unknown link preset"),
        ("alpha=1,beta=-2", "positive"),
        ("alpha=x,beta=1", "not a number"),
        ("beta=1e-9", "give alpha"),
        ("alpha=1e-6,speed=3", "unknown key"),
    ):
        with pytest.raises(ValueError, match=msg):
            parse_link(bad)
    for link in PRESETS.values():
        assert link.source and link.bandwidth_GBps > 0 and link.alpha_s > 0


def test_nccl_all_reduce_takes_the_faster_of_ring_and_tree():
    costs = LinkCosts(PRESETS["ib_ndr"])
    ring = ALGORITHMS["nccl"]["all_reduce"]
    small, n = 64 << 10, 1024
    assert costs.time("all_reduce", small, n) < ring.time(small, n, 5e-6, 1 / 50e9)
    big = 1 << 30
    assert costs.time("all_reduce", big, 8) == pytest.approx(ring.time(big, 8, 5e-6, 1 / 50e9))


def test_whatif_predicts_and_recommends():
    prof = ComputeProfile(
        forward_ms=10,
        backward_ms=20,
        after_ms=5,
        grad_ready_ms=(1, 8, 15, 20),
        grad_bytes=(40, 81920, 16 << 20, 6 << 20),
    )
    point = make_point("bucket_cap_mb", "wide_mlp", 25.0, "native", "ddp")
    table = predict_scales(
        prof, point=point, comm=LinkCosts(PRESETS["eth_25g"]), world_sizes=[8, 64]
    )
    assert set(table["world_size"]) == {8, 64}
    assert (table["scaling_efficiency_pct"] <= 100 + 1e-9).all()
    assert (table["step_ms"] >= 35 - 1e-9).all()
    at = table.set_index(["world_size", "choice"])
    assert at.loc[(64, DEFAULT_DDP), "step_ms"] >= at.loc[(8, DEFAULT_DDP), "step_ms"]
    # the state each choice holds: the ZeRO accounting of its parameters (16 B each replicated)
    psi = sum(prof.grad_bytes) // 4
    for n in (8, 64):
        assert at.loc[(n, DEFAULT_DDP), "state_mb_per_rank"] == pytest.approx(16 * psi / 2**20)
        full = at.loc[(n, "fsdp FULL_SHARD"), "state_mb_per_rank"]
        assert full == pytest.approx(16 * psi / n / 2**20)
        assert full == pytest.approx(zero_state_bytes(psi, n, "FULL_SHARD") / 2**20)
    # a link's figures are given: no range
    assert table[["step_ms_low", "step_ms_high"]].isna().all().all()
    rec = recommend(table)
    assert list(rec["family"]) == ["ddp", "fsdp", "ddp", "fsdp"]
    for r in rec.itertuples():
        fam = table[
            (table["world_size"] == r.world_size) & table["choice"].str.startswith(r.family + " ")
        ]
        assert r.step_ms == fam["step_ms"].min()
        assert r.margin_ms == pytest.approx(r.default_step_ms - r.step_ms)
        assert math.isnan(r.margin_ms_low) and math.isnan(r.best_at_both_ends)
    # ten times faster computation: the same collectives, a tenth of the computation
    fast = predict_scales(
        prof, point=point, comm=LinkCosts(PRESETS["eth_25g"]), world_sizes=[8], speedup=10
    )
    slow = table[table["world_size"] == 8].set_index("choice")
    fast = fast.set_index("choice")
    assert fast["comm_ms"].to_numpy() == pytest.approx(slow.loc[fast.index, "comm_ms"].to_numpy())
    assert (fast["step_ms"] >= prof.total_ms / 10 - 1e-9).all()
    assert (fast["step_ms"] < slow.loc[fast.index, "step_ms"]).all()


def test_recommend_on_a_table_with_known_answers():
    """The fastest of each family, its margin over the default, and with ranges the margin's
    least and greatest and whether the choice still wins at both ends."""
    steps = {  # choice: (step_ms, low, high)
        DEFAULT_DDP: (50, 45, 60),
        "ddp bucket_cap_mb=1": (40, 38, 62),  # fastest, but not at the high end
        "ddp bucket_cap_mb=25": (45, 44, 61),
        "fsdp FULL_SHARD": (60, 50, 70),
        "fsdp SHARD_GRAD_OP": (55, 49, 65),  # fastest at all three
        "fsdp NO_SHARD": (70, 60, 80),
    }
    table = pd.DataFrame(
        [
            {
                "world_size": 8,
                "choice": c,
                "step_ms": m,
                "step_ms_low": lo,
                "step_ms_high": hi,
                "state_mb_per_rank": 1.0,
            }
            for c, (m, lo, hi) in steps.items()
        ]
    )
    ddp, fsdp_ = (r for _, r in recommend(table).iterrows())
    assert ddp["recommended"] == "ddp bucket_cap_mb=1" and ddp["margin_ms"] == 10
    assert ddp["margin_pct"] == pytest.approx(20)
    assert (ddp["margin_ms_low"], ddp["margin_ms_high"]) == (-2, 10)  # 60 - 62 at the high end
    assert not ddp["best_at_both_ends"]
    assert fsdp_["recommended"] == "fsdp SHARD_GRAD_OP" and fsdp_["margin_ms"] == 5
    assert (fsdp_["margin_ms_low"], fsdp_["margin_ms_high"]) == (1, 5)
    assert fsdp_["best_at_both_ends"]
    assert (fsdp_["default_step_ms_low"], fsdp_["default_step_ms_high"]) == (50, 70)


def test_whatif_with_fitted_collectives_predicts_a_range():
    comm = fit_rows(synthetic("gloo", 200e-6, 2e-9, [2], iters=15, jitter=0.2), backend="gloo")
    prof = ComputeProfile(
        forward_ms=10,
        backward_ms=20,
        after_ms=5,
        grad_ready_ms=(1, 8, 15, 20),
        grad_bytes=(40, 81920, 16 << 20, 6 << 20),
    )
    point = make_point("bucket_cap_mb", "wide_mlp", 25.0, "native", "ddp")
    table = predict_scales(prof, point=point, comm=comm, world_sizes=[2, 8], share=0.5)
    assert (table["step_ms_low"] <= table["step_ms"] + 1e-9).all()
    assert (table["step_ms"] <= table["step_ms_high"] + 1e-9).all()
    assert (table["step_ms_high"] > table["step_ms_low"]).all()  # every choice communicates
    # each end is the step with every collective at that end of its interval
    for end, costs in zip(("low", "high"), comm.interval_ends(), strict=True):
        at_end = predict_scales(prof, point=point, comm=costs, world_sizes=[2, 8], share=0.5)
        np.testing.assert_allclose(table[f"step_ms_{end}"], at_end["step_ms"])
        assert at_end["step_ms_low"].isna().all()  # an end has no interval of its own
    rec = recommend(table)
    assert (rec["margin_ms_low"] <= rec["margin_ms"]).all()
    assert (rec["margin_ms"] <= rec["margin_ms_high"]).all()
    assert rec["best_at_both_ends"].isin([True, False]).all()


def test_an_interval_holds_its_own_estimate():
    """A skewed bootstrap's percentile interval can miss the full sample's fit (seen once for a
    real all_reduce beta): it is widened to hold it, and left alone otherwise."""
    values = np.linspace(1.29, 1.5, 1000)
    assert interval(values, 1.16) == pytest.approx((1.16, np.percentile(values, 97.5)))
    assert interval(values, 1.4) == pytest.approx(tuple(np.percentile(values, [2.5, 97.5])))
    assert interval(values) == pytest.approx(tuple(np.percentile(values, [2.5, 97.5])))
