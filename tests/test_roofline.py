"""A device's roofline as data (docs/roofline.md): the file format, its refusals, the
measurement on this CPU against a matmul timed here directly, the per-host cache, and the
datasheet GPUs' stated profiles."""

import json
import multiprocessing
import time
from pathlib import Path

import pytest
import torch

from bench.roofline import measure as m
from bench.roofline.__main__ import main
from bench.roofline.datasheet import MEMORY, datasheet_profile
from bench.roofline.profile import Curve, Roofline, StepCost, from_json, read, write
from bench.roofline.step_cost import Measured, body_us, fit
from bench.runfolder.peaks import DATASHEETS, datasheet_peak

pytestmark = pytest.mark.unit

TINY = m.Sizes(
    square=(32, 64, 128),
    memory_bytes=(4096, 65536, 1 << 20),
    repeats=3,
    batch_s=0.002,
    call_budget_s=10.0,
    sweep_s=5.0,
)


def _profile() -> Roofline:
    return Roofline(
        device="a test CPU",
        source="made by hand",
        peak_tflops={"fp32": 0.1, "bf16": 0.2},
        memory_GBps=50.0,
        matmul={"fp32": Curve((1e5, 1e7, 1e9), (0.2, 0.9, 1.0)), "bf16": Curve((1e6,), (0.5,))},
        memory=Curve((1e4, 1e8), (0.3, 1.0)),
        launch_us=1.5,
        step=StepCost(op_us=7.0, efficiency=0.75),
        math_Gelems={op: 1.0 for op in m.MATH_OPS} | {"aten::tanh": 0.4, "aten::exp": 1.2},
        memory_cold=Curve((1e4,), (0.25,)),
        traced_op_us=0.5,
    )


def test_the_file_format_round_trips(tmp_path):
    p = _profile()
    assert from_json(json.loads(json.dumps(p.as_json()))) == p
    write(p, tmp_path / "sub" / "p.json")
    assert read(tmp_path / "sub" / "p.json") == p
    assert main(["--check", str(tmp_path / "sub" / "p.json")]) == 0
    # without its optional step costs: an op in a step priced as an op alone
    alone = {k: v for k, v in p.as_json().items() if k != "step"}
    assert from_json(alone).in_step() == StepCost(op_us=1.5, efficiency=1.0)


def test_a_traces_ops_are_priced_on_the_cold_curve_and_the_traced_op_cost():
    """Known answers on the hand-made profile: 1 MB allocated cold at 25 % of 50 GB/s, hot at
    the memory curve's 65 % there; a matmul's FLOPs at the efficiency of the size it runs as;
    a profile without the newer fields (an older file) prices as an op alone."""
    p = _profile()
    assert p.memory_us(1e6, cold=True) == pytest.approx(1e6 / (50e3 * 0.25))  # 80 us
    assert p.memory_us(1e6) == pytest.approx(1e6 / (50e3 * 0.65))  # log-midway: 0.3 .. 1.0
    assert p.compute_us(1e7, "fp32") == pytest.approx(1e7 / (0.1e6 * 0.9))
    assert p.compute_us(1e7, "fp32", size=1e5) == pytest.approx(1e7 / (0.1e6 * 0.2))
    assert p.traced_launch_us == 0.5
    older = {k: v for k, v in p.as_json().items() if k not in ("memory_cold", "traced_op_us")}
    old = from_json(older)
    assert old.memory_us(1e6, cold=True) == p.memory_us(1e6) and old.traced_launch_us == 1.5


