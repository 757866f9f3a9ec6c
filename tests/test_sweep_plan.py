"""A training sweep's plan and its rows, typed: the visits decided before any runs
(bench/runner/train/visits.py) and results.csv's row (bench/runner/train/row.py)."""

import math

import pytest

from bench.runfolder import columns
from bench.runner.train.row import Row, VisitResult
from bench.runner.train.visits import CohortVisit, RoundVisit, Schedule, round_orders
from tests.test_harness import point

pytestmark = pytest.mark.unit


def test_a_rows_fields_are_results_csvs_columns_in_their_order():
    assert Row.columns() == columns.written(columns.TRAINING)
    p = point("mlp", "native", 25.0)
    row = Row.of(p, status="ok", error="", loss=2.5, mfu_pct=math.nan)
    cells = row.cells()
    assert cells["point"] == p.id and cells["status"] == "ok" and cells["error"] == ""
    assert "value2" not in cells and "checked" not in cells  # empty cells: no value
    assert math.isnan(cells["mfu_pct"])  # measured without a figure: kept
    with pytest.raises(TypeError):
        Row.of(p, not_a_column=1)  # the writer would refuse it: the row refuses it first
    result = VisitResult(row, samples_ms=(1.0, 3.0))
    assert result.as_dict()["samples_ms"] == [1.0, 3.0] and result.timed_s == 0.004
    assert "samples_ms" not in VisitResult(row).as_dict()


def test_a_later_round_carries_what_it_did_not_measure_from_the_points_earlier_row():
    p = point("mlp", "native", 25.0)
    first = Row.of(p, status="ok", round=1, loss=2.5, comm_ms=4.0, checked="ok (fp32)")
    later = Row.of(p, status="ok", round=2, loss=2.4, mfu_pct=math.nan)
    carried = later.filled_from(first.cells())
    assert (carried.round, carried.loss, carried.comm_ms) == (2, 2.4, 4.0)
    assert carried.checked == "ok (fp32)"
    assert math.isnan(carried.mfu_pct)  # measured again, without a figure: not carried


def test_the_schedule_lists_cohorts_first_then_each_rounds_visits_not_done():
    a, b, c = (
        point("mlp", "native", 25.0),
        point("mlp", "reference", 25.0),
        point("mlp", "native", 1.0),
    )
    rounds = tuple(
        tuple(
            RoundVisit(point=p, round=r, rounds_left=3 - r, label="", done=(p is c and r == 1))
            for p in (c,)
        )
        for r in (1, 2)
    )
    schedule = Schedule(cohorts=(CohortVisit(1, (a, b), ""),), rounds=rounds, note=None)
    assert schedule.to_do() == [(a.id, 1), (b.id, 1), (c.id, 2)]
    assert schedule.cohort_ids() == [[a.id, b.id]]
    assert schedule.opening() == "2 points interleaved in 1 cohort(s), 1 points x 2 round(s)"
    orders = round_orders([a, b, c], 3, seed=0)
    assert orders == round_orders([a, b, c], 3, seed=0)  # seeded: the same on every rank
    assert all(sorted(x.id for x in o) == sorted(x.id for x in (a, b, c)) for o in orders)
    assert round_orders([a, b, c], 1, seed=0) == [[a, b, c]]  # one round: the declared order
