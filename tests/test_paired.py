"""Paired verdicts from interleaved cycles, on synthetic cycles with known answers, and which
points are interleaved."""

import math
import socket
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from bench.analysis.confidence import verdicts
from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from bench.runner.measure.timing import MAX_SECONDS, MAX_STEPS
from bench.runner.session.distenv import DistEnv
from bench.runner.train import racing
from bench.runner.train.cohort import split_cohorts, state_bytes
from bench.stats.estimates import Ratio, paired_cycles_ratio
from bench.stats.paired import (
    DECIDED,
    decided,
    interim_look,
    look_confidence,
    versus_best_paired,
)

pytestmark = pytest.mark.unit


def cycles(rng, true_ms: dict[str, float], n: int, *, drift_sd=0.3, step_sd=0.03) -> dict:
    """Cycles as a loaded machine makes them: each cycle's speed off by a large common drift
    (a neighbour's load, which falls on every candidate of the cycle), each step by its own
    small noise."""
    common = np.exp(rng.normal(0, drift_sd, n))
    return {k: ms * common * np.exp(rng.normal(0, step_sd, n)) for k, ms in true_ms.items()}


def test_drift_cancels_in_the_pairs_a_and_a_tie_and_five_percent_is_found():
    rng = np.random.default_rng(0)
    aa, found = 0, 0
    for _ in range(200):
        aa += len(versus_best_paired(cycles(rng, {"a": 100.0, "a2": 100.0}, 40)).tied) == 2
        v = versus_best_paired(cycles(rng, {"a": 100.0, "slow": 105.0}, 40))
        found += v.best == "a" and v.tied == ["a"]
    # the drift (30 % per cycle) is ten times the effect: unpaired, nothing would be separable
    assert aa >= 0.95 * 200 and found >= 0.9 * 200


def test_the_comparisons_share_their_confidence_and_unequal_lengths_pair_what_they_share():
    rng = np.random.default_rng(1)
    c = cycles(rng, {"a": 100.0, "b": 100.0, "c": 100.0}, 30)
    c["c"] = c["c"][:20]  # a candidate that left the cycles (decided) after 20
    v = versus_best_paired(c)
    assert v.cycles == 30 and v.confidence == pytest.approx(1 - 0.05 / 2)
    assert v.best in ("a", "b")  # the best is one of those that cycled longest
    want = paired_cycles_ratio(c["c"], c[v.best][:20], 1 - 0.05 / 2)
    assert v.ratios["c"] == want  # paired over the 20 cycles the two share
    # each comparison at its own look's confidence, Bonferroni over the two
    w = versus_best_paired(c, {"a": 0.95, "b": 0.95, "c": 0.99})
    assert w.ratios["c"].confidence == pytest.approx(1 - 0.01 / 2) and w.confidence == 0.975
    assert versus_best_paired({"only": [1.0, 2.0]}).tied == ["only"]
    with pytest.raises(ValueError, match="no candidates"):
        versus_best_paired({})


def test_the_best_is_the_lowest_paired_estimate_not_the_lowest_median():
    """A drift that sets the medians can hide which candidate the cycles favour: b is 3 %
    faster than a in the ten quiet cycles and 1 % slower in the eleven loaded ones, so a has
    the lower median while the paired estimate (Hodges-Lehmann's) says b."""
    drift = np.array([1.0] * 10 + [3.0] * 11)
    a = 100 * drift
    b = 100 * drift * np.array([0.97] * 10 + [1.01] * 11)
    assert np.median(a) < np.median(b)
    v = versus_best_paired({"a": a, "b": b})
    assert v.best == "b" and v.ratios["a"].ratio > 1


def test_a_comparison_is_decided_when_it_excludes_one_or_lies_in_the_tie_band():
    def r(low, high):
        return Ratio(1.0, low, high, 0.5, 0.95)

    assert decided(r(1.01, 1.2)) and decided(r(0.8, 0.99))  # faster or slower
    assert decided(r(0.98, 1.02)) and not decided(r(0.98, 1.02), band_pct=1.0)  # a tie
    assert not decided(r(0.9, 1.1)) and not decided(r(math.nan, math.nan))  # not yet
    # few cycles have no interval at all, so the cycles go on
    assert versus_best_paired({"a": [1.0] * 3, "b": [1.0] * 3}).undecided == ["b"]


def test_the_verdict_of_an_interleaved_group_is_paired():
    rng = np.random.default_rng(2)
    c = cycles(rng, {"m-1": 100.0, "m-25": 104.0, "m-5": 100.0}, 60, drift_sd=0.4)
    samples = pd.DataFrame(
        [(p, 1, i, ms) for p, t in c.items() for i, ms in enumerate(t)],
        columns=["point", "round", "index", "ms"],
    ).sample(frac=1.0, random_state=0)  # the reader pairs by cycle index, not by file order
    results = pd.DataFrame(
        {
            "point": list(c),
            "value": [1.0, 25.0, 5.0],
            "model": "m",
            "impl": "native",
            "status": "ok",
            "method": "paired",
        }
    )
    v = verdicts(results, samples, None, {"value": 25.0}).iloc[0]
    assert v["method"] == "paired" and v["cycles"] == 60
    assert 25.0 not in v["tied"] and 1.02 < v["default_low"] < 1.04 < v["default_high"] < 1.07
    # the same samples read as rounds (one round each): the drift hides the 4 %
    rounds = verdicts(results.drop(columns="method"), samples, None, {"value": 25.0}).iloc[0]
    assert rounds["method"] == "rounds" and 25.0 in rounds["tied"]


