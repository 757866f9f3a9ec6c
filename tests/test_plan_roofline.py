"""The planner's computation priced op by op on a device's roofline: the ops the memory stage
counts under fake tensors, their prices against a hand computation, a faster profile and a
calibration factor in the plan's rows, and ``--device-profile``'s bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bench.plan import __main__ as plan_cli
from bench.plan import memory, ranking, step_time
from bench.plan.calibration import Target
from bench.plan.devices import DEVICES
from bench.plan.op_mix import COMPUTE, mix_of
from bench.plan.op_prices import Pricing, fit_scale, priced
from bench.plan.request import OPTIONS, PlanRequest
from bench.plan.roofline_fit import calibrated_rates, row_scale, stated
from bench.plan.space import enumerate_space
from bench.plan.topology import Topology
from bench.roofline.op_count import OpCounter
from bench.roofline.profile import FORMAT, from_json

pytestmark = pytest.mark.unit

PEAK_TFLOPS, MATMUL_EFF, GBPS, LAUNCH_US = 0.01, 0.5, 100.0, 2.0


def profile(peak=PEAK_TFLOPS, gbps=GBPS, launch_us=LAUNCH_US, **changes) -> dict:
    """A profile of flat efficiencies (an op's price is then simple arithmetic)."""
    flat = {"sizes": [1.0], "efficiency": [MATMUL_EFF]}
    data = {
        "format": FORMAT,
        "device": "test device",
        "source": "stated by the test",
        "peak_tflops": {"fp32": peak, "bf16": 2 * peak},
        "memory_GBps": gbps,
        "matmul": {"fp32": flat, "bf16": flat},
        "memory": {"sizes": [1.0], "efficiency": [1.0]},
        "launch_us": launch_us,
    }
    return {**data, **changes}


def test_one_linears_step_prices_its_three_matmuls_at_their_flops_over_the_peak():
    b, n_in, n_out = 8, 64, 32
    with FakeTensorMode():
        lin = torch.nn.Linear(n_in, n_out, bias=False)
        x = torch.randn(b, n_in, requires_grad=True)
        with OpCounter() as counter:
            loss = lin(x).sum()
            counter.phase = "backward"
            loss.backward()
    mix = mix_of(counter.records)
    mms = {k: n for k, n in mix.counts.items() if k.flops > 0}
    # forward, the input's gradient and the weight's: each 2 b in out FLOPs, and the bytes of
    # its operands and output (the transposed weight a view, no op of its own)
    assert sorted((k.phase, n) for k, n in mms.items()) == [("backward", 2.0), ("forward", 1.0)]
    for k in mms:
        assert k.flops == 2 * b * n_in * n_out
        assert k.nbytes == 4 * (b * n_in + n_in * n_out + b * n_out)
    assert all(k.op != "aten.t" for k in mix.counts)
    roof = from_json(profile(gbps=1e6))  # memory far faster: the matmuls compute-bound
    at = priced(mix, Pricing(roof))
    by_hand_ms = 3 * 2 * b * n_in * n_out / (PEAK_TFLOPS * 1e12 * MATMUL_EFF) * 1e3
    assert at.matmul_ms == pytest.approx(by_hand_ms)
    assert at.fixed_ms == pytest.approx(mix.ops() * LAUNCH_US / 1e3)
    # the elementwise rest at its bytes over the bandwidth
    rest = sum(n * k.nbytes for k, n in mix.counts.items() if k.flops == 0)
    assert at.memory_ms == pytest.approx(rest / (1e6 * 1e9) * 1e3)


def test_the_ops_at_a_micro_batch_are_those_counted_there_and_sum_to_its_flops():
    derived = memory.step_ops(memory.Counting("llama:tiny", False), 4)
    counted = mix_of(memory._counted(memory.Counting("llama:tiny", False), 4).records)
    assert derived.counts.keys() == counted.counts.keys()
    for k, n in counted.counts.items():
        assert derived.counts[k] == pytest.approx(n)
    assert derived.of(COMPUTE).flops() == pytest.approx(
        memory._flops(memory.Counting("llama:tiny", False), 4)
    )
    assert {k.phase for k in derived.counts} == {"forward", "backward", "optimiser"}
    # checkpointing's recomputation is in backward's ops
    ckpt = memory.step_ops(memory.Counting("llama:tiny", True), 4)
    assert ckpt.of(["forward"]).flops() == pytest.approx(derived.of(["forward"]).flops())
    assert ckpt.of(["backward"]).flops() > derived.of(["backward"]).flops()


def _rows(pricing_of: dict) -> dict[str, pd.DataFrame]:
    """Each named roofline's rows of DDP on llama:tiny at 2 ranks (one tracking for all)."""
    request = PlanRequest(
        model="llama:tiny",
        world_size=2,
        global_batch=8,
        gpus_per_node=2,
        families=("ddp",),
        options={**OPTIONS, "precision": ("fp32",), "activation_checkpointing": ("off",)},
    )
    configs = enumerate_space(request)
    figures = memory.predict_memory(configs, gpus_per_node=2)
    out = {}
    for name, rates in pricing_of.items():
        target = Target(
            device=DEVICES["cpu"],
            topology=Topology.of_links("nvlink4", 2),
            peak_tflops=lambda p: PEAK_TFLOPS,
            peak_source=lambda p: "test",
            allowance_gib=0.0,
            global_batch=8,
            rates=rates,
        )
        times = step_time.step_times(configs, figures, target)
        rows = ranking.ranked_rows(configs, figures, times, target)
        out[name] = rows.sort_values("config").set_index(["config", "micro_batch"])
    return out


def test_a_profile_twice_as_fast_halves_the_compute_bound_part_and_a_factor_scales_both():
    roof = from_json(profile(gbps=1e6))
    fast = from_json(profile(peak=2 * PEAK_TFLOPS, gbps=1e6))
    scaled = stated(roof, ("fp32",))["fp32"]
    calibrated = {"fp32": scaled.__class__(**{**vars(scaled), "pricing": Pricing(roof, 2.0)})}
    rows = _rows(
        {"base": stated(roof, ("fp32",)), "fast": stated(fast, ("fp32",)), "x2": calibrated}
    )
    base = rows["base"]
    assert len(base) >= 3 and (base["matmul_ms"] > 0).all()
    assert (base["compute_source"] == "roofline: stated by the test").all()
    for name, matmul, memory_bound in (("fast", 0.5, 1.0), ("x2", 0.5, 0.5)):
        r = rows[name]
        assert (r["matmul_ms"] / base["matmul_ms"]).to_numpy() == pytest.approx(matmul)
        assert (r["memory_bound_ms"] / base["memory_bound_ms"]).to_numpy() == pytest.approx(
            memory_bound
        )
        assert (r["op_fixed_ms"] == base["op_fixed_ms"]).all()
        assert (r["step_ms"] < base["step_ms"]).all()
    # the parts are the computation; accumulating runs each micro-batch's ops again
    parts = base[["matmul_ms", "memory_bound_ms", "op_fixed_ms"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(base["compute_ms"].to_numpy())
    # a launch per op: each micro-batch's forward and backward, and the optimiser's step once
    for accum in (1, 2, 4):
        row = base[base["grad_accum"] == accum].iloc[0]
        ops = memory.step_ops(memory.Counting("llama:tiny", False), 4 // accum)
        launches = accum * ops.of(COMPUTE).ops() + ops.of(["optimiser"]).ops()
        assert row["op_fixed_ms"] == pytest.approx(launches * LAUNCH_US / 1e3)


def test_a_measured_computation_fits_the_factor_that_prices_it():
    roof = from_json(profile())
    ops = memory.step_ops(memory.Counting("llama:tiny", False), 4)
    at_half = priced(ops, Pricing(roof, 0.5)).total_ms
    assert fit_scale(ops, at_half, roof) == pytest.approx(0.5)
    row = {"model": "llama:tiny", "batch_per_replica": 4, "value": "fp32", "compute_ms": at_half}
    assert row_scale(row, roof, False) == pytest.approx(0.5)
    # with a cost per micro-batch beyond the ops: the same 4 samples in 2 micro-batches cost
    # their ops at the factor and that cost twice; the two steps give both back
    micro_ms, rows = 3.0, pd.DataFrame([{**row, "compute_ms": at_half + 3.0}])
    small = memory.step_ops(memory.Counting("llama:tiny", False), 2)
    two = small.of(["optimiser"]).plus(small.of(COMPUTE), 2)
    delta = priced(two, Pricing(roof, 0.5)).total_ms + 2 * micro_ms - rows["compute_ms"][0]
    rate = calibrated_rates(rows, roof, roof, "a test", False, {"fp32": (2, delta)})["fp32"]
    assert rate.pricing.scale == pytest.approx(0.5) and rate.micro_ms == pytest.approx(micro_ms)
    assert rate.source.startswith("roofline calibrated by a test (efficiencies x0.5 of stated")


@pytest.mark.parametrize(
    "write, says",
    [
        (lambda: "{not json", "not JSON"),
        (lambda: json.dumps(profile(peak_tflops={"fp4": 1.0})), "unknown precision 'fp4'"),
        (lambda: json.dumps({k: v for k, v in profile().items() if k != "memory"}), "lacks"),
        (lambda: json.dumps(profile(peak_tflops={"fp32": 1.0}, matmul={})), "keyed by precision"),
    ],
)
def test_a_bad_device_profile_is_one_line_and_exit_2(write, says, capsys, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(write())
    argv = ["--model", "llama:tiny", "--world-size", "2", "--global-batch", "8"]
    argv += ["--device-profile", str(path), "--out", str(tmp_path / "plan")]
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "--device-profile" in err and "\n" not in err, err
    assert not (tmp_path / "plan").exists()


def test_a_profile_without_a_planned_precision_is_refused_before_any_work(capsys, tmp_path):
    path = tmp_path / "profile.json"
    flat = {"sizes": [1.0], "efficiency": [1.0]}
    path.write_text(json.dumps(profile(peak_tflops={"fp32": 1.0}, matmul={"fp32": flat})))
    argv = ["--model", "llama:tiny", "--world-size", "2", "--global-batch", "8"]
    argv += ["--device-profile", str(path), "--option", "precision=bf16"]
    argv += ["--out", str(tmp_path / "plan")]
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "no peak for bf16" in err and "\n" not in err, err
    assert not (tmp_path / "plan").exists()


def test_a_cpu_plan_without_its_launch_prices_on_this_hosts_profile(monkeypatch, tmp_path):
    host = from_json(profile(source="measured on this host by the test"))
    monkeypatch.setattr("bench.roofline.measure.host_profile", lambda *a, **k: host)
    out = tmp_path / "plan"
    argv = ["--model", "llama:tiny", "--world-size", "2", "--gpus-per-node", "2"]
    argv += ["--global-batch", "8", "--device", "cpu", "--link", "nvlink4"]
    argv += ["--family", "ddp", "--option", "precision=fp32"]
    argv += ["--option", "activation_checkpointing=off", "--no-calibration-launch"]
    argv += ["--workers", "1", "--out", str(out)]
    assert plan_cli.main(argv) == 0
    rows = pd.read_csv(out / "plan.csv")
    assert (rows["compute_source"] == "roofline: measured on this host by the test").all()
    assert not (out / "calibration").exists()  # nothing launched
    meta = json.loads((out / "plan.json").read_text())
    assert meta["rates"]["fp32"]["roofline"]["profile"] == host.as_json()
