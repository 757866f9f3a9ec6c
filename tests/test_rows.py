"""Implementations and knobs are rows, known by their facts: the same rows under new names
give the same point, the same measured figures and the same prediction."""

import dataclasses
from contextlib import contextmanager

import pytest

from bench.model.comm import fit_rows
from bench.model.compute import ComputeProfile
from bench.model.predict import case_of, simulate_case
from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from parallel_kernels import knobs, strategies
from tests.test_harness import FAST, run_points
from tests.test_model import synthetic

RENAMED = {"bucket_cap_mb": "gradient_bucket_mib"}  # knob name -> its new name
IMPLS = {"reference_nooverlap": "after_backward", "native": "torch_ddp"}


@contextmanager
def renamed_rows():
    """The DDP knob and two implementations registered under new names (copies of their rows,
    the old names gone), and a sweep over the renamed knob."""
    from bench.runner.configure import sweeps

    ddp = strategies.STRATEGIES["ddp"]
    saved_knobs, saved_impls = dict(knobs.KNOBS), dict(ddp.impls)
    saved_sweeps = dict(sweeps.SWEEPS)
    try:
        for old, new in RENAMED.items():
            knobs.KNOBS[new] = dataclasses.replace(knobs.KNOBS.pop(old), name=new)
            sweeps.SWEEPS[new] = dataclasses.replace(sweeps.SWEEPS[old], name=new, knob=new)
        for old, new in IMPLS.items():
            ddp.impls[new] = dataclasses.replace(ddp.impls.pop(old), name=new)
        yield
    finally:
        knobs.KNOBS.clear()
        knobs.KNOBS.update(saved_knobs)
        ddp.impls.clear()
        ddp.impls.update(saved_impls)
        sweeps.SWEEPS.clear()
        sweeps.SWEEPS.update(saved_sweeps)


def points(renamed: bool):
    sweep, impls = "bucket_cap_mb", "reference_nooverlap,native"
    if renamed:
        sweep, impls = RENAMED["bucket_cap_mb"], ",".join(IMPLS.values())
    return build_points(RunConfig(sweep=sweep, values="0.5", model="mlp", impl=impls), world_size=2)


def comparable(rec) -> dict:
    """A record without the names that were changed."""
    d = dataclasses.asdict(rec)
    for key in ("id", "sweep", "impl", "swept", "values", "swept_defaults"):
        d.pop(key)
    d["impl_facts"].pop("name")
    return d


@pytest.mark.unit
def test_renamed_rows_resolve_to_the_same_points_and_predictions():
    before = points(False)
    with renamed_rows():
        after = points(True)
        with pytest.raises(ValueError, match="unknown option 'bucket_cap_mb'"):
            build_points(RunConfig(sweep="grad_accum", option=("bucket_cap_mb=5",)), world_size=2)
        assert (
            build_points(
                RunConfig(
                    sweep="grad_accum",
                    values="1",
                    impl="reference",
                    option=(f"{RENAMED['bucket_cap_mb']}=5",),
                ),
                world_size=2,
            )[0].knobs["bucket_cap_mb"]
            == 5.0
        )
    assert [comparable(p) for p in after] == [comparable(p) for p in before]
    assert after[0].impl_facts["overlap"] is False  # the renamed no-overlap row says so
    comm = fit_rows(synthetic("gloo", 50e-6, 1e-9, [2]), backend="gloo")
    prof = ComputeProfile(
        forward_ms=10,
        backward_ms=20,
        after_ms=5,
        grad_ready_ms=(5, 12, 20),
        grad_bytes=(40, 4 << 20, 1 << 20),
    )
    for old, new in zip(before, after, strict=True):
        m_old = simulate_case(case_of(old), prof, comm).metrics()
        m_new = simulate_case(case_of(new), prof, comm).metrics()
        assert m_new == m_old
    nooverlap = simulate_case(case_of(after[0]), prof, comm).metrics()
    assert nooverlap["overlap_ms"] == 0  # predicted without overlap, as the row says


def run_renamed(root: str) -> list[dict]:
    with renamed_rows():
        return run_points(points(True), root, FAST)


@pytest.mark.ranks
@pytest.mark.timeout(240)
def test_renamed_rows_measure_the_same(pool, tmp_path):
    old = pool(2).run(run_points, points(False), str(tmp_path / "old"), FAST)[0]
    new = pool(2).run(run_renamed, str(tmp_path / "new"))[0]
    for a, b in zip(old, new, strict=True):
        assert a["status"] == b["status"] == "ok", (a["error"], b["error"])
        for key in (
            "comm_bytes_per_step",
            "comm_bytes_expected",
            "state_mb",
            "loss",
            "comm_calls_per_step",
            "params",
        ):
            assert a[key] == b[key], key
    # the renamed no-overlap implementation still all-reduces only after backward
    assert new[0]["overlap_pct"] < 3.0
