"""One typed run configuration: parsed once, its defaults written once, handed to self-launched
ranks whole, and no argparse namespace below the command line."""

import argparse
import ast
import os
from dataclasses import fields
from pathlib import Path

import pytest

from bench.runner import cli
from bench.runner.configure.config import (
    COLLECTIVE_MAX_STEPS,
    DEFAULTS,
    TRAINING_MAX_STEPS,
    RunConfig,
    runs_from_json,
    runs_to_json,
)
from bench.runner.configure.flags import build_parser, parse_config
from bench.runner.configure.resolve import build_points
from bench.runner.session.distenv import TORCHRUN_VARS

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.unit
def test_unset_flags_take_the_configurations_defaults_and_set_ones_are_typed():
    argv = ["--sweep", "bucket_cap_mb", "--steps", "7", "--option", "a=1", "--option", "b=2"]
    config = parse_config(argv)
    assert config == RunConfig(
        sweep="bucket_cap_mb", steps=7, option=("a=1", "b=2"), argv=tuple(argv)
    )
    with pytest.raises(AttributeError):  # frozen: nothing below the command line changes it
        config.steps = 3  # type: ignore[misc]
    # every flag is a field, and the parser itself holds no default of its own
    dests = {a.dest for a in build_parser()._actions if a.dest != "help"}
    assert dests <= {f.name for f in fields(RunConfig)}
    assert all(a.default == argparse.SUPPRESS for a in build_parser()._actions)


@pytest.mark.unit
def test_the_help_states_the_configurations_own_defaults():
    text = build_parser().format_help().replace("\n", " ")
    text = " ".join(text.split())
    for flag, value in (
        ("--steps", DEFAULTS.steps),
        ("--warmup-steps", DEFAULTS.warmup_steps),
        ("--batch-size", DEFAULTS.batch_size),
        ("--max-steps", TRAINING_MAX_STEPS),
        ("--max-steps", COLLECTIVE_MAX_STEPS),
    ):
        after = text.split("options:", 1)[1].split(f" {flag} ", 1)[1]
        assert f"default {value})" in after[:200], flag
    # the points' own defaults are the configuration's (one place, not two)
    point = build_points(
        RunConfig(sweep="bucket_cap_mb", model="mlp", values="25", impl="native"), world_size=2
    )[0]
    assert (point.steps, point.warmup_steps, point.profile_steps) == (
        DEFAULTS.steps,
        DEFAULTS.warmup_steps,
        DEFAULTS.profile_steps,
    )


@pytest.mark.unit
def test_a_resolved_run_survives_its_hand_over_whole():
    argv = ["--sweep", "bucket_cap_mb", "--values", "1,25", "--model", "mlp", "--out", "/tmp/x"]
    config = parse_config([*argv, "--predict-with", "/tmp/c"])
    run = cli.resolve(config, 2)
    assert run.config.rounds == 3 and len(run.points) == 4
    assert runs_from_json(runs_to_json([run])) == [run]
    collective = cli.resolve(parse_config(["--sweep", "message_size", "-e", "4K"]), 2)
    assert runs_from_json(runs_to_json([collective, run])) == [collective, run]
    assert collective.config.rounds == 1 and collective.collective_plan["sizes"] == [
        1024,
        2048,
        4096,
    ]


@pytest.mark.unit
def test_self_launched_ranks_neither_parse_nor_resolve(tmp_path, monkeypatch):
    """Nor do they with several runs handed over (the planner's calibration: its collectives,
    then its points): each made in turn."""
    run = cli.resolve(
        parse_config(["--sweep", "bucket_cap_mb", "--values", "5", "--model", "mlp"]), 2
    )
    collective = cli.resolve(parse_config(["--sweep", "message_size", "-e", "4K"]), 2)
    path = tmp_path / "resolved.json"
    path.write_text(runs_to_json([collective, run]))
    for var in TORCHRUN_VARS:
        monkeypatch.setenv(var, "0")
    monkeypatch.setenv(cli.RESOLVED_ENV, str(path))

    def refuse(*_a, **_k):
        raise AssertionError("a self-launched rank parsed or resolved again")

    monkeypatch.setattr(cli, "parse_config", refuse)
    monkeypatch.setattr(cli, "resolve", refuse)
    made = []  # (what, config, points or plan), in the order made
    monkeypatch.setattr(
        cli, "run_sweep", lambda config, points: made.append(("train", config, points)) or 0
    )
    monkeypatch.setattr(
        cli,
        "run_collective_sweep",
        lambda config, plan: made.append(("coll", config, vars(plan))) or 0,
    )
    assert cli.main(["--not-a-flag"]) == 0  # argv is not read at all
    assert made == [
        ("coll", collective.config, collective.collective_plan),
        ("train", run.config, list(run.points)),
    ]
    # a run that fails ends the launch's runs there, with its code
    monkeypatch.setattr(cli, "run_collective_sweep", lambda config, plan: 3)
    made.clear()
    assert cli.main([]) == 3 and made == []


@pytest.mark.unit
def test_self_launch_hands_over_what_the_launcher_resolved(monkeypatch):
    for var in TORCHRUN_VARS:
        monkeypatch.delenv(var, raising=False)
    seen = {}

    def launch(nproc, argv, entry=None):
        (seen["run"],) = runs_from_json(Path(os.environ[cli.RESOLVED_ENV]).read_text())
        seen["argv"], seen["nproc"] = argv, nproc
        return 0

    monkeypatch.setattr(cli, "self_launch", launch)
    argv = ["--nproc-per-node", "2", "--sweep", "bucket_cap_mb", "--values", "5", "--model", "mlp"]
    assert cli.main(argv) == 0
    assert seen["nproc"] == 2 and seen["argv"] == argv[2:]
    assert seen["run"].config.argv == tuple(argv[2:])  # meta.json's argv: what torchrun would run
    assert [p.id for p in seen["run"].points] == [
        "mlp-bucket_cap_mb=5-native",
        "mlp-bucket_cap_mb=5-reference",
    ]
    assert cli.RESOLVED_ENV not in os.environ  # nothing left for a later launch to misread


@pytest.mark.unit
def test_no_argparse_namespace_below_the_command_line():
    """Only the command line's own module builds or reads an argparse namespace."""
    readers = []
    for path in sorted((REPO / "bench" / "runner").rglob("*.py")):
        if path.name == "flags.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            named = isinstance(node, ast.Name | ast.Attribute) and "Namespace" in ast.unparse(node)
            imported = isinstance(node, ast.Import | ast.ImportFrom) and "argparse" in ast.unparse(
                node
            )
            if named or imported:
                readers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert readers == []
