"""The ``compile`` knob: its modes read and refused in one line, blocks compiled in place, a
compiler-less host refused before any rank trains, and at 2 ranks each mode's first step
checked against the plain model with its compile time apart from its timed steps, and a point
the C++ compiler fails on an error row with the compiler's first line."""

import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bench.runner.cli import main
from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from bench.runner.train import plain_compare
from bench.runner.train.candidate import Candidate
from bench.runner.train.lifecycle import compile_figures, run_point
from parallel_kernels import compiling
from parallel_kernels.compiling import compile_blocks, compile_wrapped, compiled_frames
from parallel_kernels.knobs import KNOBS
from parallel_kernels.models import MLP, build_model, workload
from tests.test_harness import FAST, pool_env

# The smallest model with blocks: two SwiGLU blocks of width 32 over 8 tokens.
TINY = "tests/data/models/plain_check_models.py:swiglu"
# Two warm-up steps (compile_seconds is the first less the last), the fewest timed and traced.
STEPS = {"warmup_steps": 2, "steps": 2, "profile_steps": 1}


@pytest.mark.unit
@pytest.mark.parametrize("text,mode", [("off", "off"), ("Blocks", "blocks"), (" model ", "model")])
def test_the_knob_reads_each_mode(text, mode):
    assert KNOBS["compile"].parse(text) == mode
    assert KNOBS["compile"].default == "off"


