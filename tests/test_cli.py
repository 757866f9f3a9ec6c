"""Bad input: one clear line, exit status 2, no traceback, nothing overwritten."""

import subprocess
import sys
from pathlib import Path

import pytest

from bench.runner.cli import main

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("no_torchrun")  # every test here (tests/conftest.py)


def run_main(args, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    return exc.value.code, err


@pytest.mark.unit
@pytest.mark.parametrize(
    "args,message",
    [
        (["--sweep", "nope"], "unknown sweep 'nope'"),
        (["--sweep", "bucket_cap_mb", "--values", "-1"], "must be a positive number"),
        (["--sweep", "bucket_cap_mb", "--values", "0"], "must be a positive number"),
        (["--sweep", "bucket_cap_mb", "--values", "1,abc"], "'abc' is not a number"),
        (["--sweep", "bucket_cap_mb", "--values", "nan"], "'nan' is not a finite number"),
        (["--sweep", "bucket_cap_mb", "--values", ","], "empty value list"),
        (["--sweep", "bucket_cap_mb", "--model", "resnet"], "unknown model 'resnet'"),
        (["--sweep", "bucket_cap_mb", "--impl", "native,fast"], "unknown implementation fast"),
        (["--sweep", "bucket_cap_mb", "--steps", "0"], "must be at least 1"),
        (["--sweep", "bucket_cap_mb", "--nproc-per-node", "x"], "is not an integer"),
        (["--values", "1"], "the following arguments are required: --sweep"),
        (["--sweep", "bucket_cap_mb", "--resume"], "--resume needs --out"),
        (["--sweep", "bucket_cap_mb"], "not launched by torchrun"),
        (
            ["--sweep", "sharding_strategy", "--values", "FULL_SHARD,ZERO4"],
            "'ZERO4' is not a sharding strategy",
        ),
        (["--sweep", "sharding_strategy", "--impl", "deepspeed"], "unknown implementation"),
        (["--sweep", "bucket_cap_mb,bucket_cap_mb"], "a grid names bucket_cap_mb twice"),
        (["--sweep", "tp_degree,mesh", "--nproc-per-node", "4"], "sets the knob tp_degree twice"),
        (["--sweep", "bucket_cap_mb,sharding_strategy"], "has no one strategy"),
        (["--sweep", "bucket_cap_mb,world_size"], "a grid crosses training sweeps"),
        (["--sweep", "bucket_cap_mb,precision,grad_accum"], "crosses two sweeps, not 3"),
        (["--sweep", "bucket_cap_mb", "--values2", "1"], "--values2 is for a grid"),
        (["--sweep", "bucket_cap_mb", "--option", "comm_hook=zip"], "'zip' is not a comm hook"),
        (["--sweep", "precision", "--option", "precision=bf16"], "use --values"),
        (
            ["--sweep", "sharding_strategy", "--option", "bucket_cap_mb=5"],
            "unknown option 'bucket_cap_mb'",
        ),
        (["--sweep", "sharding_strategy", "--option", "bf16"], "is not KEY=VALUE"),
        (["--sweep", "bucket_cap_mb", "--option", "bucket_cap_mb=5"], "use --values"),
        (["--sweep", "message_size", "-b", "abc"], "'abc' is not a number of bytes"),
        (["--sweep", "message_size", "-b", "2M", "-e", "1M"], "larger than max bytes"),
        (["--sweep", "message_size", "-f", "1"], "factor must be at least 2"),
        (["--sweep", "message_size", "-f", "x"], "factor 'x' is not an integer"),
        (
            ["--sweep", "message_size", "--collectives", "all_reduce,gossip"],
            "unknown collective gossip",
        ),
        (["--sweep", "message_size", "-d", "int8"], "unknown dtype 'int8'"),
        (["--sweep", "message_size", "-o", "min"], "unknown reduction 'min'"),
        (["--sweep", "message_size", "-c", "2"], "invalid choice"),
        (["--sweep", "message_size", "-n", "0"], "must be at least 1"),
        (["--sweep", "bucket_cap_mb", "--target-ci-pct", "0"], "'0' must be positive"),
        (["--sweep", "bucket_cap_mb", "--target-ci-pct", "-2"], "'-2' must be positive"),
        (["--sweep", "bucket_cap_mb", "--rounds", "0"], "'0' must be at least 1"),
        (["--sweep", "bucket_cap_mb", "--max-point-s", "0"], "'0' must be positive"),
        (
            ["--sweep", "bucket_cap_mb", "--steps", "2", "--warmup-steps", "5", "--max-steps", "3"],
            "--max-steps 3 is smaller than the warm-up (5 steps)",
        ),
        (["--sweep", "bucket_cap_mb", "--max-steps", "4"], "--max-steps 4 is less than --steps 10"),
        (["--sweep", "message_size", "--rounds", "2"], "--rounds is for training sweeps"),
        (["--sweep", "message_size", "--impl", "nccl"], "unknown implementation nccl"),
        (["--sweep", "message_size"], "not launched by torchrun"),
        (["--sweep", "tp_degree"], "not launched by torchrun"),
        (["--sweep", "world_size"], "not launched by torchrun"),
        (
            ["--sweep", "world_size", "--values", "1,8", "--nproc-per-node", "4"],
            "world size 8 is larger than the 4 ranks launched",
        ),
        (
            ["--sweep", "world_size", "--strategy", "zero", "--nproc-per-node", "2"],
            "unknown strategy 'zero'",
        ),
        (
            ["--sweep", "world_size", "--scaling", "linear", "--nproc-per-node", "2"],
            "unknown scaling linear",
        ),
        (["--sweep", "bucket_cap_mb", "--strategy", "fsdp"], "is for the world_size sweep"),
        (["--sweep", "grad_accum", "--values", "0"], "must be a positive integer"),
        (["--sweep", "grad_accum", "--strategy", "zero"], "unknown strategy 'zero'"),
        (
            ["--sweep", "tp_degree", "--values", "1,3", "--nproc-per-node", "4"],
            "TP degree 3 does not divide the world size 4",
        ),
        (["--sweep", "tp_degree", "--values", "0", "--nproc-per-node", "2"], "positive integer"),
        (
            ["--sweep", "mesh", "--values", "fsdp_tp", "--nproc-per-node", "2"],
            "needs a TP degree of 2 or more that divides the world size 2",
        ),
        (["--sweep", "mesh", "--values", "zigzag", "--nproc-per-node", "4"], "not a mesh layout"),
        (
            ["--sweep", "mesh", "--option", "tp_degree=2", "--nproc-per-node", "4"],
            "use --values",
        ),
        (["--sweep", "bucket_cap_mb", "--budget", "0"], "'0' is not a duration"),
        (["--sweep", "bucket_cap_mb", "--budget", "ten minutes"], "is not a duration"),
        (["--sweep", "message_size", "--budget", "10m"], "--budget is for training sweeps"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code, err = run_main(args, capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.unit
def test_existing_results_are_not_overwritten(tmp_path, capsys):
    csv = tmp_path / "results.csv"
    csv.write_text("sweep,value\nbucket_cap_mb,1\n")
    code, err = run_main(
        ["--sweep", "bucket_cap_mb", "--out", str(tmp_path), "--nproc-per-node", "2"], capsys
    )
    assert code == 2 and "already holds results" in err and "--resume" in err
    assert csv.read_text() == "sweep,value\nbucket_cap_mb,1\n"


@pytest.mark.e2e
def test_no_traceback_from_a_real_process():
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "run.py"),
            "--sweep",
            "bucket_cap_mb",
            "--values",
            "-3",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "error: bad value for --sweep bucket_cap_mb: '-3' must be a "
        "positive number"
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.e2e
def test_under_torchrun_rank_0s_line_is_out_though_another_rank_fails_first(tmp_path):
    # Rank 1 meets the error at once, rank 0 three seconds later (a slow import under load):
    # had rank 1 left first, torchrun would have ended rank 0 before its line was out.
    script = tmp_path / "both_fail.py"
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from bench.console import fail\n"
        "if os.environ['RANK'] == '0':\n"
        "    time.sleep(3)\n"
        "fail('the folder already holds results')\n"
    )
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node=2", str(script)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "error: the folder already holds results" in proc.stderr, proc.stderr[-2000:]
    assert "(rank 1)" not in proc.stderr  # rank 1 waited, and torchrun ended it


@pytest.mark.unit
def test_a_rank_whose_error_rank_0_did_not_share_says_it_itself(monkeypatch, capsys):
    from bench import console

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(console, "PEER_WAIT_S", 0.0)
    with pytest.raises(SystemExit) as exc:
        console.fail("another node's folder already holds results")
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "error (rank 1): another node's folder already holds results\n"
    )


@pytest.mark.unit
def test_tp_sweeps_fit_their_defaults_to_the_world_size():
    from bench.runner.configure.config import RunConfig
    from bench.runner.configure.resolve import build_points

    def values(sweep, world):
        return sorted(
            {p.value for p in build_points(RunConfig(sweep=sweep), world_size=world)}, key=str
        )

    assert values("tp_degree", 2) == [1, 2]
    assert values("tp_degree", 4) == [1, 2, 4]
    assert values("mesh", 2) == ["dp", "tp"]
    assert values("mesh", 4) == ["ddp_tp", "dp", "fsdp_tp", "tp"]
    points = build_points(RunConfig(sweep="mesh", values="tp,fsdp_tp4"), world_size=8)
    by_value = {p.value: {k: p.knobs[k] for k in ("tp_degree", "dp_shard")} for p in points}
    assert by_value == {
        "tp": {"tp_degree": 8, "dp_shard": False},
        "fsdp_tp4": {"tp_degree": 4, "dp_shard": True},
    }


@pytest.mark.unit
def test_resume_refuses_a_folder_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "results.csv").write_text("sweep,value\n")
    code, err = run_main(
        ["--sweep", "bucket_cap_mb", "--out", str(tmp_path), "--resume", "--nproc-per-node", "2"],
        capsys,
    )
    assert code == 2 and "is not a run folder (no meta.json)" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.unit
def test_resume_refuses_a_run_of_another_schema(tmp_path, capsys):
    """Rows of this version have other columns than a schema-1 run's: never mix them."""
    import json
    import shutil

    run = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "data" / "runs" / "bucket2", run)
    meta = json.loads((run / "meta.json").read_text())
    del meta["schema_version"]
    (run / "meta.json").write_text(json.dumps(meta))
    code, err = run_main(
        ["--sweep", "bucket_cap_mb", "--out", str(run), "--resume", "--nproc-per-node", "2"],
        capsys,
    )
    assert code == 2 and "schema 1 (no points record): parallel-bench 0.1 reads it" in err


