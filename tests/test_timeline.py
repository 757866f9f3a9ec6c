"""Step timelines and the two-point diff, on a real 2-rank run: a DDP bucket sweep of wide_mlp
at 1, 25 and 100 MB buckets, PyTorch's DDP and ours with and without overlap (one launch, made
once with test_sequence.py's: conftest.py's ``ddp_sweep``).

- Where the communication bars sit with and without overlap: ``test_timeline_overlap.py``, run
  alone (it reads when gloo's thread got to run).
- The diff of the 1 MB and the 100 MB native points: the all-reduce count goes from several
  calls to one, the bytes unchanged.
- The report with every point's timeline renders in headless Chromium, every figure decoded.
- ``--view``: one point's traces as an interactive timeline that needs no network, every event
  of every rank drawn by headless Chromium.
- Bad input: an unknown point and a point without traces are one line and exit 2 for --diff
  and --view, and a note in the report, which still draws the rest; a trace with no profiler
  step too.
"""

import glob
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.analysis.breakdown import load_trace
from bench.analysis.timeline import step_timeline
from bench.analysis.trace_diff import trace_diff
from bench.analysis.trace_folder import load_trace_dir
from bench.report.__main__ import main as report_main
from bench.report.timeline_figure import _rows
from bench.report.trace_view import view_data
from tests.test_report_browser import CHROMIUM, FLAGS, needs_chromium

REPO = Path(__file__).resolve().parents[1]
POINT = "wide_mlp-bucket_cap_mb={}-{}"


@pytest.fixture(scope="module")
def run(ddp_sweep):
    """The shared sweep (tests/shared_runs.py): read here, copied where a test changes it."""
    return ddp_sweep


