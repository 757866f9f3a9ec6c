"""verdicts.csv: a training run's answers, machine-readable (bench/runfolder/verdicts.py),
written from what the folder holds and read by --baseline to say whether the answer held."""

import pandas as pd
import pytest

from bench.report.answers import (
    answers_then_and_now,
    close_training_run,
    training_claims,
    verdict_table,
)
from bench.report.page import write_report
from bench.runfolder.schema import read_run, read_verdicts
from bench.runfolder.verdicts import VERDICTS_COLUMNS, write_verdicts
from tests.report_fixtures import make_training_run

pytestmark = pytest.mark.unit

# 25 MB clearly fastest for native; reference's 1 and 25 within a hair of each other
POINTS = {
    ("wide_mlp", 1.0, "native"): 130.0,
    ("wide_mlp", 25.0, "native"): 100.0,
    ("wide_mlp", 100.0, "native"): 140.0,
    ("wide_mlp", 1.0, "reference"): 100.2,
    ("wide_mlp", 25.0, "reference"): 100.0,
    ("wide_mlp", 100.0, "reference"): 150.0,
}


def test_the_verdicts_are_written_as_the_claims_found_them_and_read_back(tmp_path):
    run_dir = make_training_run(tmp_path / "run", POINTS, visit_sd=0.002)
    run = read_run(run_dir)
    text = close_training_run(run)
    assert "wide_mlp, native: " in text  # the console's closing text as before
    got = read_verdicts(run_dir).set_index("impl")
    assert list(read_verdicts(run_dir).columns) == VERDICTS_COLUMNS
    assert got.loc["native", "best"] == "25" and got.loc["native", "tied"] == [
        "25"
    ]  # the best and those tied with it
    assert got.loc["native", "default"] == "25" and got.loc["native", "default_ratio"] == 1.0
    assert set(got["method"]) == {"rounds"} and got["cycles"].isna().all()
    _, found = training_claims(run)
    ref = found.set_index("impl").loc["reference"]
    assert got.loc["reference", "tied"] == [f"{t:g}" for t in ref["tied"]]
    assert {"1", "25"} <= {*got.loc["reference", "tied"], got.loc["reference", "best"]}
    assert read_verdicts(tmp_path) is None  # a folder without them: None, not an error


def test_baseline_says_whether_each_answer_held_or_moved(tmp_path):
    old_dir = make_training_run(tmp_path / "old", POINTS, seed=1, visit_sd=0.002)
    moved = {**POINTS, ("wide_mlp", 100.0, "native"): 70.0}  # 100 MB now clearly fastest
    new_dir = make_training_run(tmp_path / "new", moved, seed=2, visit_sd=0.002)
    for d in (old_dir, new_dir):
        close_training_run(read_run(d))
    held = answers_then_and_now(read_verdicts(old_dir), read_verdicts(new_dir)).set_index("impl")
    assert held.loc["native", "answer"] == "moved"
    assert (held.loc["native", "best_old"], held.loc["native", "best_new"]) == ("25", "100")
    assert held.loc["reference", "answer"].startswith("held")
    assert held.loc["native", "cost_new"].startswith("x1.4")  # the default, 100 / 70
    page = write_report(new_dir, tmp_path / "reports", baseline=old_dir)[0].read_text()
    assert "The answers, then and now" in page and "moved" in page
    assert answers_then_and_now(None, read_verdicts(new_dir)) is None


def test_a_verdict_table_keeps_its_columns_when_empty(tmp_path):
    path = write_verdicts(tmp_path, verdict_table(pd.DataFrame(columns=["model"])))
    assert list(pd.read_csv(path).columns) == VERDICTS_COLUMNS
