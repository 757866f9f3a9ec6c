"""The statistics behind every claim, on synthetic samples with known answers: intervals cover
what they say, ties and differences are declared as they are."""

import math
import tracemalloc

import numpy as np
import pandas as pd
import pytest

from bench.analysis.confidence import noise_floor_pct, rounds_disagree, verdicts
from bench.stats import distributions
from bench.stats.estimates import Estimate, estimates, paired_cycles_ratio, paired_ratio, ratio
from bench.stats.intervals import half_width_pct, median_interval
from bench.stats.signed_rank import EXACT_N, _lower_index, hodges_lehmann, signed_rank_p
from bench.stats.ties import adjusted, versus_best


def run_samples(
    rng,
    true_ms: dict[str, float],
    rounds: int,
    *,
    steps: int = 20,
    round_sd: float = 0.03,
    visit_sd: float = 0.04,
    step_sd: float = 0.05,
) -> pd.DataFrame:
    """A run as this machine makes it: whole rounds slower or faster, each visit of a point
    off by its own drift, and skewed step-to-step noise on top."""
    rows = []
    for r in range(1, rounds + 1):
        whole = rng.normal(0, round_sd)
        for point, ms in true_ms.items():
            visit = rng.normal(0, visit_sd)
            steps_ms = ms * np.exp(whole + visit + rng.normal(0, step_sd, steps))
            rows += [(point, r, i, t) for i, t in enumerate(steps_ms)]
    return pd.DataFrame(rows, columns=["point", "round", "index", "ms"])


@pytest.mark.unit
def test_median_interval_covers_the_median_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    draws, n, hits = 2000, 30, 0
    for _ in range(draws):
        x = rng.lognormal(mean=1.0, sigma=0.5, size=n)  # skewed; the true median is e
        lo, hi = median_interval(x)
        hits += lo <= math.e <= hi
    # order statistics give at least 95 % (exactly 95.7 % at n = 30)
    assert 0.94 <= hits / draws <= 0.98


