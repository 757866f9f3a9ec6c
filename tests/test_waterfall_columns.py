"""The MFU waterfall as results.csv's columns (bench/runner/measure/waterfall_columns.py) and as
the report's section (bench/report/waterfall_section.py). A row's parts are checked against the
profiled steps' own spans, read from the trace file here, and the ideal part against
FlopCounterMode's count of the same step at the test roofline's peak."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.axes import Axes
from torch.utils.flop_counter import FlopCounterMode

from bench.analysis.breakdown import load_trace
from bench.report import waterfall_section as section
from bench.report.page import write_report
from bench.roofline.profile import from_json
from bench.runfolder import columns
from bench.runfolder.schema import read_run
from bench.runner.measure import waterfall_columns as wc
from bench.runner.train.figures import aggregate
from tests.profiled_loop import model, profiled, train_step
from tests.report_fixtures import NO_SHAPES, WATERFALL_SHARES, add_waterfall, make_training_run

pytestmark = pytest.mark.unit

PEAK_TFLOPS = 40.0
ROOFLINE = from_json(
    {
        "format": "parallel-bench roofline 1",
        "device": "test device",
        "source": "written by the test",
        "peak_tflops": {"fp32": PEAK_TFLOPS},
        "memory_GBps": 100.0,
        "matmul": {"fp32": {"sizes": [1e3, 1e9], "efficiency": [0.5, 0.9]}},
        "memory": {"sizes": [1e3, 1e8], "efficiency": [0.5, 0.9]},
        "launch_us": 1.0,
    }
)
# the parts that add up to the step: the matmuls unsplit, and the rest
SUMMED = [c for c in wc.PARTS_MS if c not in ("wf_ideal_ms", "wf_matmul_loss_ms")]


def _step_mean_ms(trace: Path) -> float:
    """The profiled steps' mean length, from the file's ProfilerStep spans."""
    events = json.loads(trace.read_text())["traceEvents"]
    durs = [e["dur"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert len(durs) == 3
    return float(np.mean(durs)) / 1e3


@pytest.fixture
def test_roofline(monkeypatch):
    """The test's roofline in place of this host's (which a first run would measure)."""
    monkeypatch.setattr(wc, "device_roofline", lambda device: (ROOFLINE, "test device (test)"))


def test_a_rows_parts_add_up_to_the_profiled_step(tmp_path, test_roofline):
    traces = [profiled(tmp_path / f"rank{r}") for r in range(2)]
    ranks = [wc.waterfall_columns(load_trace(t), torch.device("cpu")) for t in traces]
    for trace, row in zip(traces, ranks, strict=True):
        assert sum(row[c] for c in SUMMED) == pytest.approx(_step_mean_ms(trace), rel=0.01)
        assert row["wf_ideal_ms"] + row["wf_matmul_loss_ms"] == pytest.approx(row["wf_matmul_ms"])
        assert row["wf_profile"] == "test device (test)" and row["wf_unpriced"] == ""
    m, opt, x = model()
    with FlopCounterMode(display=False) as counter:
        train_step(m, opt, x)
    ideal_ms = counter.get_total_flops() / (PEAK_TFLOPS * 1e12) * 1e3
    assert ranks[0]["wf_ideal_ms"] == pytest.approx(ideal_ms, rel=1e-6)
    # over ranks, as the harness makes the point's row: each part the ranks' mean
    assert {c.name for c in columns.TRAINING if c.ranks == "mean"} >= set(wc.PARTS_MS)
    row = aggregate(ranks)
    mean_step = np.mean([_step_mean_ms(t) for t in traces])
    assert sum(row[c] for c in SUMMED) == pytest.approx(mean_step, rel=0.01)
    assert set(row) <= set(columns.written(columns.TRAINING))  # the writer takes them


def test_a_trace_without_shapes_leaves_the_split_empty(tmp_path, test_roofline):
    trace = profiled(tmp_path, record_shapes=False)
    row = wc.waterfall_columns(load_trace(trace), torch.device("cpu"))
    assert math.isnan(row["wf_ideal_ms"]) and math.isnan(row["wf_matmul_loss_ms"])
    assert row["wf_matmul_ms"] > 0 and "no shapes" in row["wf_unpriced"]
    assert sum(row[c] for c in SUMMED) == pytest.approx(_step_mean_ms(trace), rel=0.01)


def test_a_failed_waterfall_costs_the_cells_not_the_point(tmp_path, monkeypatch):
    def broken(device):
        raise RuntimeError("no roofline today\nsecond line")

    monkeypatch.setattr(wc, "device_roofline", broken)
    trace = profiled(tmp_path)
    row = wc.waterfall_columns(load_trace(trace), torch.device("cpu"))
    assert all(math.isnan(row[c]) for c in wc.PARTS_MS)
    assert row["wf_unpriced"] == "waterfall failed: RuntimeError: no roofline today"


POINTS = {("wide_mlp", v, "native"): ms for v, ms in ((1.0, 120.0), (25.0, 100.0), (100.0, 90.0))}
UNPRICED, MISSING = "wide_mlp-bucket_cap_mb=25-native", "wide_mlp-bucket_cap_mb=100-native"


def test_the_report_section_draws_the_parts_and_says_where_cells_are_empty(tmp_path, monkeypatch):
    run = add_waterfall(
        make_training_run(tmp_path / "run", POINTS, rounds=1, steps=5),
        unpriced=(UNPRICED,),
        missing=(MISSING,),
    )
    ok = read_run(run).results
    drawn: dict[str, np.ndarray] = {}
    barh = Axes.barh

    def record(self, y, width, *args, **kwargs):
        drawn[kwargs["label"]] = np.asarray(width, dtype=float)
        return barh(self, y, width, *args, **kwargs)

    monkeypatch.setattr(Axes, "barh", record)
    html = "".join(section.waterfall_sections(ok))
    # two bars (the third point has no waterfall), each adding up to its window
    windows = ok.set_index("point").loc[["wide_mlp-bucket_cap_mb=1-native", UNPRICED]]
    assert sum(drawn.values()) == pytest.approx(windows["window_ms"].to_numpy())
    ideal = drawn["ideal: FLOPs at the peak (the achieved MFU)"]
    assert ideal == pytest.approx([WATERFALL_SHARES["wf_ideal_ms"] * 120.0, 0.0])
    assert drawn["matmul/attention/conv, not priced"] == pytest.approx([0.0, 40.0])
    assert "MFU %" in html and "12.00 (10.0 %)" in html  # ms and % of the step
    assert "No waterfall (empty wf_* cells) for wide_mlp 100 native" in html
    assert f"for wide_mlp 25 native: {NO_SHAPES}" in html
    assert "priced on test CPU (measured by the fixture)" in html


def test_the_page_shows_the_section_or_says_there_is_none(tmp_path):
    bare = make_training_run(tmp_path / "bare", POINTS, rounds=1, steps=5)
    page = write_report(bare, tmp_path / "reports")[0].read_text()
    assert "No MFU waterfall: every point&#x27;s wf_* cells are empty." in page
    before = read_run(bare).results.drop(columns=list(section.COLUMNS))
    assert "before schema 2.15" in section.waterfall_sections(before)[1]
    run = add_waterfall(make_training_run(tmp_path / "run", POINTS, rounds=1, steps=5))
    page = write_report(run, tmp_path / "reports")[0].read_text()
    assert "<h2>Where MFU goes</h2>" in page and 'alt="Where MFU goes' in page
    assert page.index("<h2>Where the step goes</h2>") < page.index("<h2>Where MFU goes</h2>")
    assert "https://" not in page and "http://" not in page
