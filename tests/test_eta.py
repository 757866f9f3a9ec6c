"""A sweep's time, said and bounded (bench/runner/train/eta.py): the forecast from the first
visits, the budget shared so that every point is measured before any is measured again."""

import pytest

from bench.console import human_duration, parse_duration
from bench.runner.train.eta import SweepClock

pytestmark = pytest.mark.unit

VISITS = [(p, r) for r in (1, 2, 3) for p in ("a", "b", "c")]


def test_durations_read_and_print_as_a_user_writes_them():
    assert [parse_duration(t) for t in ("90", "90s", "10m", "1.5h", " 2M ")] == [
        90,
        90,
        600,
        5400,
        120,
    ]
    for bad in ("", "0", "-5m", "10 minutes", "m", "1d"):
        with pytest.raises(ValueError, match="is not a duration"):
            parse_duration(bad)
    assert [human_duration(s) for s in (12, 600, 7200)] == ["12 s", "10 min", "2.0 h"]


def test_the_time_left_is_each_points_own_cost_and_the_mean_for_the_others():
    clock = SweepClock(visits=list(VISITS))
    assert clock.left() is None  # nothing to go by yet
    clock.done("a", 1, 10.0, timed_s=4.0)  # a first visit traces: dearer
    assert clock.left() == pytest.approx(8 * 10.0)
    clock.done("b", 1, 20.0)
    clock.done("c", 1, 30.0)
    clock.done("a", 2, 6.0)
    # a's third round as its second did; b's and c's later rounds as their first did
    assert clock.left() == pytest.approx(6.0 + 20 + 30 + 20 + 30)


def test_an_interleaved_candidate_not_yet_run_costs_the_untimed_seconds_and_its_cycles_bound():
    """The first cohort's small steps say little of the next's large ones: a candidate of a
    cohort not yet run is costed as the others' seconds besides timing, plus the seconds of
    cycles its budget allows (at most)."""
    clock = SweepClock(visits=[("m1", 1), ("m2", 1), ("w1", 1), ("w2", 1)])
    clock.timed_bound = {p: 8.0 for p in ("m1", "m2", "w1", "w2")}
    clock.done("m1", 1, 2.0, timed_s=0.5)
    clock.done("m2", 1, 2.0, timed_s=0.5)
    assert clock.left() == pytest.approx(2 * (1.5 + 8.0))


def test_a_budget_runs_the_first_round_whole_then_what_fits_and_shares_the_rest():
    clock = SweepClock(visits=list(VISITS), budget_s=100.0)
    assert clock.timed_cap("a", 1) == pytest.approx(100 / 9)  # nothing known of its overhead
    for p, s in (("a", 30.0), ("b", 30.0), ("c", 30.0)):
        assert clock.fits(p, 1)
        clock.done(p, 1, s, timed_s=10.0)
    assert clock.fits("a", 1)  # a first-round visit always runs: no point goes unmeasured
    assert not clock.fits("a", 2)  # 90 s spent, a takes 30: over 100
    unbounded = SweepClock(visits=list(VISITS))
    unbounded.done("a", 1, 500.0)
    assert unbounded.fits("a", 2) and unbounded.timed_cap("a", 2) is None
    # what is left (10 s over 6 visits) less a's 20 s of overhead: no timing beyond the minimum
    assert clock.timed_cap("a", 2) == 0.0
    roomy = SweepClock(visits=list(VISITS), budget_s=1000.0)
    roomy.done("a", 1, 30.0, timed_s=10.0)
    assert roomy.timed_cap("a", 2) == pytest.approx((1000 - 30) / 8 - 20)


def test_a_cohort_gets_the_seconds_an_earlier_cohorts_quick_steps_left_unspent():
    """The sweep's timed seconds stay within its candidates' sum: a cohort that ended on its
    step count passes what it did not spend to the next, and ``--budget``'s caps still bound."""
    from bench.runner.train.sweep import cohort_seconds, unspent_seconds

    first = cohort_seconds(10, 8.0, 0.0, [None] * 10)
    assert first == 80.0
    rows = [{"samples_ms": [6.0] * 700} for _ in range(4)] + [{"samples_ms": [6.0] * 200}] * 6
    rows.append({"status": "error"})  # a failed candidate: no samples
    left = unspent_seconds(first, rows)
    assert left == pytest.approx(80.0 - (4 * 700 + 6 * 200) * 6.0 / 1e3)
    assert cohort_seconds(10, 8.0, left, [None] * 10) == pytest.approx(80.0 + left)
    assert cohort_seconds(10, 8.0, left, [5.0] * 10) == 50.0  # the budget's share bounds it
    assert unspent_seconds(1.0, rows) == 0.0  # over its seconds (the last cycle ran on)