@pytest.mark.unit
def test_resume_refuses_a_run_of_another_minor_version(tmp_path, capsys):
    """A minor version adds columns: appending this version's rows under an older header would
    shift every cell after the first new column."""
    import json
    import shutil

    run = tmp_path / "older"
    shutil.copytree(Path(__file__).parent / "data" / "runs" / "bucket2", run)
    meta = json.loads((run / "meta.json").read_text())
    meta["schema_version"] = "2.14"
    (run / "meta.json").write_text(json.dumps(meta))
    code, err = run_main(
        ["--sweep", "bucket_cap_mb", "--out", str(run), "--resume", "--nproc-per-node", "2"],
        capsys,
    )
    assert code == 2 and "written as run folder 2.14, this version writes" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    "module",
    ["bench.runner.cli", "bench.report.__main__", "bench.analysis.__main__", "bench.plan.__main__"],
)
def test_every_command_prints_its_help(module, capsys):
    """argparse formats help strings with %: a bare "95 % interval" in one made --help a
    traceback."""
    import importlib

    with pytest.raises(SystemExit) as e:
        importlib.import_module(module).main(["--help"])
    assert e.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.fixture
def no_launch(monkeypatch):
    """Bad input is refused before any rank starts: a launch fails the test at once."""
    from bench.runner import cli

    def launch(*_a, **_k):
        raise AssertionError("ranks were started")

    monkeypatch.setattr(cli, "self_launch", launch)


