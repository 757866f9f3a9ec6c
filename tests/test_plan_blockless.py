"""The planner on models that name no blocks (``mlp``, ``wide_mlp``: no FSDP units, no
checkpoint units): every row that needs no blocks is predicted, memory and step time, and the
checkpointed rows, which cannot run, say which fact the model lacks."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench.plan import __main__ as plan_cli
from bench.plan import calibration, memory
from bench.plan.calibration import Target
from bench.plan.devices import Device
from bench.plan.rates import Rate
from bench.plan.space import NO_CHECKPOINT_UNITS, names_checkpoint_units
from bench.plan.topology import Topology
from tests.test_plan import plan_rows, space

WORLD, BATCH = 2, 16


def _target() -> Target:
    """A made-up target whose rate is given: the plan makes no calibration launch."""
    return Target(
        device=Device("test", 16.0, 100.0, "", "a device for the test"),
        topology=Topology.of_links("eth_25g", 8, 1.0),
        peak_tflops=lambda p: 1.0,
        peak_source=lambda p: "test",
        allowance_gib=0.0,
        global_batch=BATCH,
        rates={"fp32": Rate(0.05, 0.0, "test rate")},
    )


def _plan(model: str) -> pd.DataFrame:
    families = ("ddp", "fsdp2", "fsdp1")
    configs = space(model, WORLD, 8, BATCH, families, {"precision": ("fp32",)})
    return plan_rows(configs, _target(), 8)


@pytest.mark.unit
@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", ["mlp", "wide_mlp"])
def test_a_model_without_blocks_is_planned_but_where_it_checkpoints(model):
    assert not names_checkpoint_units(model)
    rows = _plan(model)
    plain = rows[rows["activation_checkpointing"] == "off"]
    # DDP at 3 bucket sizes, FSDP2 and FSDP1 at 3 shardings (no hybrid group at 2 ranks),
    # each at 4 (micro-batch, accumulation) pairs
    assert len(plain) == (3 + 3 + 3) * 4
    assert set(plain["family"]) == {"ddp", "fsdp2", "fsdp1"}
    for _, r in plain.iterrows():
        assert r["error"] == "", (r["config"], r["error"])
        assert r["peak_mem_gib"] > 0 and math.isfinite(r["peak_mem_gib"]), r["config"]
        assert r["step_ms"] > 0 and math.isfinite(r["step_ms"]), r["config"]
    # FSDP shards what DDP replicates: its FULL_SHARD holds less than DDP
    by = plain[(plain["micro_batch"] == BATCH // WORLD)].set_index("config")
    assert by.loc["fsdp2 FULL_SHARD", "peak_mem_gib"] < by.loc["ddp bucket 25 MB", "peak_mem_gib"]
    ckpt = rows[rows["activation_checkpointing"] == "full"]
    assert len(ckpt) == len(plain)
    assert set(ckpt["error"]) == {NO_CHECKPOINT_UNITS}
    assert ckpt["peak_mem_gib"].isna().all() and ckpt["step_ms"].isna().all()
    assert "no checkpoint units" in NO_CHECKPOINT_UNITS


@pytest.mark.unit
@pytest.mark.timeout(60)
def test_a_failed_phase_rebuilt_fails_only_the_phases_after_it():
    """A phase that fails leaves the phases after it to a new build; where that build fails
    too, the phases tracked before keep their figures."""
    points = [
        c.point()
        for c in space(
            "mlp",
            WORLD,
            8,
            BATCH,
            ("ddp",),
            {"precision": ("fp32",), "activation_checkpointing": ("off", "full")},
        )
        if c.knobs["bucket_cap_mb"] == 25.0 and c.knobs["grad_accum"] in (1, 2)
    ]
    # off 8 x 1, off 4 x 2, then checkpointed: the first of these fails its phase, the second
    # its new build
    assert [p.knobs["activation_checkpointing"] for p in points] == ["off", "off", "full", "full"]
    got = memory.track_phases(points)
    assert [t.error for t in got[:2]] == ["", ""] and all(t.peak_mib > 0 for t in got[:2])
    assert all("activation checkpointing works per block" in t.error for t in got[2:])


@pytest.mark.unit
def test_a_cpu_plan_calibrates_no_checkpointing_for_a_model_that_cannot_checkpoint(
    monkeypatch, tmp_path
):
    """The calibration launch holds no checkpointed point of such a model (it would fail, and
    the plan with it); the plan goes on to its rows."""
    asked = {}

    def rates(request, peak, launch, measured):
        asked["ckpt"] = launch.ckpt
        return {p: Rate(0.05, 0.0, "test rate") for p in launch.precisions}

    def launch_runs(runs, world, timeout_s):
        asked["sweeps"] = {p.sweep for r in runs for p in r.points}
        return ""

    monkeypatch.setattr(calibration, "computation_rates", rates)
    monkeypatch.setattr(calibration, "launch_runs", launch_runs)
    argv = ["--model", "mlp", "--world-size", "2", "--device", "cpu", "--global-batch", "16"]
    argv += ["--link", "eth_25g", "--family", "ddp", "--option", "precision=fp32"]
    argv += ["--workers", "1", "--out", str(tmp_path / "plan")]
    assert plan_cli.main(argv) == 0
    # the training points alone (--link prices the collectives), none checkpointed
    assert asked == {"ckpt": (), "sweeps": {"precision"}}
    rows = pd.read_csv(tmp_path / "plan" / "plan.csv", keep_default_na=False)
    assert (rows["error"] == "").sum() == 12  # DDP's plain rows
