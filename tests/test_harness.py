"""The harness on live ranks: rows, traces, overlap measured, failures recorded, not hidden."""

import contextlib
import dataclasses
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from bench.runfolder.points import PointRecord
from bench.runner.configure.config import DEFAULTS
from bench.runner.configure.resolve import PointRequest, VisitSettings, resolve_point
from bench.runner.session.distenv import DistEnv
from bench.runner.train.lifecycle import PointSettings, run_point
from parallel_kernels.ddp import apply_reference_ddp
from parallel_kernels.models import build_model, grad_bytes
from parallel_kernels.strategies import STRATEGIES

pytestmark = pytest.mark.ranks

FAST = PointSettings(point_timeout_s=60.0)
# A failure on one rank makes the others wait out this timeout: keep it short there.
QUICK_FAIL = PointSettings(point_timeout_s=5.0)
# Steps of every point the tests run (a sweep's own: 5 warm-up, at least 10 timed, 3 traced).
FAST_STEPS = {"warmup_steps": 1, "steps": 3, "profile_steps": 1}
# Those of a test that reads how far a point trained (its loss) or two traced steps.
TRAINED_STEPS = {"warmup_steps": 2, "steps": 4, "profile_steps": 2}


def pool_env() -> DistEnv:
    return DistEnv(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=0,
        local_world_size=dist.get_world_size(),
        backend="gloo",
        device=torch.device("cpu"),
        host=socket.gethostname(),
        nnodes=1,
    )


@contextlib.contextmanager
def checked_only():
    """Points run through their check against the plain model and their timed steps, without
    the profile and memory stages: for workers that read only the check's outcome. The pool's
    ranks outlive the call: the stages are put back whatever happens."""
    from bench.runner.train import lifecycle

    stages = lifecycle.profile, lifecycle.memory
    lifecycle.profile = lifecycle.memory = lambda *_a, **_k: {}
    try:
        yield
    finally:
        lifecycle.profile, lifecycle.memory = stages


def make_point(
    sweep: str,
    model: str,
    value,
    impl: str,
    strategy: str,
    *,
    world_size: int = 2,
    knobs: dict | None = None,
    **per_visit,
) -> PointRecord:
    """A resolved point of ``sweep`` at ``value`` (setting ``knobs``), with the tests' steps
    unless ``per_visit`` sets the batch or steps."""
    return resolve_point(
        PointRequest(
            sweep=sweep,
            values={sweep: value},
            model=model,
            strategy=strategy,
            impl=impl,
            knobs=knobs or {},
            world_size=world_size,
            per_visit=VisitSettings(**{**FAST_STEPS, **per_visit}),
        )
    )


def point(model: str, impl: str, cap: float) -> PointRecord:
    return make_point("bucket_cap_mb", model, cap, impl, "ddp", knobs={"bucket_cap_mb": cap})


def run_points(
    points: list[PointRecord], root: str, cfg: PointSettings = FAST, steps: dict = FAST_STEPS
) -> list[dict]:
    """Run each point, a sweep's with ``steps`` (it comes with the sweep's defaults), one made
    here with its own: each row's cells and samples."""
    return [
        run_point(_tests_steps(p, steps), pool_env(), cfg, Path(root) / p.id).as_dict()
        for p in points
    ]


def _tests_steps(p: PointRecord, steps: dict) -> PointRecord:
    """``p`` with ``steps`` where it holds a sweep's default ones."""
    sweeps = (DEFAULTS.warmup_steps, DEFAULTS.steps, DEFAULTS.profile_steps)
    if (p.warmup_steps, p.steps, p.profile_steps) == sweeps:
        return dataclasses.replace(p, **steps)
    return p


@pytest.mark.timeout(240)
def test_rows_traces_and_overlap(pool, tmp_path):
    impls = ["native", "reference", "reference_nooverlap"]
    rows = pool(2).run(run_points, [point("wide_mlp", i, 5.0) for i in impls], str(tmp_path))[0]
    by_impl = {r["impl"]: r for r in rows}
    expected_bytes = grad_bytes(build_model("wide_mlp"))
    for impl, r in by_impl.items():
        assert r["status"] == "ok", r["error"]
        # what the backend moved per step, read from the trace: every gradient byte, once
        assert r["comm_bytes_per_step"] == expected_bytes, impl
        assert r["step_ms_min"] <= r["step_ms_median"] <= r["step_ms_max"]
        assert r["compute_ms"] > 0 and r["comm_ms"] > 0
        # parameters, gradients and optimiser state are all live after the optimiser step
        assert r["peak_mem_mb"] >= 0.95 * r["state_mb"], (r["peak_mem_mb"], r["state_mb"])
        assert np.isnan(r["peak_reserved_mb"])  # a CUDA figure
        assert r["data_ms"] > 0 and np.isfinite(r["trace_overhead_pct"])
        print(
            impl,
            {
                k: round(r[k], 2)
                for k in (
                    "peak_mem_mb",
                    "state_mb",
                    "data_ms",
                    "trace_overhead_pct",
                    "step_ms_median",
                    "rank_skew_ms",
                )
            },
        )
        written = (tmp_path / r["point"]).glob("*.pt.trace.json")
        traces = sorted(p.name.split(".")[0] for p in written)
        assert traces == ["rank0", "rank1"]
    # All-reduce only after backward: nothing to hide behind. Launched during backward: hidden.
    assert by_impl["reference_nooverlap"]["overlap_pct"] < 3.0
    assert by_impl["reference"]["overlap_pct"] > by_impl["reference_nooverlap"]["overlap_pct"] + 10


def _raise_on_rank1(model, *, group, device, **knobs):
    if dist.get_rank() == 1:
        raise RuntimeError("injected failure on rank 1")
    return apply_reference_ddp(model, group=group, device=device, **knobs)


def _diverge_on_rank1(model, *, group, device, **knobs):
    """A wrapper whose replicas drift apart silently: rank 1 skips the start-up broadcast and
    trains without synchronising gradients."""
    if dist.get_rank() == 1:
        torch.manual_seed(123)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        return model
    return model  # rank 0 is plain too: nothing ties the two together


def failing_sweep(root: str) -> list[dict]:
    impls, reference = STRATEGIES["ddp"].impls, STRATEGIES["ddp"].impls["reference"]
    impls["raise_rank1"] = dataclasses.replace(reference, name="raise_rank1", apply=_raise_on_rank1)
    impls["diverge"] = dataclasses.replace(reference, name="diverge", apply=_diverge_on_rank1)
    try:
        return run_points(
            [
                point("mlp", "raise_rank1", 1.0),
                point("mlp", "diverge", 1.0),
                point("mlp", "reference", 1.0),
            ],
            root,
            QUICK_FAIL,
        )
    finally:
        del STRATEGIES["ddp"].impls["raise_rank1"], STRATEGIES["ddp"].impls["diverge"]


@pytest.mark.timeout(120)
def test_failed_and_diverged_points_are_errors_and_the_sweep_goes_on(pool, tmp_path):
    per_rank = pool(2).run(failing_sweep, str(tmp_path))
    raised, diverged, fine = per_rank[0]
    assert raised["status"] == "error"
    assert "rank 1: RuntimeError: injected failure on rank 1" in raised["error"]
    assert diverged["status"] == "error" and "diverged" in diverged["error"]
    assert fine["status"] == "ok" and fine["error"] == ""
    # every rank agrees on the outcome and its reason
    assert [(r["status"], r["error"]) for r in per_rank[1]] == [
        (r["status"], r["error"]) for r in per_rank[0]
    ]
