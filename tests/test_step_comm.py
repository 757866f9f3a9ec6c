"""What a step pays for its collectives on this host (bench/roofline/step_comm.py): measured in
two processes and cached, and a CPU plan made without a calibration launch pricing its fitted
collectives at that factor (bench/plan/calibration.py, bench/plan/topology.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from bench.plan import __main__ as plan_cli
from bench.plan.calibration import prices_in_step
from bench.plan.request import parse_request
from bench.plan.topology import Topology
from bench.roofline import step_comm
from bench.roofline.profile import from_json
from tests.test_plan_roofline import profile

COLLECTIVES = Path(__file__).parent / "data" / "runs" / "collectives2"


def _paid(factor: float) -> step_comm.StepComm:
    return step_comm.StepComm(factor, (2.0,), (2.0 / factor,), (64,), "given by the test")


@pytest.mark.unit
def test_a_topology_with_a_factor_prices_every_collective_at_that_many_times():
    plain = Topology.fitted(COLLECTIVES, gpus_per_node=2, share=0.5)
    paid = replace(plain, in_step=2.5)
    for name in ("all_reduce", "all_gather", "reduce_scatter"):
        alone = plain.of_world(2).time(name, 1 << 20, 2)
        assert alone > 0
        assert paid.of_world(2).time(name, 1 << 20, 2) == pytest.approx(2.5 * alone)
    assert paid.of_world(2).backend == plain.of_world(2).backend  # the rest is the costs' own


@pytest.mark.unit
def test_only_a_cpu_plan_priced_on_the_roofline_without_a_launch_pays_the_factor():
    base = ["--model", "llama:tiny", "--world-size", "2", "--gpus-per-node", "2"]
    base += ["--global-batch", "8"]

    def asks(*extra: str) -> bool:
        return prices_in_step(parse_request([*base, *extra], "test"))

    assert asks("--device", "cpu", "--no-calibration-launch")
    assert not asks("--device", "cpu")  # the launch measures what its steps pay
    assert not asks("--device", "cpu", "--no-calibration-launch", "--mfu", "40")
    assert not asks("--device", "h100", "--no-calibration-launch")


@pytest.mark.unit
@pytest.mark.timeout(180)
def test_a_no_launch_plan_pays_its_collectives_at_the_hosts_factor_and_says_so(
    monkeypatch, tmp_path, capsys
):
    host = from_json(profile(source="measured on this host by the test"))
    monkeypatch.setattr("bench.roofline.measure.host_profile", lambda *a, **k: host)
    argv = ["--model", "llama:tiny", "--world-size", "2", "--gpus-per-node", "2"]
    argv += ["--global-batch", "8", "--device", "cpu", "--collectives", str(COLLECTIVES)]
    argv += ["--family", "ddp", "--option", "precision=fp32", "--no-calibration-launch"]
    argv += ["--option", "activation_checkpointing=off", "--workers", "1"]
    rows = {}
    for factor in (1.0, 3.0):
        monkeypatch.setattr("bench.plan.calibration.host_step_comm", lambda f=factor: _paid(f))
        out = tmp_path / f"x{factor}"
        assert plan_cli.main([*argv, "--out", str(out)]) == 0
        rows[factor] = pd.read_csv(out / "plan.csv").set_index("config")
        links = json.loads((out / "plan.json").read_text())["links"]
        assert f"collectives x{factor:.2f} as a 2-rank DDP step pays them here" in links
    printed = capsys.readouterr().out
    assert "collectives x3.00 as a 2-rank DDP step pays them here (given by the test)" in printed
    assert (rows[1.0]["comm_ms"] > 0).all()
    ratio = rows[3.0]["comm_ms"] / rows[1.0]["comm_ms"]
    assert ratio.to_numpy() == pytest.approx(3.0)
    assert (rows[3.0]["step_ms"] > rows[1.0]["step_ms"]).all()


@pytest.mark.ranks
@pytest.mark.timeout(240)
def test_the_factor_is_measured_in_two_processes_once_and_read_from_the_cache(
    monkeypatch, tmp_path, capsys
):
    got = step_comm.measure(widths=(32, 64), timing=step_comm.Timing(batch=2, rounds=1, steps=4))
    assert got.widths == (32, 64) and len(got.in_step_ms) == len(got.alone_ms) == 2
    assert all(t > 0 for t in got.alone_ms) and all(t >= 0 for t in got.in_step_ms)
    assert got.factor >= 1.0 and "measured on" in got.source
    monkeypatch.setattr(step_comm, "CACHE_DIR", tmp_path / "cache")
    calls = []
    monkeypatch.setattr(step_comm, "measure", lambda: calls.append(1) or got)
    first = step_comm.host_step_comm()
    assert calls == [1] and "measuring" in capsys.readouterr().err
    again = step_comm.host_step_comm()
    assert calls == [1] and again.factor == first.factor == got.factor
    assert again.source == str(step_comm.cache_path()) and again.in_step_ms == got.in_step_ms


@pytest.mark.unit
def test_a_factor_that_cannot_be_measured_is_one_line_and_prices_collectives_as_alone(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(step_comm, "CACHE_DIR", tmp_path / "cache")

    def broken(*args, **kwargs):
        raise RuntimeError("no room for a store\nmore detail")

    monkeypatch.setattr(step_comm.mp, "start_processes", broken)
    got = step_comm.host_step_comm()
    assert got.factor == 1.0 and got.source == "not measured: no room for a store"
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "step comm: cannot measure it (no room for a store); collectives as alone"
    assert not step_comm.cache_path().exists()  # measured again next time
