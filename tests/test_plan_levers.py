"""The planner's levers beyond checkpointing: ``compile`` priced by fusing the memory-bound
chains of each compiled region (``bench/plan/fusion.py``), ``precision=fp8`` by the blocks'
Linears at the float8 peak and torchao's casts; the bad input they bring."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from bench.plan import __main__ as plan_cli
from bench.plan.fusion import FUSED, compiled_regions, fused
from bench.plan.memory import Counting, step_ops
from bench.plan.op_mix import COMPUTE
from bench.plan.op_prices import Pricing, priced
from bench.roofline.datasheet import datasheet_profile
from bench.roofline.op_count import OpCounter
from tests.test_plan import space

H100 = "NVIDIA H100 80GB HBM3"


class _Chain(nn.Module):
    """x -> relu(x * 2 + 1) @ w: three elementwise ops, then a matmul."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(8, 8))

    def forward(self, x):
        return torch.relu(x * 2 + 1) @ self.w


def _counted(mode: str):
    model, x = _Chain(), torch.ones(4, 8)
    with OpCounter(flow=True) as counter, compiled_regions(model, mode, counter):
        model(x)
    return counter.records, fused(counter.records, counter.flows)


@pytest.mark.unit
def test_a_chain_of_elementwise_ops_is_one_kernel_of_its_inputs_and_outputs():
    eager, same = _counted("off")
    assert [r[1] for r in eager] == ["aten.mul", "aten.add", "aten.relu", "aten.mm"]
    assert same == tuple(eager)  # no region: nothing fused
    _, chain = _counted("model")
    assert [r[1] for r in chain] == [FUSED, "aten.mm"]
    # reads x (4x8 fp32) once, writes relu's output once, which the matmul reads
    assert chain[0][4] == 2 * 4 * 8 * 4 and chain[0][3] == 0.0
    assert chain[1] == eager[3]  # the matmul unchanged
    assert sum(r[4] for r in eager[:3]) == 6 * 4 * 8 * 4  # eager: each op reads and writes


def _mix(precision="fp32", mode="off"):
    return step_ops(Counting("llama:tiny", "off", None, precision, True, mode), 2).of(COMPUTE)


@pytest.mark.unit
def test_a_compiled_step_moves_fewer_bytes_in_fewer_launches_and_the_same_matmuls():
    pricing = Pricing(datasheet_profile(H100))
    eager = _mix()
    memory_bytes = {}
    for mode in ("off", "blocks", "model"):
        mix = _mix(mode=mode)
        memory_bytes[mode] = sum(k.nbytes * n for k, n in mix.counts.items() if k.flops == 0)
        assert mix.flops() == eager.flops()
        matmuls = {k: n for k, n in mix.counts.items() if k.flops > 0}
        assert matmuls == {k: n for k, n in eager.counts.items() if k.flops > 0}
        if mode != "off":
            assert mix.ops() < eager.ops()
            assert priced(mix, pricing).total_ms < priced(eager, pricing).total_ms
    assert memory_bytes["model"] <= memory_bytes["blocks"] < memory_bytes["off"]


@pytest.mark.unit
def test_fp8_prices_the_blocks_linears_at_the_float8_peak_plus_their_casts():
    roof = datasheet_profile(H100)
    fp8, bf16 = _mix("fp8"), _mix("bf16")
    float8 = {k: n for k, n in fp8.counts.items() if k.precision == "fp8" and k.flops > 0}
    assert float8  # the blocks' Linears' matmuls, forward and backward
    # each at the fp8 peak: its bf16 twin's time at the ratio of the peaks
    ratio = roof.peak_tflops["bf16"] / roof.peak_tflops["fp8"]
    assert ratio == pytest.approx(0.5)
    for k in float8:
        bf16_us = roof.compute_us(k.flops, "bf16")
        assert roof.compute_us(k.flops, "fp8") == pytest.approx(bf16_us * ratio)
    # torchao's casts: amax reductions and scaled casts to float8, memory-bound, beside them
    casts = {k.op for k in fp8.counts if k.flops == 0} - {k.op for k in bf16.counts}
    assert {"aten.abs", "aten.max", "aten.clamp"} <= casts
    assert sum(float8.values()) == 3 * 14  # 2 blocks x 7 Linears, forward and 2 in backward


@pytest.mark.unit
@pytest.mark.parametrize("device", ["a100", "cpu"])
def test_fp8_on_a_device_without_float8_is_one_line_and_exit_2(device, capsys, tmp_path):
    argv = ["--model", "llama:tiny", "--world-size", "2", "--global-batch", "8"]
    argv += ["--device", device, "--option", "precision=fp8", "--out", str(tmp_path / "p")]
    assert plan_cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "fp8 needs float8 matmuls: h100, h200, b200" in err and "\n" not in err
    assert "Traceback" not in err and not (tmp_path / "p").exists()


@pytest.mark.unit
def test_the_default_space_holds_no_lever_and_option_names_them():
    default = space("llama:tiny", 16, 8, 64)
    assert all("compile" not in c.knobs for c in default)
    assert {c.knobs["precision"] for c in default} == {"fp32", "bf16"}


@pytest.mark.unit
def test_a_plan_with_compile_and_fp8_writes_rows_of_each_and_ranks_them(tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["--model", "llama:tiny", "--world-size", "16", "--device", "h100"]
    argv += ["--global-batch", "64", "--family", "ddp,fsdp2", "--workers", "1"]
    argv += ["--option", "activation_checkpointing=off", "--option", "compile=off,blocks"]
    argv += ["--option", "precision=bf16,fp8", "--out", str(out)]
    assert plan_cli.main(argv) == 0
    table = capsys.readouterr().out
    assert " compile " in table and " blocks " in table  # the console's column, where named
    rows = pd.read_csv(out / "plan.csv", keep_default_na=False)
    pairs = set(zip(rows["precision"], rows["compile"], strict=True))
    assert pairs == {("bf16", "off"), ("bf16", "blocks"), ("fp8", "off"), ("fp8", "blocks")}
    assert list(rows["rank"]) == list(range(1, len(rows) + 1))
    ok = rows[rows["step_ms"].astype(str) != ""]
    assert len(ok) == len(rows)
    for _, r in rows.iterrows():
        assert ("--option=compile=blocks" in r["command"]) == (r["compile"] == "blocks")
        assert ("--option=precision=fp8" in r["command"]) == (r["precision"] == "fp8")
        if r["compile"] == "blocks":
            assert "compile=blocks: its memory-bound chains fused" in r["compute_source"]
            assert "eager's tracked memory (compile=blocks)" in r["memory_how"]
        if r["precision"] == "fp8":
            assert "fp8 tracked" in r["memory_how"]
    one = rows[rows["config"] == rows["config"].iloc[0]].set_index(["precision", "compile"])
    key = ["micro_batch", "grad_accum"]
    one = one[(one[key] == one[key].iloc[0]).all(axis=1)]
    assert (
        one.loc[("bf16", "blocks"), "memory_bound_ms"] < one.loc[("bf16", "off"), "memory_bound_ms"]
    )
    assert one.loc[("bf16", "blocks"), "op_fixed_ms"] < one.loc[("bf16", "off"), "op_fixed_ms"]
