"""Interleaved candidates on live ranks: a cohort built once, timed in cycles, compared pair by
pair; a candidate that fails (in its warm-up, or in a cycle, on one rank only) is its error row
and the others go on."""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist

from bench.runner.train.cycles import CycleBudget
from bench.runner.train.lifecycle import Cohort, PointSettings, run_cohort
from bench.stats.paired import versus_best_paired
from parallel_kernels.ddp import apply_reference_ddp
from parallel_kernels.strategies import STRATEGIES
from tests.test_harness import point, pool_env

pytestmark = pytest.mark.ranks

FAIL_AT_FORWARD = 12  # rank 1's forward that raises: past the warm-up and steps alone
SLOW_PCT = 60.0  # an effect no load beside the test hides in 16 paired cycles


@dataclass
class Ctx:
    """What ``run_cohort`` asks of a run: its ranks, folder and row writer."""

    run_dir: Path
    env: object = field(default_factory=pool_env)
    rows: list = field(default_factory=list)

    def write(self, row: dict) -> None:
        self.rows.append(row)


def _raise_on_rank1(model, *, group, device, **knobs):
    if dist.get_rank() == 1:
        raise RuntimeError("injected failure on rank 1")
    return apply_reference_ddp(model, group=group, device=device, **knobs)


def _fail_later_on_rank1(model, *, group, device, **knobs):
    wrapped = apply_reference_ddp(model, group=group, device=device, **knobs)
    calls = [0]

    def count(module, args):
        calls[0] += 1
        if dist.get_rank() == 1 and calls[0] == FAIL_AT_FORWARD:
            raise RuntimeError("injected failure in a cycle on rank 1")

    wrapped.register_forward_pre_hook(count)
    return wrapped


def cohort(root: str) -> tuple[list[dict], list[dict]]:
    """(the rows run_cohort returned, the rows rank 0 wrote)."""
    impls, reference = STRATEGIES["ddp"].impls, STRATEGIES["ddp"].impls["reference"]
    impls["raise_rank1"] = dataclasses.replace(reference, name="raise_rank1", apply=_raise_on_rank1)
    impls["fail_later"] = dataclasses.replace(
        reference, name="fail_later", apply=_fail_later_on_rank1
    )
    fast, slow = point("mlp", "reference", 1.0), point("mlp", "reference", 25.0)
    slowed = dataclasses.replace(slow, id=slow.id + "-slowed")
    points = [
        fast,
        slow,
        slowed,
        point("mlp", "raise_rank1", 1.0),
        point("mlp", "fail_later", 1.0),
    ]
    ctx = Ctx(run_dir=Path(root))
    budget = CycleBudget(min_cycles=4, max_cycles=16, max_s=60.0, band_pct=3.0, seed=0)
    try:
        results = run_cohort(
            ctx,
            PointSettings(point_timeout_s=10.0),
            Cohort(points=tuple(points), slow_pct={slowed.id: SLOW_PCT}),
            budget,
            progress=lambda _m: None,
        )
    finally:
        del impls["raise_rank1"], impls["fail_later"]
    return [r.as_dict() for r in results], ctx.rows


@pytest.mark.timeout(300)
def test_a_cohort_cycles_pairs_and_keeps_going_past_its_failures(pool, tmp_path):
    per_rank = pool(2).run(cohort, str(tmp_path), timeout=240)
    rows, written = per_rank[0]
    by = {r["point"]: r for r in written}
    assert len(written) == 5 and not per_rank[1][1]  # rank 0 writes, once per candidate
    # every rank agrees on each candidate's outcome and reason
    assert sorted((r["point"], r["status"], r["error"]) for r in per_rank[1][0]) == sorted(
        (r["point"], r["status"], r["error"]) for r in rows
    )
    failed = {r["impl"]: r for r in written if r["status"] == "error"}
    assert "rank 1: RuntimeError: injected failure on rank 1" in failed["raise_rank1"]["error"]
    assert "injected failure in a cycle on rank 1" in failed["fail_later"]["error"]
    ok = [r for r in written if r["status"] == "ok"]
    assert len(ok) == 3, "; ".join(f"{r['point']}: {r['error']}" for r in written)
    # the cycles' steps shared: 16 per candidate that entered them (four), the decided one
    # leaving early and the others cycling on
    assert sum(r["cycles"] for r in ok) <= 16 * 4
    for r in ok:
        n = r["cycles"]
        assert r["method"] == "paired" and n >= 4 and r["round"] == 1
        assert len(r["samples_ms"]) == n  # one step per cycle it was in
        assert r["stop"] in ("decided", "max_steps", "max_point_s")
        assert r["checked"].startswith("ok")  # its first step matched the plain model
        assert np.isfinite(r["alone_ms"]) and np.isfinite(r["interleave_cost_pct"])
        assert r["steps"] == n and r["comm_calls_per_step"] > 0  # traced after the cycles
    # the sample i of every candidate comes from cycle i: the slowed copy is distinguished
    fast, slow = (f"mlp-bucket_cap_mb={v}-reference" for v in (1, 25))
    v = versus_best_paired({p: by[p]["samples_ms"] for p in (fast, slow, slow + "-slowed")})
    assert slow + "-slowed" not in v.tied, v.ratios
    assert v.ratios[slow + "-slowed"].ratio > 1.2
    # 60 % slower leaves the race (decided, or at half the budget, when only the best and
    # the default 25 go on) while the two others cycle on
    assert by[slow + "-slowed"]["cycles"] < by[fast]["cycles"] == by[slow]["cycles"]