def _one_line_exit_2(args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*args, "--nproc-per-node", "2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.unit
@pytest.mark.usefixtures("no_torchrun")
def test_an_unknown_mode_is_one_line_and_exit_2(capsys):
    message = "'fast' is not a compile mode (off, blocks, model)"
    _one_line_exit_2(["--sweep", "compile", "--values", "fast"], message, capsys)
    _one_line_exit_2(["--sweep", "grad_accum", "--option", "compile=fast"], message, capsys)


@pytest.mark.unit
@pytest.mark.usefixtures("no_torchrun")
def test_no_cpp_compiler_is_one_line_and_exit_2_before_any_rank(monkeypatch, capsys):
    """Torch's own search for inductor's C++ compiler failing (as on a host without g++)."""
    from torch._inductor import cpp_builder, exc

    def missing():
        raise exc.InvalidCxxCompiler

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    compiling.cpp_compiler_missing.cache_clear()
    try:
        message = "compile=blocks: inductor found no working C++ compiler for the CPU"
        _one_line_exit_2(["--sweep", "compile", "--values", "off,blocks"], message, capsys)
        _one_line_exit_2(["--sweep", "grad_accum", "--option", "compile=blocks"], message, capsys)
        assert KNOBS["compile"].parse("off") == "off"  # eager needs no compiler
    finally:
        compiling.cpp_compiler_missing.cache_clear()


@pytest.mark.unit
def test_blocks_compile_in_place_and_what_cannot_be_compiled_is_refused():
    model = build_model(TINY, seed=0)
    names = [n for n, _ in model.named_modules()]
    compile_blocks(model, "blocks")
    assert [n for n, _ in model.named_modules()] == names  # FSDP units and TP plans find them
    assert all(b._compiled_call_impl is not None for b in model.blocks)
    assert model._compiled_call_impl is None
    assert compile_blocks(MLP(), "off") is not None  # off asks nothing of a blockless model
    with pytest.raises(ValueError, match="compile=blocks compiles each block; MLP has none"):
        compile_blocks(MLP(), "blocks")
    with pytest.raises(ValueError, match="a pipeline steps by its schedule"):
        compile_wrapped(nn.Linear(2, 2), "model", scheduled=True)
    assert compile_wrapped(nn.Linear(2, 2), "blocks", scheduled=True)._compiled_call_impl is None


@pytest.mark.unit
def test_a_compiled_point_is_checked_at_the_compiled_tolerance():
    points = build_points(RunConfig(sweep="compile", model=TINY, impl="native"), world_size=2)
    tolerances = {p.value: plain_compare.tolerance_for(p) for p in points}
    assert tolerances == {
        "off": plain_compare.FP32,
        "blocks": plain_compare.COMPILED,
        "model": plain_compare.COMPILED,
    }
    assert plain_compare.COMPILED.loss_rtol > plain_compare.FP32.loss_rtol


def _compiled_points(points, root: str, cache: str) -> tuple[list[dict], int]:
    """On each rank: the points' rows, and the frames dynamo compiled. The ranks share one
    inductor cache (as a host's do by default), each compiling in its own process: a pool of
    compile workers would start a torch of its own per worker."""
    import torch._inductor.config as inductor

    was = os.environ.get("TORCHINDUCTOR_CACHE_DIR"), inductor.compile_threads
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    inductor.compile_threads = 1
    try:
        before = compiled_frames()
        _compile_on_rank_0_first(points[0].model, Path(cache))
        rows = [
            run_point(replace(p, **STEPS), pool_env(), FAST, Path(root) / p.id).as_dict()
            for p in points
        ]
        frames = torch.tensor(compiled_frames() - before)
    finally:  # the pool's ranks go on to other files' tests
        if was[0] is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = was[0]
        inductor.compile_threads = was[1]
    dist.all_reduce(frames, op=dist.ReduceOp.MIN)
    return rows, int(frames)


def _compile_on_rank_0_first(model_name: str, cache: Path) -> None:
    """Rank 0 compiles a block's graph (the same inside DDP) while rank 1 waits, so that rank
    1 finds it in the shared cache rather than compiling it at the same time. Rank 1 waits on
    a file: a loaded host may take longer than the group's timeout."""
    done = cache / "rank0-compiled"
    if dist.get_rank() == 0:
        wl = workload(model_name)
        x, y = wl.batch(4, 0)
        model = compile_blocks(build_model(model_name, seed=0), "blocks")
        wl.compute_loss(wl.forward(model, x), y).backward()
        done.touch()
    deadline = time.monotonic() + 240
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    dist.barrier()


@pytest.fixture(scope="module")
def ranks(pool, tmp_path_factory):
    """The file's one pool call at 2 ranks: both compiling modes under DDP, on the tiny model
    (eager's check is every other sweep's)."""
    config = RunConfig(
        sweep="compile", values="blocks,model", model=TINY, impl="native", batch_size=4
    )
    points = build_points(config, world_size=2)
    root = tmp_path_factory.mktemp("compiling")
    return pool(2).run(_compiled_points, points, str(root), str(root / "inductor"), timeout=300)[0]


@pytest.mark.ranks
@pytest.mark.timeout(320)
def test_every_mode_matches_the_plain_model_with_its_compile_time_apart(ranks):
    rows, frames = ranks
    assert frames >= 2, frames  # the blocks' frame, the model's
    by = {r["value"]: r for r in rows}
    assert sorted(by) == ["blocks", "model"], by
    for mode, r in by.items():
        assert r["status"] == "ok", (mode, r["error"])
        assert r["compile"] == mode
        assert not r["error"], (mode, r["error"])  # nothing compiled in the timed steps
        assert r["checked"].startswith("ok (compiled tolerance"), (mode, r["checked"])
        # compiling takes far longer than a step of the tiny model; eager's first step does not
        assert r["compile_seconds"] > 10 * r["step_ms_median"] / 1e3, r


@pytest.mark.unit
def test_a_compilation_in_the_timed_steps_is_said_in_the_row():
    blocks, off = build_points(
        RunConfig(sweep="compile", values="blocks,off", model=TINY, impl="native"), world_size=2
    )
    c = Candidate(point=blocks, trace_dir=Path("."), compile_s=1.5, recompiled=2)
    assert compile_figures(c) == {
        "compile_seconds": 1.5,
        "error": "warning: dynamo compiled 2 frame(s) during the timed steps (a "
        "recompilation): their times include it",
    }
    assert compile_figures(replace(c, recompiled=0)) == {"compile_seconds": 1.5}
    assert compile_figures(replace(c, point=off, recompiled=2)) == {}  # eager: nothing to say


# A C++ compiler that passes inductor's check of the compiler and fails on every kernel.
FAILING_CXX = """#!/bin/sh
for a in "$@"; do case "$a" in *.cpp) echo "fakecc: error: no kernel today" >&2; exit 1;; esac; done
exec g++ "$@"
"""


def _failing_compile(point, root: str) -> dict:
    """The point with inductor's compiler failing on its kernels: dynamo's caches cleared
    before (so that the blocks compiled by earlier tests are compiled again) and after."""
    import torch._dynamo
    import torch._inductor.config as inductor

    cxx = Path(root) / f"cxx{dist.get_rank()}"
    cxx.write_text(FAILING_CXX)
    cxx.chmod(0o755)
    was = inductor.cpp.cxx, inductor.fx_graph_cache, inductor.compile_threads
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(root) / f"cache{dist.get_rank()}")
    inductor.cpp.cxx, inductor.fx_graph_cache, inductor.compile_threads = (str(cxx),), False, 1
    torch._dynamo.reset()
    try:
        return run_point(replace(point, **STEPS), pool_env(), FAST, Path(root) / "p").as_dict()
    finally:
        inductor.cpp.cxx, inductor.fx_graph_cache, inductor.compile_threads = was
        if cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        torch._dynamo.reset()


@pytest.mark.ranks
@pytest.mark.timeout(200)
def test_a_point_the_compiler_fails_on_is_an_error_row_with_the_compilers_line(
    pool, tmp_path, ranks
):
    (point,) = build_points(
        RunConfig(sweep="compile", values="blocks", model=TINY, impl="native", batch_size=4),
        world_size=2,
    )
    row = pool(2).run(_failing_compile, point, str(tmp_path), timeout=180)[0]
    assert row["status"] == "error", row
    # the failing rank's line: the compiler's first line, not its command and whole output
    assert re.fullmatch(
        r"rank \d: InductorError: CppCompileError: C\+\+ compile error: "
        r"fakecc: error: no kernel today",
        row["error"],
    ), row["error"]