@pytest.mark.unit
@pytest.mark.parametrize(
    "args,message",
    [
        (["--sweep", "bucket_cap_mb", "--values", "1,1"], "--values: 1 is given twice"),
        (
            ["--sweep", "bucket_cap_mb", "--values", "25,5,25.0"],
            "--values: 25.0 is given twice (25 and 25.0 are one value)",
        ),
        (
            ["--sweep", "sharding_strategy", "--values", "FULL_SHARD,full_shard"],
            "--values: full_shard is given twice",
        ),
        (
            ["--sweep", "bucket_cap_mb,precision", "--values2", "bf16,fp32,bf16"],
            "--values2: bf16 is given twice",
        ),
        (
            ["--sweep", "mesh", "--values", "fsdp_tp,fsdp_tp2", "--nproc-per-node", "4"],
            "--values: fsdp_tp and fsdp_tp2 set the same knobs (tp_degree=2, dp_shard=True)",
        ),
        (
            ["--sweep", "world_size", "--values", "1,2,02", "--nproc-per-node", "2"],
            "--values: 02 is given twice (2 and 02 are one value)",
        ),
        (["--sweep", "bucket_cap_mb", "--model", "mlp,mlp"], "--model: mlp is given twice"),
        (["--sweep", "bucket_cap_mb", "--impl", "native,native"], "--impl: native is given twice"),
        (
            ["--sweep", "world_size", "--scaling", "weak,weak", "--nproc-per-node", "2"],
            "--scaling: weak is given twice",
        ),
        (
            ["--sweep", "message_size", "--collectives", "all_reduce,all_reduce"],
            "--collectives: all_reduce is given twice",
        ),
        (
            ["--sweep", "comm_hook", "--option", "bucket_cap_mb=5", "--option", "bucket_cap_mb=1"],
            "--option bucket_cap_mb is given twice",
        ),
    ],
)
def test_a_repeated_value_is_refused_before_any_rank_starts(args, message, capsys, no_launch):
    """Each value of a comma list makes points: one given twice (as text, as the value it parses
    to, or as the knobs it sets) would run two points under one id, two rows each."""
    code, err = run_main(args, capsys)
    assert code == 2
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.unit
def test_points_of_distinct_values_have_distinct_ids():
    """Two values that print alike at six digits still make two ids."""
    from bench.runner.configure.config import RunConfig
    from bench.runner.configure.resolve import build_points

    points = build_points(
        RunConfig(sweep="bucket_cap_mb", model="mlp", values="0.1234567,0.1234568", impl="native"),
        world_size=2,
    )
    assert len({p.id for p in points}) == 2
    assert points[0].id == "mlp-bucket_cap_mb=0.1234567-native"
    one = build_points(
        RunConfig(sweep="bucket_cap_mb", model="mlp", values="25", impl="native"), world_size=2
    )
    assert one[0].id == "mlp-bucket_cap_mb=25-native"  # ids of earlier runs unchanged