def env(world_size: int = 2) -> DistEnv:
    return DistEnv(
        rank=0,
        world_size=world_size,
        local_rank=0,
        local_world_size=world_size,
        backend="gloo",
        device=torch.device("cpu"),
        host=socket.gethostname(),
        nnodes=1,
    )


def test_one_models_points_at_one_world_size_are_interleaved_where_they_fit():
    points = build_points(
        RunConfig(sweep="bucket_cap_mb", model="mlp,wide_mlp", impl="native"), world_size=2
    )
    on = RunConfig(interleave="on")
    cohorts, rest, note = split_cohorts(points, on, env(), free=None)
    assert [{p.model for p in c} for c in cohorts] == [{"mlp"}, {"wide_mlp"}] and not rest
    assert sum(map(len, cohorts)) == len(points) and note is None
    off = split_cohorts(points, RunConfig(interleave="off"), env(), free=10**12)
    assert off == ([], points, None)
    # auto: wide_mlp's candidates together need more than half of what is free
    mlp = sum(state_bytes(p) for p in points if p.model == "mlp")
    wide = sum(state_bytes(p) for p in points if p.model == "wide_mlp")
    free = int(2 * 2 * (mlp + wide) / 2)  # per rank: half of it, over the host's two ranks
    cohorts, rest, note = split_cohorts(points, RunConfig(interleave="auto"), env(), free)
    assert [c[0].model for c in cohorts] == ["mlp"]
    assert {p.model for p in rest} == {"wide_mlp"}
    assert note.startswith("interleave: wide_mlp run in rounds")
    # a world-size sweep's points cannot share one launch's ranks
    sizes = build_points(RunConfig(sweep="world_size", values="2,4", model="mlp"), world_size=4)
    assert split_cohorts(sizes, on, env(4), None)[0] == [[p for p in sizes if p.world_size == 4]]


def test_the_looks_are_at_8_16_32_and_spend_at_most_the_error_asked():
    assert [interim_look(n) for n in (7, 8, 12, 16, 32, 33, 64)] == [None, 0, None, 1, 2, None, 3]
    assert look_confidence(8, early=True) == pytest.approx(1 - 0.05 / 4)
    assert look_confidence(16, early=True) == pytest.approx(1 - 0.05 / 8)
    assert look_confidence(60, early=False) == look_confidence(16, early=False) == 0.975
    # every interim look together and the last one: within the 5 % asked (the union bound)
    assert sum(1 - look_confidence(8 * 2**j, True) for j in range(30)) + 0.025 <= 0.05


def sequential(times: dict, max_cycles: int = 60, min_cycles: int = 10):
    """The runner's rule on given cycles: a look at 8, 16, 32 (from ``min_cycles``), stop
    there when every comparison is decided; else the verdict at the budget's end."""
    for n in range(1, max_cycles + 1):
        if interim_look(n) is not None and n >= min_cycles:
            v = versus_best_paired({k: t[:n] for k, t in times.items()}, look_confidence(n, True))
            if not v.undecided:
                return v
    return versus_best_paired(times, look_confidence(max_cycles, False))


def test_stopping_at_the_looks_keeps_false_differences_rare_and_finds_a_real_one():
    """Peeking after every cycle and stopping at the first separation would claim many false
    differences; the looks' spending keeps A/A within its 5 %, with heavy-tailed noise."""
    rng = np.random.default_rng(7)
    false, found, peeked = 0, 0, 0
    for _ in range(150):
        aa = {k: 100 * np.exp(rng.standard_t(3, 60) * 0.06) for k in ("a", "a2")}
        false += len(sequential(aa).tied) == 1
        peeked += any(  # the naive rule: any cycle's 95 % interval excluding 1
            len(versus_best_paired({k: t[:n] for k, t in aa.items()}).tied) == 1
            for n in range(6, 61, 3)
        )
        eff = {"a": 100 * np.exp(rng.standard_t(3, 60) * 0.03)}
        eff["slow"] = 106 * np.exp(rng.standard_t(3, 60) * 0.03)
        v = sequential(eff)
        found += v.best == "a" and v.tied == ["a"]
    assert false <= 0.05 * 150 and peeked >= 2 * max(false, 5)
    assert found >= 0.9 * 150


def _candidates(model="mlp", values="0.25,1,5,25,100", impls="native"):
    """Racing's view of a cohort: each candidate's point, cycles so far and place in them."""
    points = build_points(
        RunConfig(sweep="bucket_cap_mb", values=values, model=model, impl=impls), world_size=2
    )
    return [SimpleNamespace(point=p, times=[], active=True, stop="") for p in points]