def _broken(data: dict, case: str) -> dict | str:
    if case == "missing field":
        del data["memory_GBps"]
    elif case == "unknown field":
        data["colour"] = "blue"
    elif case == "unknown precision":
        data["peak_tflops"]["fp4"] = 1.0
    elif case == "non-increasing sizes":
        data["memory"]["sizes"] = [1e8, 1e4]
    elif case == "efficiency > 1":
        data["matmul"]["fp32"]["efficiency"][1] = 1.2
    elif case == "bad step":
        data["step"] = {"op_us": 7.0, "efficiency": 0}
    elif case == "bad math rate":
        data["math_Gelems"]["aten::tanh"] = -1
    elif case == "bad cold curve":
        data["memory_cold"] = {"sizes": [1e4], "efficiency": [1.5]}
    elif case == "bad traced op cost":
        data["traced_op_us"] = "fast"
    elif case == "non-JSON":
        return '{"format": "parallel-bench roofline 1",'
    return data


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing field", "lacks 'memory_GBps'"),
        ("unknown field", "unknown field 'colour'"),
        ("unknown precision", "unknown precision 'fp4'"),
        ("non-increasing sizes", "memory.sizes must increase"),
        ("efficiency > 1", "efficiency must lie in (0, 1]"),
        ("bad step", "step.efficiency must be a positive number"),
        ("bad math rate", "math_Gelems.aten::tanh must be a positive number"),
        ("bad cold curve", "memory_cold.efficiency must lie in (0, 1]"),
        ("bad traced op cost", "traced_op_us must be a number >= 0"),
        ("non-JSON", "not JSON"),
    ],
)
def test_a_malformed_profile_is_one_line_and_exit_2(tmp_path, capsys, case, says):
    broken = _broken(_profile().as_json(), case)
    path = tmp_path / "p.json"
    path.write_text(broken if isinstance(broken, str) else json.dumps(broken))
    assert main(["--check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: ")
    assert says in captured.err and str(path) in captured.err


def test_an_unknown_datasheet_gpu_is_one_line_and_exit_2(capsys):
    assert main(["--device-name", "NVIDIA GeForce RTX 4090"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def _direct_s(call, calls: int = 20, repeats: int = 5) -> float:
    """Seconds per call, timed here without the suite's timer: the best of a few loops."""
    call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def test_the_measurement_here_agrees_with_a_matmul_timed_directly():
    p = m.measure("cpu", TINY)
    assert from_json(p.as_json()) == p
    assert set(p.peak_tflops) == {"fp32", "bf16"}
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    direct_tflops = 2 * 128**3 / _direct_s(lambda: a @ b) / 1e12
    # the peak is the best of the shapes and sizes up to 128: no slower than a 128^3 matmul
    # (less noise), and not faster than a few times it on a CPU whose rate has levelled by then
    assert direct_tflops / 3 < p.peak_tflops["fp32"] < 4 * direct_tflops
    x, y = torch.ones(1), torch.ones(1)
    direct_launch_us = _direct_s(lambda: torch.add(x, y), calls=2000) * 1e6
    assert direct_launch_us / 4 < p.launch_us < 4 * direct_launch_us
    assert p.matmul["fp32"].sizes == (2 * 32**3, 2 * 64**3, 2 * 128**3)
    assert p.memory.sizes == tuple(3.0 * n for n in TINY.memory_bytes)
    assert max(p.memory.efficiency) == 1.0 and p.memory_GBps > 0
    # every elementwise function timed, a tanh of 64K elements slower than its bytes' time
    assert set(p.math_Gelems) == set(m.MATH_OPS)
    tanh_us = p.math_us("aten::tanh", m.MATH_ELEMENTS)
    assert tanh_us > p.memory_us(2 * 4 * m.MATH_ELEMENTS) and p.math_us("aten::add", 1e6) == 0
    # an op inside a training step costs more than a bare launch here
    assert p.step is not None and p.step.op_us > p.launch_us and 0.1 < p.step.efficiency < 3
    # the cold curve at the hot one's sizes, a fraction of its bandwidth; an operator in a
    # profiled step's trace costs something, less than the unprofiled step's op
    assert p.memory_cold is not None and p.memory_cold.sizes == p.memory.sizes
    assert all(0 < e <= 1 for e in p.memory_cold.efficiency)
    assert p.traced_op_us is not None and 0 < p.traced_op_us < p.step.op_us


def test_the_curve_prices_each_measured_call_as_it_ran():
    bench = m.Bench(torch.device("cpu"), TINY, launch_s=1e-6)
    points = [m.Timed(1e6, (1.5e-6,)), m.Timed(1e8, (2e-3, 4e-3)), m.Timed(1e9, (1e-2,))]
    top, curve = m.curve(bench, points)
    assert top == pytest.approx(1e9 / (1e-2 - 1e-6))  # the short call is no ceiling
    assert curve.efficiency[0] == 1.0  # its rate (2e12 FLOP/s) is capped
    # the size of two shapes: the geometric mean of their rates over the top
    r1, r2 = 1e8 / (2e-3 - 1e-6), 1e8 / (4e-3 - 1e-6)
    assert curve.efficiency[1] == pytest.approx((r1 * r2) ** 0.5 / top)
    p = Roofline("cpu", "test", {"fp32": top / 1e12}, 1.0, {"fp32": curve}, curve, 1.0)
    assert p.op_us(1e9, 0, "fp32")[0] == pytest.approx(1e4)  # 10 ms, as it ran


def test_the_step_costs_fitted_give_back_those_that_made_the_steps():
    p = _profile()
    op = ("forward", "aten.mm", "fp32", 2e6, 3e4)
    sized = [(op,) * 10, (("forward", "aten.mm", "fp32", 2e8, 3e5),) * 10]
    tiny = (("forward", "aten.add", "fp32", 0.0, 12.0),) * 100
    op_us, slower = 9.0, 1.6  # what the steps cost: 9 us an op, the curves 1.6x slower

    def step(records) -> Measured:
        return Measured((slower * body_us(p, records) + op_us * len(records)) / 1e6, records)

    got = fit(p, step(tiny), [step(r) for r in sized])
    # the tiny step's FLOPs and bytes are priced at the curves, not at the 1.6x: a small bias
    assert got.op_us == pytest.approx(op_us, rel=0.01)
    assert got.efficiency == pytest.approx(1 / slower, rel=0.01)
    # no step slower than a bare launch per op: the op cost is at least the launch
    assert fit(p, Measured(0.0, tiny), [step(r) for r in sized]).op_us == p.launch_us


def test_the_host_profile_is_measured_once_then_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(m, "CACHE_DIR", tmp_path)
    measured = []

    def fake_measure(device, sizes=None):
        measured.append(device)
        return _profile()

    monkeypatch.setattr(m, "measure", fake_measure)
    first = m.host_profile("cpu")
    assert first == _profile() and len(measured) == 1
    path = m.cache_path("cpu")
    assert path.parent == tmp_path and path.exists()
    assert f"{torch.get_num_threads()}t" in path.name and torch.__version__ in path.name
    assert m.host_profile("cpu") == first and len(measured) == 1  # read, not measured
    path.write_text("{not json")
    assert m.host_profile("cpu") == first and len(measured) == 2
    assert "unreadable" in capsys.readouterr().err
    assert read(path) == first  # the new measurement replaced the broken file


def _ask(cache: str, log: str) -> None:
    """A rank asking for this host's profile, with a measurement that takes a while."""
    m.CACHE_DIR = Path(cache)

    def slow_measure(device, sizes=None):
        with open(log, "a") as f:
            f.write("measured\n")
        time.sleep(0.5)
        return _profile()

    m.measure = slow_measure
    assert m.host_profile("cpu") == _profile()


def test_ranks_asking_at_once_on_a_new_host_measure_once(tmp_path):
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    ranks = [ctx.Process(target=_ask, args=(str(tmp_path / "cache"), str(log))) for _ in range(3)]
    for r in ranks:
        r.start()
    for r in ranks:
        r.join(30)
    assert [r.exitcode for r in ranks] == [0, 0, 0]
    assert log.read_text() == "measured\n"  # one measured; the others read its file


def test_a_datasheet_gpu_has_the_datasheets_peaks_and_bandwidth():
    name = "NVIDIA H100 80GB HBM3"
    p = datasheet_profile(name)
    for precision in ("fp32", "bf16"):
        assert p.peak_tflops[precision] == datasheet_peak(name, precision).tflops
    assert p.peak_tflops["bf16"] == 989.5 and p.memory_GBps == 3350.0
    assert from_json(p.as_json()) == p
    assert datasheet_profile("NVIDIA GeForce RTX 4090") is None


@pytest.mark.parametrize(
    ("name", "GBps"),
    [
        ("NVIDIA A100-SXM4-80GB", 2039.0),
        ("NVIDIA A100 80GB PCIe", 1935.0),
        ("NVIDIA A100-PCIE-40GB", 1555.0),
        ("NVIDIA H100 PCIe", 2000.0),
        ("NVIDIA H200", 4800.0),
        ("NVIDIA B200", 8000.0),
        ("NVIDIA A10G", 600.0),
    ],
)
def test_the_bandwidth_is_the_variants(name, GBps):
    assert datasheet_profile(name).memory_GBps == GBps


def test_every_datasheet_gpu_has_a_bandwidth():
    named = {row.gpu for row in MEMORY}
    assert [r.gpu for r in DATASHEETS if not any(n.startswith(r.gpu) for n in named)] == []
