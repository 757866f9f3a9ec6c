"""The MFU waterfall (bench/analysis/waterfall.py) on traces the suite did not write: a plain
``torch.profiler`` loop over a tiny MLP made here, and HolisticTraceAnalysis's GPU traces.
Each figure is checked against a computation of its own: the parts against the step window,
the matmul FLOPs against FlopCounterMode's count of the same step, the memory-bound ops'
bytes against the real tensors a dispatch mode sees."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from bench.analysis.__main__ import main
from bench.analysis.breakdown import load_trace
from bench.analysis.op_costs import cost
from bench.analysis.waterfall import PARTS, waterfall
from bench.roofline.profile import from_json
from tests.profiled_loop import model, profiled, train_step

pytestmark = pytest.mark.unit

HTA = Path(__file__).parent / "data" / "hta"
PROFILE = {
    "format": "parallel-bench roofline 1",
    "device": "test device",
    "source": "written by the test",
    "peak_tflops": {"fp32": 50.0},
    "memory_GBps": 100.0,
    "matmul": {"fp32": {"sizes": [1e3, 1e9], "efficiency": [0.5, 0.9]}},
    "memory": {"sizes": [1e3, 1e8], "efficiency": [0.5, 0.9]},
    "launch_us": 1.0,
}
ROOFLINE = from_json(PROFILE)


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> Path:
    return profiled(tmp_path_factory.mktemp("shapes"), record_shapes=True)


@pytest.fixture(scope="module")
def cpu_waterfall(cpu_trace):
    return waterfall(load_trace(cpu_trace), ROOFLINE)


def _closure(steps) -> float:
    """max |sum of the parts - step| / step, the parts summed here, not taken from sum_us."""
    parts = ["matmul_us", *(f"{p}_us" for p in PARTS if p not in ("ideal", "matmul_loss"))]
    total = steps[parts].sum(axis=1)
    return float(((total - steps["step_us"]).abs() / steps["step_us"]).max())


def test_parts_add_up_to_each_step(cpu_waterfall):
    steps = cpu_waterfall.steps
    assert len(steps) == 3
    assert _closure(steps) < 0.01
    assert (steps["closure_pct"].abs() < 1).all()
    # the matmul time splits into its FLOPs at the peak and the rest
    assert ((steps["ideal_us"] + steps["matmul_loss_us"] - steps["matmul_us"]).abs() < 1e-6).all()
    assert (steps["optimizer_us"] > 0).all() and (steps["memory_bound_us"] > 0).all()
    assert (steps["mfu_pct"] - 100 * steps["ideal_us"] / steps["step_us"]).abs().max() < 1e-9


def test_matmul_flops_are_flop_counter_modes(cpu_waterfall):
    m, opt, x = model()
    with FlopCounterMode(display=False) as counter:
        train_step(m, opt, x)
    assert counter.get_total_flops() > 0
    # the same FLOPs, summed in another order
    assert cpu_waterfall.steps["model_flops"].to_numpy() == pytest.approx(
        counter.get_total_flops(), rel=1e-12
    )
    ideal = counter.get_total_flops() / (PROFILE["peak_tflops"]["fp32"] * 1e6)
    assert cpu_waterfall.steps["ideal_us"].to_numpy() == pytest.approx(ideal)


class _Bytes(TorchDispatchMode):
    """Each op's bytes from the real tensors: inputs, and outputs whose storage is no input's
    (an in-place op's output counts: it is written)."""

    def __init__(self):
        super().__init__()
        self.seen: dict[tuple, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if torch.is_tensor(a)]
        outs = [o for o in torch.utils._pytree.tree_leaves(out) if torch.is_tensor(o)]
        storages = {t.untyped_storage().data_ptr() for t in ins}
        written = func._schema.is_mutable
        moved = sum(t.nbytes for t in ins) + sum(
            o.nbytes for o in outs if written or o.untyped_storage().data_ptr() not in storages
        )
        key = (f"aten::{func._schema.name.split('::')[1]}", tuple(tuple(t.shape) for t in ins))
        self.seen[key] = moved
        return out


def test_memory_bound_bytes_are_their_tensors(cpu_trace):
    m, opt, x = model()
    with _Bytes() as mode:
        train_step(m, opt, x)
    events = load_trace(cpu_trace).events
    checked = 0
    for name in ("aten::gelu", "aten::gelu_backward", "aten::native_layer_norm_backward"):
        for shapes in events.loc[events["name"] == name, "shapes"].astype(str).unique():
            dims = json.loads(shapes)[0]
            key = (name, tuple(tuple(d) for d in dims if isinstance(d, list) and d))
            assert cost(name, shapes).nbytes == mode.seen[key], name
            checked += 1
    assert checked >= 3


def test_recomputed_ops_are_their_own_part(tmp_path):
    torch.manual_seed(0)
    inner, head = nn.Linear(32, 32), nn.Linear(32, 8)
    x = torch.randn(8, 32)
    with (
        profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p,
        torch.profiler.record_function("ProfilerStep#1"),  # the step window a schedule makes
    ):
        y = checkpoint(lambda t: torch.relu(inner(t)), x, use_reentrant=False)
        head(y).sum().backward()
    p.export_chrome_trace(str(tmp_path / "ck.json"))
    w = waterfall(load_trace(tmp_path / "ck.json"), ROOFLINE)
    assert (w.steps["recompute_us"] > 0).all()
    assert _closure(w.steps) < 0.01
    recomputed = set(w.classes.loc[w.classes["part"] == "recompute", "op"])
    assert recomputed <= {"aten::linear", "aten::relu"} and recomputed


def test_a_trace_without_shapes_says_what_it_cannot_price(tmp_path, capsys):
    folder = tmp_path / "noshapes"
    trace = profiled(folder, record_shapes=False)
    w = waterfall(load_trace(trace), ROOFLINE)
    assert w.steps["ideal_us"].isna().all() and w.steps["mfu_pct"].isna().all()
    assert (w.steps["matmul_us"] > 0).all() and _closure(w.steps) < 0.01
    assert any("no shapes" in u for u in w.unpriced)
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(PROFILE))
    assert main([str(folder), "--mfu", "--device-profile", str(profile_file)]) == 0
    out = capsys.readouterr()
    assert "no shapes" in out.err and "MFU not priced" in out.out


def test_cli_json_and_a_bad_profile(cpu_trace, tmp_path, capsys):
    profile_file = tmp_path / "profile.json"
    profile_file.write_text(json.dumps(PROFILE))
    folder = str(cpu_trace.parent)
    assert main([folder, "--mfu", "--device-profile", str(profile_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["waterfall"]) == 3 and out["op_classes"]
    profile_file.write_text(json.dumps(PROFILE | {"peak_tflops": {"fp7": 1.0}}))
    assert main([folder, "--mfu", "--device-profile", str(profile_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert "fp7" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "files", [("sampled_rank-0.json.gz", "sampled_rank-1.json.gz"), ("nccl_data.json.gz",)]
)
def test_gpu_traces_add_up(files):
    for f in files:
        w = waterfall(load_trace(HTA / f), ROOFLINE)
        assert len(w.steps) >= 2
        assert _closure(w.steps) < 0.01, f
        shapes = f.startswith("sampled")
        assert w.steps["model_flops"].gt(0).all() if shapes else w.steps["ideal_us"].isna().all()
        assert not math.isnan(w.steps["exposed_comm_us"].sum())