@pytest.mark.unit
def test_median_interval_is_scipys_quantile_test_interval():
    """The interval read off scipy.special's binomial functions (what a rank can afford) is
    scipy.stats.quantile_test's, order statistic for order statistic, at every sample size
    from 2 to 300 and at the confidences the suite asks (Bonferroni's among them)."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for n in [*range(2, 301), 1000]:
        x = rng.lognormal(size=n)
        for confidence in (0.5, 0.9, 0.95, 0.99, 1 - 0.05 / 6, 1 - 0.05 / 28):
            test = stats.quantile_test(x, q=float(np.median(x)), p=0.5)
            ci = test.confidence_interval(confidence)
            np.testing.assert_equal(median_interval(x, confidence), (ci.low, ci.high))


@pytest.mark.unit
def test_the_distributions_are_scipy_stats_own():
    stats = pytest.importorskip("scipy.stats")
    for q in (0.5, 0.9, 0.975, 0.995, 1 - 0.025 / 28):
        assert distributions.norm_ppf(q) == stats.norm.ppf(q)
        for df in (1.0, 2.0, 3.5, 10.0, 57.3, math.inf):
            assert distributions.t_ppf(q, df) == stats.t.ppf(q, df)
    for x in (0.0, 0.3, 1.7, 4.2, 12.0):
        for df in (1.0, 2.0, 7.5, 30.0):
            assert distributions.t_sf(x, df) == stats.t.sf(x, df)
            for dfd in (2.0, 9.0, 40.0):
                assert distributions.f_sf(x, df, dfd) == pytest.approx(stats.f.sf(x, df, dfd))
    for n in (1, 2, 7, 40, 301):
        np.testing.assert_allclose(
            distributions.half_binomial_cdf(n), stats.binom(n, 0.5).cdf(range(n + 1)), rtol=1e-9
        )
        np.testing.assert_allclose(
            distributions.half_binomial_sf(n),
            stats.binom(n, 0.5).sf(range(n + 1)),
            rtol=1e-9,
            atol=1e-300,
        )


@pytest.mark.unit
def test_the_signed_rank_p_value_is_scipys():
    """``signed_rank_p`` is scipy.stats.wilcoxon's two-sided p-value: exact up to EXACT_N
    differences, the normal approximation with its continuity correction above and where
    ranks tie (zeros dropped, as Wilcoxon's)."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(4)
    for n in (*range(1, 60), 120, 200, 201, 450):
        for shift in (0.0, 0.02, 0.2):
            d = rng.standard_normal(n) * 0.1 + shift
            method = "exact" if n <= EXACT_N else "asymptotic"
            expected = stats.wilcoxon(d, method=method, correction=True).pvalue
            assert signed_rank_p(d) == pytest.approx(expected, rel=1e-9, abs=1e-14)  # rounding
    d = np.round(rng.standard_normal(80), 1)  # tied ranks and zeros
    expected = stats.wilcoxon(d, method="asymptotic", correction=True).pvalue
    assert signed_rank_p(d) == pytest.approx(expected, rel=1e-9)


@pytest.mark.unit
def test_the_hodges_lehmann_interval_is_the_signed_rank_test_inverted():
    """The interval's ends are where scipy's signed-rank test of the shifted differences
    starts to reject: just inside, p >= alpha; just outside, p < alpha (exact and normal
    sizes, at 95 % and a Bonferroni-sized 99.7 %); the estimate is the median of the Walsh
    averages."""
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(5)
    for n in (6, 7, 12, 40, 150, 260, 700):
        for confidence in (0.95, 0.997):
            d = rng.standard_t(4, n) * 0.05 + 0.01
            centre, low, high = hodges_lehmann(d, confidence)
            if n < 9 and confidence > 0.99:
                assert math.isnan(low) and math.isnan(high)  # too few for that confidence
                continue
            alpha = 1 - confidence
            method = "exact" if n <= EXACT_N else "asymptotic"

            def p(theta, d=d, method=method):
                return stats.wilcoxon(d - theta, method=method, correction=True).pvalue

            assert p(low + 1e-9) >= alpha - 1e-12 and p(high - 1e-9) >= alpha - 1e-12
            assert p(low - 1e-6) < alpha and p(high + 1e-6) < alpha
            i, j = np.triu_indices(n)
            assert centre == pytest.approx(float(np.median((d[i] + d[j]) / 2)))


def quadratic_hodges_lehmann(d, confidence: float) -> tuple[float, float, float]:
    """``hodges_lehmann`` the quadratic way: every Walsh average formed and sorted."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    n = len(d)
    if n == 0:
        return math.nan, math.nan, math.nan
    i, j = np.triu_indices(n)
    walsh = np.sort((d[i] + d[j]) / 2)
    m = len(walsh)
    k = _lower_index(n, 1 - confidence)
    centre = float((walsh[(m - 1) // 2] + walsh[m // 2]) / 2)
    if k < 1:
        return centre, math.nan, math.nan
    return centre, float(walsh[k - 1]), float(walsh[m - k])


def walsh_cases(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Differences of n: continuous, rounded (ties, and sums that round), few repeated values,
    all equal, heavy-tailed at scales near overflow and underflow, and with non-finite ones."""
    big, tiny = np.finfo(float).max, np.finfo(float).smallest_subnormal
    with_gaps = rng.standard_normal(n)
    gaps = rng.random(n) < 0.1
    with_gaps[gaps] = rng.choice([np.nan, np.inf, -np.inf], gaps.sum())
    return [
        rng.standard_normal(n) * 0.05 - 0.01,
        np.round(rng.standard_normal(n), 1),
        rng.integers(-3, 4, n).astype(float),
        np.full(n, -0.3),
        rng.standard_t(2, n) * 10.0 ** rng.choice([-300, 300]),
        rng.choice([big, -big, big / 3, tiny, -2 * tiny, 0.0, -2.5], n),
        with_gaps,
    ]


@pytest.mark.unit
def test_hodges_lehmann_selects_the_same_walsh_averages_as_forming_them_all():
    """The selection in linear memory returns the very order statistics that forming and
    sorting all n(n+1)/2 Walsh averages gives, bit for bit (overflowing sums included), for
    exact and normal-approximated sizes and every usual confidence."""
    rng = np.random.default_rng(9)
    sizes = (*range(30), 50, 101, 199, EXACT_N, EXACT_N + 1, 257, 300)
    with np.errstate(over="ignore", invalid="ignore"):  # the near-overflow cases
        for n in sizes:
            for d in walsh_cases(rng, n):
                for confidence in (0.9, 0.95, 0.99):
                    expected = quadratic_hodges_lehmann(d, confidence)
                    np.testing.assert_array_equal(
                        hodges_lehmann(d, confidence), expected, err_msg=f"n={n} {d[:6]}"
                    )


def traced_peak(f) -> int:
    """The most bytes ``f()`` held at once, as tracemalloc sees them (numpy reports its
    arrays to it)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        f()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not tracing:
            tracemalloc.stop()


@pytest.mark.unit
def test_hodges_lehmann_of_a_long_run_takes_memory_linear_in_its_length():
    """40,000 steps a point would be 800 million Walsh averages, GiBs to form. The bound, 50
    floats a difference, is checked at 1,000 first, where forming them all takes ~45 MiB: a
    quadratic implementation fails there, before it could ask for the GiBs."""
    assert traced_peak(lambda: np.ones(10**6)) >= 8 * 10**6  # numpy's arrays are seen
    rng = np.random.default_rng(10)
    for n in (1_000, 40_000):
        d = rng.standard_t(4, n) * 0.05 + 0.01
        peak = traced_peak(lambda d=d: hodges_lehmann(d, 0.95))
        assert peak < 50 * n * 8, f"{n} differences: a peak of {peak / 2**20:.1f} MiB"


@pytest.mark.unit
def test_a_paired_ratio_covers_its_truth_and_is_narrower_than_the_sign_tests():
    """Simulated cycles of a 5 % effect under drift that both sides share: the interval covers
    1.05 at least as often as it says, and, the log ratios being near normal, it is narrower
    than the sign test's interval of the median ratio (Hodges-Lehmann's efficiency)."""
    rng = np.random.default_rng(6)
    covered, ratio_of_widths = 0, []
    for _ in range(300):
        drift = np.exp(np.cumsum(rng.normal(0, 0.02, 60)))
        a = 1.05 * drift * rng.lognormal(0, 0.06, 60)
        b = drift * rng.lognormal(0, 0.06, 60)
        r = paired_cycles_ratio(a, b)
        covered += r.low <= 1.05 <= r.high
        lo, hi = median_interval(a / b)
        ratio_of_widths.append(np.log(r.high / r.low) / np.log(hi / lo))
    assert covered >= 0.93 * 300
    assert np.median(ratio_of_widths) < 0.9


@pytest.mark.unit
def test_too_few_samples_have_no_interval():
    assert all(math.isnan(v) for v in median_interval([1, 2, 3, 4, 5]))
    assert half_width_pct([1, 2, 3]) == math.inf
    assert half_width_pct([10.0] * 8) == 0.0


@pytest.mark.unit
def test_the_interval_of_a_ratio_covers_the_true_ratio_with_rounds_drifting():
    rng = np.random.default_rng(1)
    truth = {"a": 100.0, "b": 110.0, "c": 125.0, "d": 100.0}
    draws, hits = 400, 0
    for _ in range(draws):
        est = estimates(run_samples(rng, truth, rounds=3))
        r = ratio(est["b"], est["a"])
        hits += r.low <= 1.1 <= r.high
    assert 0.92 <= hits / draws <= 0.98


@pytest.mark.unit
def test_step_intervals_alone_would_claim_too_much():
    """Why rounds: the same configuration visited twice differs by its visits' drift, which
    its steps' interval cannot see; one round with the noise floor, or rounds, say tied."""
    rng = np.random.default_rng(2)
    false_steps, false_rounds = 0, 0
    for _ in range(100):
        s = run_samples(rng, {"a": 100.0, "a_again": 100.0}, rounds=3, round_sd=0, step_sd=0.02)
        first = s[s["round"] == 1]
        bare = estimates(first)  # no floor: the steps' interval only
        false_steps += ratio(bare["a_again"], bare["a"]).separable
        false_rounds += ratio(*estimates(s).values()).separable
    assert false_steps > 30 and false_rounds <= 10


