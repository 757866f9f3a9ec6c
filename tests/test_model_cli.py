"""``python -m bench.model`` on real runs of this machine: a collectives run and a bucket sweep
made with ``--predict-with`` (two launches, shared with tests/test_run_folder.py:
``model_runs``), and the bad inputs it must refuse in one line."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from bench.model.__main__ import main
from tests.test_end_to_end import REPO

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def runs(model_runs):
    root = model_runs
    return {
        "root": root,
        "coll": root / "coll",
        "train": root / "train",
        "report": root / "reports" / "train.html",
    }


def model(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "bench.model", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def refused(proc, *needles):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def refused_here(capsys, args, *needles):
    """``refused`` for ``main(args)`` in this process: a launch costs seconds (``import
    torch``), and an exception other than the exit would fail the test as a traceback would."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.timeout(300)
def test_validate_predicts_every_ok_point(runs):
    proc = model("validate", "--collectives", runs["coll"], runs["train"], "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ok = pd.read_csv(runs["train"] / "results.csv").query("status == 'ok'")
    points = pd.DataFrame(out["points"])
    assert sorted(points["point"]) == sorted(ok["point"]) and len(points) == 4
    assert (points["predicted_step_ms"] > 0).all() and (points["note"] == "").all()
    merged = points.merge(ok, on="point")
    assert (merged["measured_step_ms"] == merged["step_ms_median"]).all()
    err = (100 * (points["predicted_step_ms"] / points["measured_step_ms"] - 1)).abs()
    assert out["median_abs_error_pct"] == pytest.approx(err.median())
    # Reported, not gated: the collectives and the training points are timed minutes apart,
    # so load beside the run falls on one and not the other (measured 4 % over a 20-point make
    # sweep here; 50.6 % with a make sweep and a second test run beside it). The model's
    # arithmetic is checked on known runs in tests/test_model.py.
    print(f"validate: median absolute error {out['median_abs_error_pct']:.1f} %")
    assert np.isfinite(out["median_abs_error_pct"])
    assert {c["model"] for c in out["bucket_choice"]} == {"mlp"}
    assert {f["collective"] for f in out["fits"]} == {"all_reduce", "all_gather", "reduce_scatter"}
    for f in out["fits"]:  # a real run's samples.csv gives every fit its intervals
        assert f["alpha_us_low"] <= f["alpha_us"] <= f["alpha_us_high"], f
        assert f["beta_ns_per_B_low"] <= f["beta_ns_per_B"] <= f["beta_ns_per_B_high"], f
        assert f["r2_log"] <= 1 and f["outliers"] == (f["outlier_residuals"].count("%"))
    text = model("validate", "--collectives", runs["coll"], runs["train"])
    assert (
        text.returncode == 0 and "median absolute step-time error" in text.stdout.splitlines()[-1]
    )
    fit = model("fit", "--collectives", runs["coll"])
    assert fit.returncode == 0 and "all_reduce (2 ranks) residuals: 4 KiB" in fit.stdout


@pytest.mark.timeout(300)
def test_whatif_recommends_with_its_assumptions(runs):
    proc = model(
        "whatif",
        "--collectives",
        runs["coll"],
        "--compute",
        runs["train"],
        "--world-size",
        "8,64",
        "--link",
        "ib_ndr",
        "--speedup",
        "20",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "50 GB/s" in out["assumptions"]["link"] and out["assumptions"]["speedup"] == 20
    assert {r["world_size"] for r in out["predictions"]} == {8, 64}
    assert [(r["world_size"], r["family"]) for r in out["recommendations"]] == [
        (8, "ddp"),
        (8, "fsdp"),
        (64, "ddp"),
        (64, "fsdp"),
    ]
    assert all(r["step_ms_low"] is None for r in out["predictions"])  # a link: no range
    fitted = model(
        "whatif", "--collectives", runs["coll"], "--compute", runs["train"], "--world-size", "4"
    )
    assert fitted.returncode == 0 and "# link: fitted gloo collectives" in fitted.stdout
    ranged = model(
        "whatif",
        "--collectives",
        runs["coll"],
        "--compute",
        runs["train"],
        "--world-size",
        "4,16",
        "--json",
    )
    assert ranged.returncode == 0, ranged.stderr
    for r in json.loads(ranged.stdout)["predictions"]:
        assert r["step_ms_low"] - 1e-9 <= r["step_ms"] <= r["step_ms_high"] + 1e-9, r


def test_the_report_has_the_model_section(runs):
    html = runs["report"].read_text()
    assert "Cost model: predicted before measured" in html
    assert "Measured vs predicted, per point" in html and "What if" in html
    assert "Median absolute step-time error" in html
    assert "R<sup>2</sup> of log time" in html and "outlier_residuals" in html
    assert "alpha_us_low" in html and "step_ms_high" in html and "best_at_both_ends" in html


@pytest.mark.timeout(300)
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, capsys):
    coll, train = runs["coll"], runs["train"]
    # runs of another machine mixed in
    other = tmp_path / "other"
    shutil.copytree(train, other)
    meta = json.loads((other / "meta.json").read_text())
    (other / "meta.json").write_text(json.dumps({**meta, "host": "elsewhere"}))
    refused(model("validate", "--collectives", coll, train, other), "different machines", "host")
    refused_here(capsys, ["validate", "--collectives", coll, other], "different machines")
    # collectives timed with another reduction, training on a machine with other cores
    maxed = tmp_path / "maxed"
    shutil.copytree(coll, maxed)
    meta = json.loads((maxed / "meta.json").read_text())
    meta["collective_plan"]["op"] = "max"
    (maxed / "meta.json").write_text(json.dumps(meta))
    refused_here(capsys, ["validate", "--collectives", maxed, train], "timed op max")
    cores = tmp_path / "cores"
    shutil.copytree(train, cores)
    meta = json.loads((cores / "meta.json").read_text())
    (cores / "meta.json").write_text(json.dumps({**meta, "cpu_count": meta["cpu_count"] + 1}))
    refused_here(capsys, ["validate", "--collectives", coll, cores], "cpu_count")
    # a training run without its traces
    bare = tmp_path / "bare"
    shutil.copytree(train, bare, ignore=shutil.ignore_patterns("*.pt.trace.json*"))
    refused_here(capsys, ["validate", "--collectives", coll, bare], "has no traces")
    # collectives without the one DDP needs
    partial = tmp_path / "partial"
    shutil.copytree(coll, partial)
    rows = pd.read_csv(partial / "results.csv")
    rows[rows["collective"] != "all_reduce"].to_csv(partial / "results.csv", index=False)
    refused_here(capsys, ["validate", "--collectives", partial, train], "no native all_reduce")
    # the runs swapped, a folder that is not a run
    refused_here(
        capsys, ["validate", "--collectives", train, coll], "not a --sweep message_size run"
    )
    refused_here(capsys, ["validate", "--collectives", tmp_path, train], "not a run folder")
    # what-if: unknown link, negative world size, bad speed-up
    args = ["whatif", "--collectives", coll, "--compute", train]
    refused_here(capsys, [*args, "--link", "infiniband9"], "unknown link preset")
    refused_here(capsys, [*args, "--world-size", "8,-2"], "world size -2 must be at least 1")
    refused_here(capsys, [*args, "--speedup", "0"], "must be positive")
    refused_here(capsys, ["whatif", "--collectives", coll, "--compute", coll], "collectives run")