def report(*args, timeout=180) -> subprocess.CompletedProcess:
    """``python -m bench.report`` as a real process (the rest call its ``main`` in this one)."""
    return subprocess.run(
        [sys.executable, "-m", "bench.report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_the_diff_of_1mb_and_100mb_buckets_shows_several_all_reduces_become_one(
    run, tmp_path, capsys
):
    a, b = POINT.format(1, "native"), POINT.format(100, "native")
    code = report_main([str(run), "--diff", a, b, "--reports-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    page = (tmp_path / f"{run.name}-diff.html").read_text()
    assert page.count("<img") == 1 and "What changed" in page
    table = trace_diff(
        load_trace_dir(run / "traces" / a).traces, load_trace_dir(run / "traces" / b).traces
    )
    ar = table[(table["kind"] == "collective") & (table["name"] == "all_reduce")].iloc[0]
    assert ar["count_a"] > 1 and ar["count_b"] == 1, ar
    assert ar["bytes_a"] == pytest.approx(ar["bytes_b"]) and ar["bytes_change"] == 0, ar
    assert re.search(r"<td[^>]*>all_reduce</td>", page)
    ops = table[table["kind"] == "operator"]
    assert "Optimizer.step#AdamW.step" in set(ops["name"]), ops["name"].tolist()


@pytest.mark.e2e
@needs_chromium
@pytest.mark.timeout(600)
def test_the_report_with_every_timeline_renders_in_chromium(run, tmp_path, capsys):
    code = report_main([str(run), "--timelines", "all", "--reports-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    page = tmp_path / f"{run.name}.html"
    html = page.read_text()
    section = html[html.index("<h2>Step timelines</h2>") :]
    assert section.count("<figcaption>wide_mlp, ") == 3  # a figure per implementation
    dom = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    figures = re.search(r'data-figures="(\d+)/(\d+)"', dom.stdout)
    assert figures, dom.stdout[-2000:]
    assert figures.group(1) == figures.group(2) and int(figures.group(2)) >= 3, figures.group(0)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_points_that_cannot_be_drawn_are_one_line_or_a_note(run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "traces" / POINT.format(1, "native"))  # a point without traces
    stepless = copy / "traces" / POINT.format(100, "native")
    for path in stepless.glob("*.pt.trace.json"):  # a trace with no profiler step
        doc = json.loads(path.read_text())
        doc["traceEvents"] = [
            e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep")
        ]
        path.write_text(json.dumps(doc))
    for args, said in [
        (["--diff", "nope", POINT.format(1, "reference")], "has no point 'nope'"),
        (["--diff", POINT.format(1, "native"), POINT.format(1, "reference")], "no traces"),
        (
            ["--diff", POINT.format(100, "native"), POINT.format(1, "reference")],
            "no profiler step is in every rank's trace",
        ),
        (["--view", "nope"], "has no point 'nope'"),
        (["--view", POINT.format(1, "native")], "no traces"),
    ]:
        # main() in this process (a launch costs seconds); the first also as a real process
        code = report_main([str(a) for a in (copy, *args, "--reports-dir", tmp_path / "r")])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert said in err, err
    proc = report(
        copy, "--diff", "nope", POINT.format(1, "reference"), "--reports-dir", tmp_path / "r"
    )
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "has no point 'nope'" in proc.stderr, proc.stderr
    code = report_main([str(copy), "--timelines", "all", "--reports-dir", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err
    page = (tmp_path / "r" / "run.html").read_text()
    notes = re.findall(r"<p class='note'>([^<]*)</p>", page)
    assert any("no traces" in n for n in notes) and any("no profiler step" in n for n in notes)
    section = page[page.index("<h2>Step timelines</h2>") :]
    # native's 1 and 100 MB points are notes; its 25 MB point and the rest are drawn, a figure
    # per implementation (the fourth image is the page's computation-share chart, further on)
    assert section.count("<img") == 4
    assert f"25 ({POINT.format(25, 'native')})" in section  # the panel's label
    assert not any(f"{mb} ({POINT.format(mb, 'native')})" in section for mb in (1, 100))


@pytest.mark.e2e
@needs_chromium
@pytest.mark.timeout(600)
def test_the_offline_trace_view_draws_every_event_of_every_rank(run, tmp_path, capsys):
    point = POINT.format(1, "reference")
    code = report_main([str(run), "--view", point, "--reports-dir", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    page = tmp_path / f"{run.name}-{point}-trace.html"
    text = page.read_text()
    assert not re.search(r"(src|href)=['\"]?https?:", text)  # nothing fetched: works offline
    traces = load_trace_dir(run / "traces" / point).traces
    data = view_data(traces)
    events = sum(int((t.events["dur"] >= 0).sum()) for t in traces)
    assert len(data["start"]) == events
    labels = [lane["label"] for lane in data["lanes"]]
    assert {lab.split(" thread")[0] for lab in labels} == {"rank 0", "rank 1"}, labels
    dom = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    drawn = re.search(r'data-drawn="(\d+)"', dom.stdout)
    total = re.search(r'data-events="(\d+)"', dom.stdout)
    assert drawn and total, dom.stdout[-1500:]
    assert int(drawn.group(1)) == int(total.group(1)) == events  # the whole trace, every event


@pytest.mark.unit
def test_a_gpu_nccl_timeline_has_kernels_and_calls_with_bytes():
    """HolisticTraceAnalysis's two ranks of an NCCL job: device lanes, calls with bytes."""
    traces = [load_trace(p) for p in sorted(glob.glob(str(REPO / "tests/data/hta/sampled_*")))]
    tl = step_timeline(traces)
    assert sorted(tl["rank"].unique()) == [0, 1]
    calls = tl[tl["lane"] == "comm"]
    assert len(calls) and calls["bytes"].max() > 1e8, calls
    for rank, g in tl.groupby("rank"):
        lanes = set(g["lane"])
        assert {"compute", "comm", "phase"} <= lanes, (rank, lanes)
        bars = g[g["lane"].isin(["compute", "idle"])]
        assert (bars["end_ms"] >= bars["start_ms"]).all()


@pytest.mark.unit
def test_calls_in_flight_together_get_their_own_rows():
    starts, ends = np.array([0.0, 1.0, 2.0, 5.0]), np.array([3.0, 4.0, 2.5, 6.0])
    assert _rows(starts, ends) == [0, 1, 2, 0]


@pytest.mark.unit
def test_no_event_name_can_end_or_comment_out_the_views_data(tmp_path):
    """Names are data: ``</script>``, ``<!--<script>`` (which would leave the page blank) and
    ``&`` reach the viewer as they are, and the page's data element holds none of them raw."""
    from bench.report.trace_view import view_page

    traces = load_trace_dir(REPO / "tests/data/runs/bucket2/traces/mlp-bucket_cap_mb=1-native")
    traces = traces.traces
    hostile = ["<!--<script>", "</script><b>bold</b>", "a & b -->", "<\u2028>"]
    events = traces[0].events
    names = events["name"].astype(object).to_numpy().copy()
    names[: len(hostile)] = hostile
    events["name"] = names
    page = view_page(traces, "t")
    data = re.search(r"<script type='application/json' id='data'>(.*?)</script>", page, re.S)
    assert data, page[:500]
    for raw in ("<!--", "<script", "</", "-->", "&"):
        assert raw not in data.group(1), raw
    assert json.loads(data.group(1)) == json.loads(json.dumps(view_data(traces)))
    assert set(hostile) <= set(json.loads(data.group(1))["names"])


@pytest.mark.unit
def test_a_point_id_that_climbs_out_of_the_run_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(REPO / "tests/data/runs/bucket2", run)
    results = run / "results.csv"
    results.write_text(results.read_text().replace("mlp-bucket_cap_mb=1-native", "x/../../.."))
    for point in ("x/../../..", "../bucket2/traces/mlp-bucket_cap_mb=1-native"):
        code = report_main([str(run), "--view", point, "--reports-dir", str(tmp_path / "r")])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1, err
    assert not list(tmp_path.rglob("*.html"))  # no page written, inside or outside