@pytest.mark.unit
def test_a_and_a_are_tied_and_a_known_effect_is_separated():
    rng = np.random.default_rng(3)
    aa_ties, found = 0, 0
    for _ in range(200):
        truth = {"a": 100.0, "a_again": 100.0, "slower": 120.0}
        v = versus_best(estimates(run_samples(rng, truth, rounds=5, visit_sd=0.02)))
        aa_ties += {"a", "a_again"} <= set(v.tied)
        found += "slower" not in v.tied
    assert aa_ties >= 0.95 * 200 and found >= 0.95 * 200


@pytest.mark.unit
def test_versus_best_corrects_for_the_number_of_comparisons():
    e = {
        k: Estimate(math.log(ms), 0.0004, 20.0, 3, "run")
        for k, ms in {"a": 100.0, "b": 103.0, "c": 110.0, "d": 140.0}.items()
    }
    v = versus_best(e)
    assert v.best == "a" and v.confidence == pytest.approx(adjusted(0.95, 3))
    assert v.tied == ["a", "b"] and v.ratios["d"].ratio == pytest.approx(1.4)
    # the same pair alone, at 95 % without the correction
    assert ratio(e["c"], e["a"]).separable and not ratio(e["b"], e["a"]).separable


@pytest.mark.unit
def test_paired_ratio_cancels_what_drifts_between_rounds():
    drift = np.array([1.0, 1.3, 0.8, 1.1, 0.9])
    r = paired_ratio(1.2 * drift * (1 + 0.01 * np.array([1, -1, 0, 1, -1])), drift)
    assert r.low < 1.2 < r.high and r.low > 1.15 and r.separable
    assert paired_ratio([1.0, 1.0], [1.0, 1.0]).ratio == 1.0


