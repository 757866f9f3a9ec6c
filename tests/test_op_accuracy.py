"""Per-op prediction (bench/analysis/op_accuracy.py): each top-level op of a small profiled
loop priced as its parts ran on a hand-made roofline, checked against FLOPs and bytes worked
out here by hand (the cold curve for an op without FLOPs that allocates, a head's matmul for
attention, the traced cost per operator dispatched), and against the trace's own durations;
nested ops and views counted once; the fastest of the steps; a trace without shapes says it
cannot price."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from bench.analysis.breakdown import load_trace
from bench.analysis.op_accuracy import NO_SHAPES, fastest_of_steps, op_accuracy, per_op, summary
from bench.roofline.profile import from_json
from bench.selftime.op_prediction import main

pytestmark = pytest.mark.unit

ROOFLINE = from_json(
    {
        "format": "parallel-bench roofline 1",
        "device": "test device",
        "source": "written by the test",
        "peak_tflops": {"fp32": 0.1},
        "memory_GBps": 50.0,
        "matmul": {"fp32": {"sizes": [1e4, 1e8], "efficiency": [0.3, 0.9]}},
        "memory": {"sizes": [1e3, 1e7], "efficiency": [0.9, 0.4]},
        "launch_us": 2.0,
        "memory_cold": {"sizes": [1e3], "efficiency": [0.25]},  # flat: 12.5 GB/s
        "traced_op_us": 0.5,
    }
)
TRACED = 0.5  # us an operator dispatched costs in the trace
STEPS = 3
N, B, K, M = 64, 16, 64, 32  # the mm's side; the linear's batch, input and output widths
F32 = 4


def _loop(path: Path, record_shapes: bool) -> Path:
    """Per step four top-level ops: a 64x64 mm, a view (t), a linear (holding t and addmm), an
    elementwise add."""
    torch.manual_seed(0)
    a, b = torch.randn(N, N), torch.randn(N, N)
    x, w, bias = torch.randn(B, K), torch.randn(M, K), torch.randn(M)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as p:
        for i in range(STEPS):
            with record_function(f"ProfilerStep#{i}"):  # the step window a schedule makes
                c = torch.mm(a, b)
                c.t()
                y = F.linear(x, w, bias)
                torch.add(c, a)
    p.export_chrome_trace(str(path))
    assert y.shape == (B, M)
    return path


@pytest.fixture(scope="module")
def accuracy(tmp_path_factory):
    path = _loop(tmp_path_factory.mktemp("shapes") / "t.json", record_shapes=True)
    return path, op_accuracy(load_trace(path), ROOFLINE)


def test_each_op_is_priced_on_its_own_flops_and_bytes(accuracy):
    _, acc = accuracy
    assert acc.unpriced == ()
    by_op = acc.calls.groupby("op")
    # 2 m k n FLOPs, the two inputs and the output read or written once; the matmuls' bytes on
    # the memory curve, the add's (no FLOPs, an allocated output) on the cold one: 12.5 GB/s
    expected = {
        "aten::mm": ROOFLINE.body_us(2 * N**3, 3 * N * N * F32, "fp32")[0],
        "aten::linear": ROOFLINE.body_us(2 * B * K * M, (B * K + M * K + M + B * M) * F32, "fp32")[
            0
        ],
        "aten::add": 3 * N * N * F32 / 12.5e3,
        "aten::t": 0.0,  # a view moves nothing
    }
    assert set(by_op.groups) == set(expected)  # linear's own t and addmm are not ops of their own
    for op, body in expected.items():
        assert by_op.size()[op] == STEPS
        rows = by_op.get_group(op)
        # plus each operator it dispatched at the traced cost: a composite priced as its parts
        assert rows["priced_us"].to_numpy() == pytest.approx(body + TRACED * rows["ops_inside"])
    kinds = acc.calls.drop_duplicates("op").set_index("op")["op_class"].to_dict()
    assert kinds == {
        "aten::mm": "matmul",
        "aten::linear": "matmul",
        "aten::add": "memory_bound",
        "aten::t": "view",
    }


def test_measured_time_is_the_ops_own_span_and_counts_what_it_dispatched(accuracy):
    path, acc = accuracy
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]
    for op in ("aten::mm", "aten::linear"):
        spans = sorted((e["dur"], e["ts"]) for e in events if e["name"] == op)
        rows = acc.calls[acc.calls["op"] == op].sort_values("measured_us")
        assert rows["measured_us"].tolist() == pytest.approx([d for d, _ in spans])
        inside = [sum(ts <= e["ts"] < ts + d for e in events) for d, ts in spans]
        assert rows["ops_inside"].tolist() == inside
    assert (acc.calls.loc[acc.calls["op"] == "aten::linear", "ops_inside"] >= 3).all()


def test_the_tables_aggregate_the_calls_time_weighted():
    calls = pd.DataFrame(
        {
            "op": ["aten::mm", "aten::mm", "aten::bmm", "aten::add"],
            "op_class": ["matmul", "matmul", "matmul", "memory_bound"],
            "measured_us": [100.0, 100.0, 250.0, 10.0],
            "priced_us": [110.0, 80.0, 230.0, 14.0],
            "ops_inside": [1, 1, 1, 1],
        }
    )
    calls["error_pct"] = 100 * (calls["priced_us"] / calls["measured_us"] - 1)
    s = summary(calls).set_index("op_class")
    assert s.loc["matmul", "error_pct"] == pytest.approx(100 * (420 / 450 - 1))
    assert s.loc["matmul", "median_abs_error_pct"] == pytest.approx(10.0)  # of 10, 20, 8
    assert s.loc["matmul", "within_target_pct"] == pytest.approx(100 * 2 / 3)  # within 15 %
    assert s.loc["memory_bound", "within_target_pct"] == 0.0  # 40 % off, target 30 %
    ops = per_op(calls).set_index("op")
    assert ops.loc["aten::mm", "calls"] == 2
    assert ops.loc["aten::mm", "error_pct"] == pytest.approx(100 * (190 / 200 - 1))
    assert list(ops.index) == ["aten::bmm", "aten::mm", "aten::add"]  # most time first


def test_a_trace_without_shapes_says_it_cannot_price(tmp_path):
    acc = op_accuracy(load_trace(_loop(tmp_path / "t.json", record_shapes=False)), ROOFLINE)
    assert acc.unpriced == (NO_SHAPES,)
    assert acc.calls.empty and acc.ops.empty and acc.summary.empty


def test_the_command_refuses_a_bad_profile_in_one_line(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text('{"format": "nope"}')
    with pytest.raises(SystemExit) as e:
        main(["--device-profile", str(bad)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


def test_an_elementwise_function_is_priced_at_its_rate_where_that_is_longer(tmp_path):
    """A profile's math rates price the functions it names by their elements, also inside an
    outer op (log_softmax holds _log_softmax), where that is longer than their bytes; an add
    it does not name stays priced by its bytes."""
    rates = {"aten::tanh": 0.01, "aten::_log_softmax": 0.02, "aten::add": 1e6}
    roof = from_json({**ROOFLINE.as_json(), "math_Gelems": rates})
    x = torch.randn(N, N)
    y = x.clone()
    cpu = [ProfilerActivity.CPU]
    with profile(activities=cpu, record_shapes=True) as p, record_function("ProfilerStep#0"):
        torch.tanh(x)
        torch.log_softmax(x, dim=-1)
        torch.add(x, x)
        y.add_(x)
    p.export_chrome_trace(str(tmp_path / "t.json"))
    calls = op_accuracy(load_trace(tmp_path / "t.json"), roof).calls.set_index("op")
    elements_us = {op: N * N / (rate * 1e3) for op, rate in rates.items()}
    launches = TRACED * calls["ops_inside"]
    assert calls.loc["aten::tanh", "priced_us"] == pytest.approx(
        elements_us["aten::tanh"] + launches["aten::tanh"]
    )
    assert calls.loc["aten::log_softmax", "priced_us"] == pytest.approx(
        elements_us["aten::_log_softmax"] + launches["aten::log_softmax"]
    )
    assert set(calls.loc[["aten::tanh", "aten::log_softmax"], "bound"]) == {"math"}
    add = roof.memory_us(3 * N * N * F32, cold=True) + launches["aten::add"]
    assert (calls.loc["aten::add", "priced_us"], calls.loc["aten::add", "bound"]) == (
        pytest.approx(add),
        "memory",
    )
    # in place, it allocates nothing: its bytes on the memory curve, not the cold one
    in_place = roof.memory_us(3 * N * N * F32) + launches["aten::add_"]
    assert calls.loc["aten::add_", "priced_us"] == pytest.approx(in_place)
    assert in_place < add
    # without rates, the same calls are priced by their bytes alone
    plain = op_accuracy(load_trace(tmp_path / "t.json"), ROOFLINE).calls.set_index("op")
    assert plain.loc["aten::tanh", "priced_us"] < calls.loc["aten::tanh", "priced_us"]


def test_attention_is_priced_as_head_sized_matmuls_and_its_softmax(tmp_path):
    """Its FLOPs (torch's 4 b h s^2 d) at the efficiency of one head's 2 s^2 d matmul, plus
    the b h s^2 scores exponentiated at the profile's exp rate, plus its operators."""
    b, h, s, d = 2, 2, 16, 8
    roof = from_json({**ROOFLINE.as_json(), "math_Gelems": {"aten::exp": 0.5}})
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    cpu = [ProfilerActivity.CPU]
    with profile(activities=cpu, record_shapes=True) as p, record_function("ProfilerStep#0"):
        F.scaled_dot_product_attention(q, k, v)
    p.export_chrome_trace(str(tmp_path / "t.json"))
    calls = op_accuracy(load_trace(tmp_path / "t.json"), roof).calls.set_index("op")
    row = calls.loc["aten::scaled_dot_product_attention"]
    assert row["flops"] == 4 * b * h * s * s * d
    head = 0.1e6 * 0.3  # FLOPs a us: a 2 s^2 d = 4 kFLOP matmul is below the curve's 0.3 end
    softmax = b * h * s * s / 0.5e3
    assert row["priced_us"] == pytest.approx(
        row["flops"] / head + softmax + TRACED * row["ops_inside"]
    )
    assert row["bound"] == "compute"


def test_fastest_of_steps_keeps_each_ops_fastest_call(accuracy):
    _, acc = accuracy
    fast = fastest_of_steps(acc.calls)
    assert len(fast) == len(acc.calls) // STEPS and (fast["step"] == acc.calls["step"].min()).all()
    for op, rows in acc.calls.groupby("op"):
        assert fast.loc[fast["op"] == op, "measured_us"].min() == rows["measured_us"].min()
    assert (fast["error_pct"] == 100 * (fast["priced_us"] / fast["measured_us"] - 1)).all()
    ragged = acc.calls.iloc[:-1]  # the last step one op short: left as it is
    assert fastest_of_steps(ragged).equals(ragged)
