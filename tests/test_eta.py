"""A sweep's time, forecast and bounded (bench/runner/train/eta.py): the forecast from the first
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
    clock = SweepClock(
        visits=[("m1", 1), ("m2", 1), ("w1", 1), ("w2", 1)],
        cohorts=[["m1", "m2"], ["w1", "w2"]],
        max_point_s=8.0,
    )
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
    cohorts = [[f"a{i}" for i in range(10)], [f"b{i}" for i in range(10)]]
    visits = [(p, 1) for c in cohorts for p in c]
    clock = SweepClock(visits=list(visits), cohorts=cohorts, max_point_s=8.0)
    first = clock.cohort_seconds(0)
    assert first == 80.0
    timed_s = (4 * 700 + 6 * 200) * 6.0 / 1e3  # ten candidates' samples; a failed one has none
    clock.cohort_done(0, first, timed_s)
    left = clock.unspent
    assert left == pytest.approx(80.0 - timed_s)
    assert clock.cohort_seconds(1) == pytest.approx(80.0 + left)
    assert clock.timed_bound["b0"] == pytest.approx(8.0 + left / 10)  # the forecast knows
    # the budget's share bounds it: 100 s over the 20 visits, 5 s each
    bounded = SweepClock(visits=list(visits), budget_s=100.0, cohorts=cohorts, max_point_s=8.0)
    bounded.cohort_done(0, 80.0, timed_s)
    assert bounded.cohort_seconds(1) == 50.0
    clock.cohort_done(1, 1.0, timed_s)
    assert clock.unspent == 0.0  # over its seconds (the last cycle ran on)


def test_the_forecast_is_made_once_after_the_first_visit_while_visits_are_left():
    clock = SweepClock(visits=list(VISITS), budget_s=60.0)
    clock.done("a", 1, 10.0)
    text = clock.forecast()
    assert text.startswith("sweep: about 2 min in all (9 visits, the first 10 s")
    assert text.endswith("drops the later rounds' visits that no longer fit")
    clock.done("b", 1, 10.0)
    assert clock.forecast() is None
    alone = SweepClock(visits=[("a", 1)])
    alone.done("a", 1, 10.0)
    assert alone.forecast() is None  # nothing left to forecast
    clock.not_run("c", 3)
    assert ("c", 3) not in clock.visits