@pytest.mark.unit
def test_one_round_uses_the_noise_floor():
    rng = np.random.default_rng(4)
    s = run_samples(rng, {"a": 100.0, "b": 100.0}, rounds=1, steps=40)
    floor = 2.0 * np.exp(rng.normal(0, 0.05, 30))
    with_floor, without = estimates(s, floor), estimates(s)
    assert with_floor["a"].var > without["a"].var + 0.002 and with_floor["a"].df == 29
    noise = pd.DataFrame({"ms": floor})
    assert noise_floor_pct(noise) == pytest.approx(100 * np.std(np.log(floor), ddof=1))


@pytest.mark.unit
def test_verdicts_name_the_ties_and_the_default_cost():
    rng = np.random.default_rng(5)
    truth = {"m-1": 100.0, "m-5": 101.0, "m-25": 130.0}
    samples = run_samples(rng, truth, rounds=4, visit_sd=0.01, round_sd=0.02)
    results = pd.DataFrame(
        {
            "point": list(truth),
            "value": [1.0, 5.0, 25.0],
            "model": "m",
            "impl": "native",
            "status": "ok",
        }
    )
    v = verdicts(results, samples, None, {"value": 25.0}).iloc[0]
    assert v["best"] in (1.0, 5.0) and sorted(v["tied"]) == [1.0, 5.0]
    assert not v["default_tied"] and v["default_low"] > 1.1 and v["default_high"] < 1.5
    # a row whose times do not time its configuration (float8 emulated) is in no verdict,
    # however fast it ran
    untimed = results.assign(untimed=["fp8 emulated", "", ""])
    v = verdicts(untimed, samples, None, {"value": 25.0}).iloc[0]
    assert v["best"] == 5.0 and 1.0 not in v["tied"]


@pytest.mark.unit
def test_a_point_whose_rounds_disagree_is_flagged():
    rng = np.random.default_rng(6)
    s = run_samples(rng, {f"p{i}": 100.0 for i in range(8)}, rounds=4, visit_sd=0.01)
    s.loc[(s["point"] == "p3") & (s["round"] == 2), "ms"] *= 1.3  # one visit 30 % off
    flagged = rounds_disagree(s).set_index("point")
    assert flagged.loc["p3", "disagree"] and flagged["disagree"].sum() == 1


def adaptive_cases() -> list[tuple[int, str]]:
    """On each rank of the pool: the steps timed and why they stopped, for budgets whose
    outcome is known (rank 1 takes longer: the slowest rank's times decide, on every rank)."""
    import time

    import torch
    import torch.distributed as dist

    from bench.runner.measure.timing import Budget, TimedStep, adaptive_steps

    slow = dist.get_rank() == 1

    def step() -> None:
        time.sleep(0.002 if slow else 0.001)

    cpu = torch.device("cpu")
    cases = [
        Budget(min_steps=6, max_steps=50, max_s=60, target_pct=1000.0),  # target at once
        Budget(min_steps=6, max_steps=12, max_s=60, target_pct=1e-9),  # steps run out
        Budget(min_steps=6, max_steps=500, max_s=0.005, target_pct=1e-9),  # seconds do
        Budget(min_steps=2, max_steps=50, max_s=60, target_pct=5.0, prior=(2.0,) * 40),  # prior
    ]
    out = []
    for budget in cases:
        s, skew, stop = adaptive_steps(TimedStep(step=step, device=cpu, group=None), budget)
        out.append((len(s), stop, bool((s >= 2.0).all() and (skew >= 0).all())))
    return out


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_adaptive_timing_stops_at_the_target_or_the_budget_on_every_rank_alike(pool):
    per_rank = pool(2).run(adaptive_cases)
    assert per_rank[0] == per_rank[1]  # the same decision, from the same all-reduced times
    (n1, s1, ok1), (n2, s2, ok2), (n3, s3, ok3), (n4, s4, ok4) = per_rank[0]
    assert (n1, s1) == (6, "target") and (n2, s2) == (12, "max_steps")
    assert (n3, s3) == (6, "max_point_s") and (n4, s4) == (2, "target")
    assert ok1 and ok2 and ok3 and ok4  # every step lasts until the slow rank's end
