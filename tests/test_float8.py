"""precision=fp8: the blocks' Linears float8 through torchao (emulated on this CPU), checked
against the plain model with the same conversion and against fp32; refused in one line without
torchao, on a GPU without float8 and with tensor parallelism."""

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

import parallel_kernels.float8 as float8
from bench.runner.cli import main
from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from bench.runner.train.lifecycle import PointSettings, run_point
from parallel_kernels.knobs import KNOBS
from parallel_kernels.models import build_model
from tests.test_harness import FAST, pool_env

torchao = pytest.importorskip("torchao.float8.float8_linear", reason="torchao is the fp8 extra")
CPU = torch.device("cpu")


def _float8_linears(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, torchao.Float8Linear)]


@pytest.mark.unit
def test_the_filter_takes_the_blocks_linears_and_leaves_the_head():
    model = build_model("transformer", seed=0)
    model.blocks[0].fc1 = nn.Linear(256, 1000)  # 1000: not a multiple of 16
    keep = float8.block_linears(model)
    picked = {n for n, m in model.named_modules() if keep(m, n)}
    assert "head" not in picked and "blocks.0.fc1" not in picked
    assert "blocks.0.fc2" in picked and "blocks.3.q" in picked
    assert all(isinstance(m, nn.Linear) for n, m in model.named_modules() if n in picked)
    float8.convert_blocks(model, CPU)
    assert len(_float8_linears(model)) == 4 * 6 - 1  # 6 Linears a block, 4 blocks
    assert type(model.head) is nn.Linear and type(model.blocks[0].fc1) is nn.Linear


class ConvBlocks(nn.Module):
    """Blocks without Linears, as GPT-2's (transformers' ``Conv1D``), and a Linear head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Conv1d(16, 16, 1), nn.Conv1d(16, 16, 1)])
        self.head = nn.Linear(16, 16)


@pytest.mark.unit
def test_a_model_without_linears_in_its_blocks_is_refused():
    with pytest.raises(ValueError, match=r"ConvBlocks has no nn\.Linear in its blocks"):
        float8.convert_blocks(ConvBlocks(), CPU)


@pytest.mark.unit
def test_the_knob_and_the_matmul_precision():
    assert KNOBS["precision"].parse("FP8") == "fp8"
    assert float8.matmul_precision({"precision": "fp8"}) == "fp8"
    assert float8.matmul_precision({"precision": "fp32", "mixed_precision": "bf16"}) == "bf16"
    assert float8.matmul_precision({"precision": "fp32", "mixed_precision": "none"}) == "fp32"
    points = build_points(
        RunConfig(sweep="precision", values="fp8", strategy="fsdp", impl="native"), world_size=2
    )
    # fp8 is neither autocast nor FSDP's mixed precision: the rest of the model stays fp32
    assert points[0].autocast is None and points[0].knobs["mixed_precision"] == "none"


def _exit_2(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err


def _no_torchao():
    raise ImportError("No module named 'torchao'")


@pytest.mark.unit
def test_without_torchao_it_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setattr(float8, "_torchao", _no_torchao)
    assert "pip install 'parallel-bench[fp8]'" in float8.torchao_missing()
    with pytest.raises(ValueError, match=r"torchao==0\.18\.0"):
        float8.convert_blocks(build_model("transformer", seed=0), CPU)
    argv = ["--sweep", "precision", "--values", "fp8", "--nproc-per-node", "2"]
    assert "parallel-bench[fp8]" in _exit_2(argv, capsys)
    # a sweep where not every point is fp8 starts: the fp8 points are error rows (below)
    assert build_points(RunConfig(sweep="precision", values="fp32,fp8"), world_size=2)


@pytest.mark.unit
def test_a_gpu_without_float8_and_tensor_parallelism_are_refused(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(ValueError, match=r"A100 \(compute capability 8.0\) has no float8"):
        float8.emulates(torch.device("cuda", 0))
    argv = ["--sweep", "precision", "--values", "fp8", "--nproc-per-node", "2"]
    assert "needs 8.9 or later" in _exit_2(argv, capsys)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert not float8.emulates(torch.device("cuda", 0)) and float8.emulates(CPU)
    argv += ["--strategy", "tp", "--option", "tp_degree=2"]
    assert "float8 TP styles" in _exit_2(argv, capsys)


# The fewest steps a row has all its figures from: the warm-up step the plain model checks, two
# timed, one traced (the file's CPU time: tests/test_harness.py's FAST_STEPS take a third more).
STEPS = {"warmup_steps": 1, "steps": 2, "profile_steps": 1}


def _run(points, root: str, cfg: PointSettings) -> list[dict]:
    return [
        run_point(dataclasses.replace(p, **STEPS), pool_env(), cfg, Path(root) / p.id).as_dict()
        for p in points
    ]


def _rows(points, missing, root: str) -> tuple[list[dict], list[dict]]:
    """On each rank: the fp8 points' rows, then ``missing``'s with torchao made unimportable."""
    rows = _run(points, root, FAST)
    float8._torchao, kept = _no_torchao, float8._torchao
    try:
        return rows, _run(missing, root, dataclasses.replace(FAST, point_timeout_s=10.0))
    finally:
        float8._torchao = kept


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_fp8_ddp_and_fsdp2_match_the_plain_model(pool, tmp_path):
    points = [
        p
        for strategy in ("ddp", "fsdp")
        for p in build_points(
            RunConfig(
                sweep="precision",
                values="fp8",
                model="llama:tiny",
                strategy=strategy,
                impl="native",
                batch_size=2,
            ),
            world_size=2,
        )
    ]
    missing = [dataclasses.replace(points[0], id=points[0].id + "-missing")]
    rows, failed = pool(2).run(_rows, points, missing, str(tmp_path), timeout=280)[0]
    assert {r["strategy"] for r in rows} == {"ddp", "fsdp"}
    for r in rows:
        assert r["status"] == "ok", r["error"]
        # the plain model with the same conversion, then the plain float8 step near fp32's
        assert r["checked"].startswith("ok (reduced-precision tolerance"), r["checked"]
        assert "; fp8 against fp32 ok (fp8-near-fp32 tolerance" in r["checked"], r["checked"]
        assert r["matmul_precision"] == "fp8" and r["untimed"] == float8.EMULATED
        assert r["peak_mem_mb"] > 0
    (row,) = failed
    assert row["status"] == "error" and "pip install 'parallel-bench[fp8]'" in row["error"]
    assert row["matmul_precision"] == "fp8"
