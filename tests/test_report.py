"""The HTML report: what a reader must find in it, and run-to-run comparison on samples."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.report.__main__ import main as report_main
from bench.report.compare import mann_whitney_u
from bench.report.page import write_report
from tests.report_fixtures import make_training_run

REPO = Path(__file__).resolve().parents[1]
POINTS = {("wide_mlp", v, impl): ms for v, ms in ((1.0, 120.0), (25.0, 100.0), (100.0, 130.0))
          for impl in ("native", "reference")}  # fmt: skip


def test_report_shows_the_answer_figures_tables_and_how_to_dig(tmp_path):
    run = make_training_run(
        tmp_path / "run",
        {**POINTS, ("wide_mlp", 5.0, "native"): 80.0},
        failed={("mlp", 1.0, "reference"): "rank 1: RuntimeError: boom"},
    )
    out, cmp = write_report(run, tmp_path / "reports")
    assert cmp is None and out == tmp_path / "reports" / "run.html"
    page = out.read_text()
    # the answer, with its margin over the default and whether the spread allows the claim
    assert "best <b>bucket_cap_mb=5</b>" in page and "the default 25 takes" in page
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    assert len(imgs) == 3 and all(len(alt) > 30 for alt in imgs)  # described, not "figure"
    assert "<caption>" in page and "<th scope='col'>step_ms_median</th>" in page
    assert "rank 1: RuntimeError: boom" in page  # failed points listed
    assert f"tensorboard --logdir {run / 'traces'}" in page
    assert "torchrun --standalone --nproc_per_node=2 bench/run.py --sweep bucket_cap_mb" in page
    assert "<td class='flag num'>" in page  # native computes 70 % of its step: flagged
    assert "http://" not in page.replace("http://127", "") and "https://" not in page


def test_comparison_finds_the_regression_and_nothing_else(tmp_path):
    old = make_training_run(tmp_path / "old", POINTS, seed=1)
    slower = {
        k: (ms * 1.2 if k == ("wide_mlp", 25.0, "reference") else ms) for k, ms in POINTS.items()
    }
    new = make_training_run(tmp_path / "new", slower, seed=2)
    _, cmp = write_report(new, tmp_path / "reports", baseline=old)
    by_point = cmp.set_index("point")
    assert by_point.loc["wide_mlp-bucket_cap_mb=25-reference", "verdict"] == "slower"
    assert by_point.loc["wide_mlp-bucket_cap_mb=25-reference", "ratio"] == pytest.approx(
        1.2, rel=0.05
    )
    assert cmp["regression"].sum() == 1
    assert set(cmp.loc[~cmp["regression"], "verdict"]) == {"no significant change"}
    page = (tmp_path / "reports" / "new.html").read_text()
    assert "1 regression(s)." in page and "Compared with old" in page
    code = report_main(
        [
            str(new),
            "--baseline",
            str(old),
            "--reports-dir",
            str(tmp_path / "r2"),
            "--fail-on-regression",
        ]
    )
    assert code == 1


def test_report_command_rejects_a_folder_without_results(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench.report", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr


def test_mann_whitney_u_matches_the_textbook():
    # complete separation of 5 and 5: U = 0, asymptotic two-sided p = 0.0122 (with continuity)
    u, p = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 0 and p == pytest.approx(0.0122, abs=5e-4)
    assert mann_whitney_u([3, 3, 3], [3, 3, 3])[1] == 1.0
    rng = np.random.default_rng(0)
    a, b = rng.normal(100, 5, 30), rng.normal(100, 5, 30)
    assert mann_whitney_u(a, b)[1] > 0.05  # same distribution
    assert mann_whitney_u(a, b + 10)[1] < 1e-6  # shifted by two standard deviations
    u_ab, p_ab = mann_whitney_u(a, b + 1)
    u_ba, p_ba = mann_whitney_u(b + 1, a)
    assert u_ab + u_ba == 30 * 30 and p_ab == pytest.approx(p_ba)


def test_tensor_parallel_report_draws_communication_against_the_analytical_figure(tmp_path):
    points, comm = {}, {}
    for degree, ms in ((1, 150.0), (2, 60.0), (4, 40.0)):
        for impl, factor in (("native", 1.0), ("reference", 1.0), ("naive", 2.25)):
            points[("wide_mlp", degree, impl)] = ms * (1.1 if impl == "naive" else 1.0)
            expected = 4e7 if degree == 1 else 1.05e6 * factor * degree / 2
            comm[("wide_mlp", degree, impl)] = (expected, expected)
    run = make_training_run(tmp_path / "tp", points, sweep="tp_degree", strategy="tp", comm=comm)
    page = write_report(run, tmp_path / "reports")[0].read_text()
    assert "<h2>Communication</h2>" in page
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    assert any("analytical" in alt and "tp_degree" in alt for alt in imgs)
    assert "best <b>tp_degree=4</b>" in page and "the default 1 takes" in page
    assert "<th scope='col'>comm_bytes_expected</th>" in page
