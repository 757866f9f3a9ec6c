"""The HTML report: what a reader must find in it, and run-to-run comparison on samples."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report.__main__ import main as report_main
from bench.report.page import write_report
from tests.report_fixtures import make_training_run

REPO = Path(__file__).resolve().parents[1]
POINTS = {
    ("wide_mlp", v, impl): ms
    for v, ms in ((1.0, 120.0), (25.0, 100.0), (100.0, 130.0))
    for impl in ("native", "reference")
}


@pytest.mark.e2e
def test_report_shows_the_answer_figures_tables_and_how_to_dig(tmp_path):
    run = make_training_run(
        tmp_path / "run",
        {**POINTS, ("wide_mlp", 5.0, "native"): 80.0},
        failed={("mlp", 1.0, "reference"): "rank 1: RuntimeError: boom"},
    )
    out, cmp = write_report(run, tmp_path / "reports")
    assert cmp is None and out == tmp_path / "reports" / "run.html"
    page = out.read_text()
    # the answer, with the default's cost over the best and its interval
    assert "best bucket_cap_mb=5 at" in page and "separable from every other value" in page
    assert re.search(
        r"the default 25 takes x1\.2\d\d \[1\.\d\d, 1\.\d\d\] the time of "
        r"the best: slower",
        page,
    )
    assert "<h2>Confidence</h2>" in page and "Noise floor" in page
    imgs = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', page)
    assert len(imgs) == 3 and all(len(alt) > 30 for alt in imgs)  # described, not "figure"
    assert "<caption>" in page and "<th scope='col'>typical_ms_low</th>" in page
    assert "rank 1: RuntimeError: boom" in page  # failed points listed
    assert f"tensorboard --logdir {run / 'traces'}" in page
    assert "torchrun --standalone --nproc_per_node=2 bench/run.py --sweep bucket_cap_mb" in page
    assert "<td class='flag num'>" in page  # native computes 70 % of its step: flagged
    assert "http://" not in page.replace("http://127", "") and "https://" not in page


@pytest.mark.unit
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
    assert set(cmp.loc[~cmp["regression"], "verdict"]) == {"tied"}
    reg = by_point.loc["wide_mlp-bucket_cap_mb=25-reference"]
    assert 1 < reg["low"] < 1.2 < reg["high"]
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


@pytest.mark.unit
def test_a_tie_is_said_and_a_noise_floor_larger_than_the_effects_is_flagged(tmp_path):
    near = {
        ("wide_mlp", v, "native"): ms for v, ms in ((1.0, 100.0), (25.0, 100.5), (100.0, 101.0))
    }
    run = make_training_run(tmp_path / "run", near, visit_sd=0.03, floor_sd=0.15)
    page = write_report(run, tmp_path / "reports")[0].read_text()
    assert "tie: no value of bucket_cap_mb is separable from the fastest at 95 %" in page
    assert re.search(
        r"<span class='flag'>\(every difference here, [\d.]+ % at most, is "
        r"smaller than the machine's noise floor of [\d.]+ %\)</span>",
        page,
    )
    assert re.search(
        r"the default 25 (takes x1\.0\d\d \[[\d.]+, [\d.]+\] the time of the best: "
        r"tied|is the fastest)",
        page,
    )


@pytest.mark.unit
def test_resume_reads_back_every_round(tmp_path):
    from bench.runner.session.context import _resumed

    run = make_training_run(tmp_path / "run", POINTS, rounds=3, steps=7)
    skip, history, gaps = _resumed(run)
    assert skip == {
        (f"wide_mlp-bucket_cap_mb={v:g}-{i}", r)
        for v in (1.0, 25.0, 100.0)
        for i in ("native", "reference")
        for r in (1, 2, 3)
    }
    h = history["wide_mlp-bucket_cap_mb=25-native"]
    assert len(h.times) == 21 and len(h.medians) == 3 and h.row["rounds"] == 3
    assert h.row["compute_ms"] == pytest.approx(70.0) and gaps == 18


@pytest.mark.e2e
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


@pytest.mark.unit
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
    assert "best tp_degree=4 at" in page and "the default 1 takes" in page
    assert "<th scope='col'>comm_bytes_expected</th>" in page


@pytest.mark.unit
def test_the_collectives_headline_gives_no_ratio_of_zero_bus_bandwidths():
    """At one rank every collective's bus factor is 0, so is its busbw (an H200's NCCL run):
    the headline names each figure and divides none by 0 (it printed "nan" with numpy's
    warning)."""
    import warnings

    import pandas as pd

    from bench.report.page import _collective_headline

    def rows(busbw):
        return pd.DataFrame(
            {
                "collective": ["all_reduce"] * 2,
                "impl": ["native", "reference"],
                "busbw_GBps": busbw,
            }
        )

    native = {"native": True, "reference": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        one = _collective_headline(rows([0.0, 0.0]), {}, native)
    assert "native 0.00 GB/s" in one and "reference 0.00 GB/s" in one
    assert "nan" not in one and "reference/native" not in one
    two = _collective_headline(rows([2.0, 3.0]), {}, native)
    assert "(reference/native 1.50)" in two