def _cycle(rng, cands, true_ms: dict[float, float]) -> None:
    common = float(np.exp(rng.normal(0, 0.3)))  # the cycle's drift, on every candidate alike
    for c in cands:
        if c.active:
            c.times.append(true_ms[c.point.value] * common * float(np.exp(rng.normal(0, 0.04))))


def test_a_decided_candidate_leaves_the_race_and_the_rest_go_on():
    """At a look, a candidate far slower than the best is decided and leaves (stop decided);
    the close ones stay; a group with nothing undecided leaves whole. Its cycles stay its
    first ones, paired with the best's."""
    rng = np.random.default_rng(2)
    cands = _candidates()
    true = {0.25: 130.0, 1: 101.0, 5: 100.0, 25: 100.5, 100: 100.0}
    for _ in range(16):
        _cycle(rng, cands, true)
    undecided = racing.at_look(cands, 16, 3.0)
    by = {c.point.value: c for c in cands}
    assert not by[0.25].active and by[0.25].stop == DECIDED
    assert undecided >= 1 and sum(c.active for c in cands) == undecided + 1
    for _ in range(16):
        _cycle(rng, cands, true)
    assert len(by[0.25].times) == 16 and len(by[5].times) == 32
    v = versus_best_paired({c.point.id: c.times for c in cands})
    assert v.best != by[0.25].point.id and by[0.25].point.id not in v.tied
    # nothing left to decide: the whole group leaves
    same = _candidates(values="1,5")
    for _ in range(8):
        for c in same:
            c.times.append(100.0)
    assert racing.at_look(same, 8, 3.0) == 0 and not any(c.active for c in same)


def test_a_cohort_whose_points_name_one_verdict_group_races_as_one():
    """Each implementation's candidates race apart in a sweep: a group whose own comparisons
    are decided leaves whole, its best with it. A plan's verification names one group for
    configurations of several implementations: there the slower implementation's best, still
    undecided against the best of all, keeps cycling (FSDP1's rows left a verification once
    their own group was decided, the fastest of all among them)."""
    true = {("native", 5): 100.0, ("native", 25): 130.0, ("reference", 5): 103.0}
    true[("reference", 25)] = 150.0

    def race(cands) -> dict:
        rng = np.random.default_rng(5)
        for _ in range(16):
            common = float(np.exp(rng.normal(0, 0.3)))
            for c in cands:
                noise = float(np.exp(rng.normal(0, 0.04)))
                c.times.append(true[(c.point.impl, c.point.value)] * common * noise)
        racing.at_look(cands, 16, 3.0)
        return {(c.point.impl, c.point.value): c.active for c in cands}

    apart = race(_candidates(values="5,25", impls="native,reference"))
    assert not apart[("reference", 5)] and not apart[("reference", 25)]
    one = [
        SimpleNamespace(
            point=replace(c.point, verdict_group="plan"), times=[], active=True, stop=""
        )
        for c in _candidates(values="5,25", impls="native,reference")
    ]
    together = race(one)
    assert together[("reference", 5)] and together[("native", 5)]
    assert not together[("reference", 25)] and not together[("native", 25)]


def test_the_headline_keeps_the_best_and_the_default():
    """Half the budget spent: the best and the default (25) go on, the others leave with their
    share spent; where the default is the best, its closest challenger stays with it."""
    rng = np.random.default_rng(3)
    cands = _candidates()
    for _ in range(16):
        _cycle(rng, cands, {0.25: 100.0, 1: 100.5, 5: 100.2, 25: 102.0, 100: 101.0})
    racing.headline(cands, 16, 3.0, MAX_SECONDS)
    left = {c.point.value for c in cands if c.active}
    v = versus_best_paired({c.point.id: c.times for c in cands})
    best = next(c.point.value for c in cands if c.point.id == v.best)
    assert left == {best, 25} and {c.stop for c in cands if not c.active} == {MAX_SECONDS}
    cands = _candidates(values="1,25,100")
    for _ in range(16):
        _cycle(rng, cands, {1: 100.4, 25: 100.0, 100: 104.0})
    racing.headline(cands, 16, 3.0, MAX_STEPS)
    assert sum(c.active for c in cands) == 2 and cands[1].point.is_default
    assert not cands[0].point.is_default


def test_a_difference_inside_the_tie_band_is_a_tie_even_where_the_interval_excludes_one():
    """The band is what counts as a difference worth a decision: b 1.4 % slower, measured so
    closely that its interval excludes 1, is tied with a (an A/A pair read so over 600 cycles
    here), where b 5 % slower is not."""
    rng = np.random.default_rng(0)
    noise = rng.normal(1.0, 0.002, 200)
    a = 100 * noise
    for slower, tied in ((1.014, True), (1.05, False)):
        b = a * slower * rng.normal(1.0, 0.002, 200)
        v = versus_best_paired({"a": a, "b": b})
        assert v.ratios["b"].separable and v.best == "a", v.ratios
        assert ("b" in v.tied) is tied and not v.undecided, (slower, v.ratios)