@pytest.mark.unit
@pytest.mark.parametrize(
    "args,message",
    [
        (["--sweep", "bucket_cap_mb", "--values", "1e30"], "'1e30' is more than 1048576"),
        (["--sweep", "bucket_cap_mb", "--values", "25,1048577"], "'1048577' is more than 1048576"),
        (["--sweep", "bucket_cap_mb", "--values", "inf"], "'inf' is not a finite number"),
        (["--sweep", "bucket_cap_mb", "--values=-inf"], "'-inf' is not a finite number"),
        (["--sweep", "bucket_cap_mb", "--values", "nan"], "'nan' is not a finite number"),
        (
            ["--sweep", "comm_hook", "--option", "bucket_cap_mb=1e30"],
            "bad --option bucket_cap_mb: '1e30' is more than 1048576",
        ),
        (
            ["--sweep", "bucket_cap_mb,precision", "--values", "1e30"],
            "'1e30' is more than 1048576",
        ),
        (["--sweep", "grad_accum", "--values", "1" + "0" * 30], "is more than 65536"),
        (["--sweep", "grad_accum", "--values", "inf"], "'inf' is not an integer"),
    ],
)
def test_a_value_no_implementation_can_take_is_refused_in_one_line(
    args, message, capsys, no_launch
):
    """DDP turns bucket_cap_mb into bytes in an int64 (over 2**43 MB: an error deep in torch on
    every rank); the knob's row bounds it, and refuses inf and nan, before any rank starts."""
    code, err = run_main(args, capsys)
    assert code == 2
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.unit
def test_every_numeric_knob_refuses_inf_nan_and_absurd_magnitudes():
    """Every row whose parser reads numbers bounds them: no name is special."""
    from parallel_kernels.knobs import KNOBS

    numeric = []
    for knob in KNOBS.values():
        try:
            knob.parse("2")
        except ValueError:
            continue  # a knob of names or booleans
        if isinstance(knob.parse("2"), bool):
            continue
        numeric.append(knob.name)
        for text in ("inf", "-inf", "nan", "1e30", "9" * 30, "0", "-1"):
            with pytest.raises(ValueError):
                knob.parse(text)
    assert {"bucket_cap_mb", "grad_accum", "tp_degree", "shard_size"} <= set(numeric)
