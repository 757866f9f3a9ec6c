"""The analyser against HolisticTraceAnalysis's own figures on real NCCL traces, and its readers
(streamed, whole, event by event) against each other."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.analysis import breakdown as analysis
from bench.analysis import interval_sets as iv
from bench.analysis import reader as trace_reader
from bench.analysis import trace_folder as trace_folder

DATA = Path(__file__).parent / "data" / "hta"
REPO = Path(__file__).resolve().parents[1]
# traceinsight 0.6.1, default options (tests/data/hta/README.md)
EXPECTED = {
    "sampled_rank-0.json.gz": (0, 53.56, 17.71, 28.74, 600058, 11.81),
    "sampled_rank-1.json.gz": (1, 54.72, 22.57, 22.72, 600674, 20.05),
    "nccl_data.json.gz": (0, 77.78, 17.26, 4.97, 435586, 14.31),
}
GROUPS = [["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"], ["nccl_data.json.gz"]]


def folder_of(tmp_path: Path, files: list[str]) -> Path:
    d = tmp_path / "_".join(f.split(".")[0] for f in files)
    d.mkdir()
    for f in files:
        shutil.copy(DATA / f, d / f)
    return d


@pytest.mark.unit
@pytest.mark.parametrize("files", GROUPS, ids=["sampled_pair", "nccl_data"])
def test_temporal_breakdown_and_overlap_agree_with_hta(tmp_path, files):
    ts = trace_folder.load_trace_dir(folder_of(tmp_path, files))
    for f in files:
        rank, idle, compute, non_compute, kernel_time, overlap = EXPECTED[f]
        row = analysis.hta_summary(next(t for t in ts.traces if t.path.name == f))
        assert row["rank"] == rank
        assert row["kernel_time_us"] == pytest.approx(kernel_time, abs=1)
        assert row["idle_pct"] == pytest.approx(idle, abs=0.1)
        assert row["compute_pct"] == pytest.approx(compute, abs=0.1)
        assert row["non_compute_pct"] == pytest.approx(non_compute, abs=0.1)
        assert row["comm_comp_overlap_pct"] == pytest.approx(overlap, abs=0.1)
        assert row["gpu_util_pct"] == pytest.approx(100 - idle, abs=0.1)


@pytest.mark.unit
def test_collectives_from_nccl_metadata(tmp_path):
    tables = trace_folder.analyse(trace_folder.load_trace_dir(folder_of(tmp_path, GROUPS[1])))
    coll = tables["collectives"].set_index("collective")
    ar = coll.loc["all_reduce"]
    assert ar["calls"] > 0 and ar["bytes"] > 0 and ar["busbw_GBps"] > 0
    # world size 2: busbw = algbw x 2(n-1)/n = algbw
    assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"])
    steps = tables["steps"]
    assert (steps["gpu_util_pct"] > 0).all() and steps["cpu_busy_pct"].isna().all()


@pytest.mark.unit
def test_cross_rank_wait_split_on_the_sampled_pair(tmp_path):
    tables = trace_folder.analyse(trace_folder.load_trace_dir(folder_of(tmp_path, GROUPS[0])))
    coll = tables["collectives"]
    assert set(coll["rank"]) == {0, 1}
    both = coll.groupby("collective")["transfer_us"].nunique()
    assert (both == 1).all()  # the transfer time of a call is shared by its ranks
    for row in coll.itertuples():
        assert row.wait_us + row.transfer_us == pytest.approx(row.total_us)
    assert len(tables["stragglers"]) >= 1


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_step_totals_are_the_whole_span_figures(name):
    """The steps' device windows follow each other without gap from the first step's start to
    the last one's end, so the per-step table's totals are the whole span's figures, computed
    here as HTA does (idle = span - |union of device events| ...): the device's idle time
    between steps (before each step's first kernel) is in a step, not lost."""
    trace = analysis.load_trace(DATA / name)
    steps = analysis.breakdown(trace)
    ev = analysis.prepared(trace)
    dev = ev[ev["stream"] >= 0]
    assert (dev["step"] >= 0).all()  # every device event was launched by a traced step
    cpu_steps = ev[(ev["stream"] < 0) & ev["name"].astype(str).str.startswith("ProfilerStep#")]
    lo = min(cpu_steps["ts"].min(), dev["ts"].min())
    hi = max((cpu_steps["ts"] + cpu_steps["dur"]).max(), (dev["ts"] + dev["dur"]).max())

    def union(mask):
        return iv.union(iv.as_intervals(dev.loc[mask, "ts"], (dev["ts"] + dev["dur"])[mask]))

    def length(mask) -> float:
        return iv.length(iv.clip(union(mask), lo, hi))

    compute, comm = dev["kind"] == "compute", dev["kind"] == "comm"
    busy = length(dev["kind"].notna())
    total = steps.sum(numeric_only=True)
    assert len(steps) == cpu_steps["name"].nunique()
    assert total["window_us"] == pytest.approx(hi - lo)
    assert total["idle_us"] == pytest.approx(hi - lo - busy)
    assert total["compute_us"] == pytest.approx(length(compute))
    assert total["comm_us"] == pytest.approx(length(comm))
    assert total["memory_us"] == pytest.approx(length(dev["kind"] == "memory"))
    both = iv.intersect(union(compute), union(comm))
    assert total["overlap_us"] == pytest.approx(iv.length(iv.clip(both, lo, hi)))
    # the ranks row is the same totals, over the same (every) step, as on CPU traces
    row = analysis.rank_summary(trace, steps)
    assert row["steps"] == len(steps)
    assert row["kernel_time_us"] == pytest.approx(hi - lo)
    assert row["idle_pct"] == pytest.approx(100 * (hi - lo - busy) / (hi - lo))
    assert row["gpu_util_pct"] == pytest.approx(100 * busy / (hi - lo))


@pytest.mark.unit
def test_the_ranks_row_keeps_every_step_on_cpu_and_gpu(tmp_path):
    """One rule for the ranks table: every traced step, on GPU traces as on CPU traces (HTA's
    filter, which leaves out the last step as if it were cut short, is only ``hta_summary``'s)."""
    run = REPO / "tests" / "data" / "runs" / "bucket2" / "traces" / "mlp-bucket_cap_mb=25-native"
    for folder in (folder_of(tmp_path, GROUPS[1]), run):
        tables = trace_folder.analyse(trace_folder.load_trace_dir(folder))
        steps = tables["steps"].groupby("rank")
        for row in tables["ranks"].itertuples():
            mine = steps.get_group(row.rank)
            assert row.steps == len(mine) >= 2
            assert row.kernel_time_us == pytest.approx(mine["window_us"].sum())
            assert row.idle_pct == pytest.approx(100 * mine["idle_us"].sum() / row.kernel_time_us)


def _summary(path):
    return analysis.rank_summary(analysis.load_trace(path)) | {
        f"hta_{k}": v for k, v in analysis.hta_summary(analysis.load_trace(path)).items()
    }


@pytest.mark.unit
@pytest.mark.parametrize("name", ["nccl_data.json.gz", "sampled_rank-0.json.gz"])
def test_every_reading_path_gives_the_same_answer(tmp_path, monkeypatch, name):
    whole = _summary(DATA / name)
    # tiny chunks: the Kineto-layout file is cut into many batches; the other into events
    monkeypatch.setattr(trace_reader, "CHUNK", 4096)
    monkeypatch.setattr(trace_reader, "WHOLE_LIMIT", 4096)
    streamed = _summary(DATA / name)
    assert streamed.keys() == whole.keys()
    for key, value in whole.items():
        if isinstance(value, float):
            assert streamed[key] == pytest.approx(value, nan_ok=True), key
        else:
            assert streamed[key] == value, key


@pytest.mark.e2e
def test_command_line_json_has_the_promised_keys(tmp_path):
    d = folder_of(tmp_path, GROUPS[1])
    proc = subprocess.run(
        [sys.executable, "-m", "bench.analysis", str(d), "--json", "--csv", str(tmp_path / "csv")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rank = out["ranks"][0]
    for key in (
        "rank",
        "idle_pct",
        "compute_pct",
        "non_compute_pct",
        "comm_comp_overlap_pct",
        "gpu_util_pct",
    ):
        assert key in rank
    # the ranks row is the steps' totals
    steps = out["steps"]
    window = sum(s["window_us"] for s in steps)
    assert rank["idle_pct"] == pytest.approx(100 * sum(s["idle_us"] for s in steps) / window)
    assert rank["steps"] == len(steps) == 3
    assert "1 of 2 ranks have no trace here" in proc.stderr
    assert (tmp_path / "csv" / "ranks.csv").exists() and (tmp_path / "csv" / "steps.csv").exists()


@pytest.mark.unit
def test_the_command_line_gives_htas_own_figures_with_definitions_hta(tmp_path, capsys):
    """``--definitions hta``: the ranks table is HTA's figures to its rounding (HTA leaves
    the last step out); the default totals every traced step and differs by points."""
    from bench.analysis.__main__ import main

    d = folder_of(tmp_path, GROUPS[0])
    assert main([str(d), "--json", "--definitions", "hta"]) == 0
    hta = json.loads(capsys.readouterr().out)
    assert hta["definitions"] == "hta"
    assert main([str(d), "--json"]) == 0
    suite = json.loads(capsys.readouterr().out)
    assert suite["definitions"] == "suite"
    for got, ours in zip(hta["ranks"], suite["ranks"], strict=True):
        rank, idle, compute, non_compute, kernel_time, overlap = EXPECTED[got["file"]]
        assert (got["rank"], got["steps"]) == (rank, 1)
        assert got["kernel_time_us"] == pytest.approx(kernel_time, abs=1)
        for key, want in (
            ("idle_pct", idle),
            ("compute_pct", compute),
            ("non_compute_pct", non_compute),
            ("comm_comp_overlap_pct", overlap),
        ):
            assert got[key] == pytest.approx(want, abs=0.01), key
        assert ours["steps"] == 2 and abs(ours["idle_pct"] - idle) > 0.5  # the last step in
    assert main([str(d), "--definitions", "hta"]) == 0
    assert "== ranks (hta definitions) ==" in capsys.readouterr().out


@pytest.mark.unit
def test_definitions_hta_on_cpu_traces_says_it_has_no_figures(tmp_path, capsys):
    from bench.analysis.__main__ import main

    cpu = next(p for p in sorted((REPO / "tests" / "data" / "runs").rglob("*.pt.trace.json*")))
    d = tmp_path / "cpu"
    d.mkdir()
    shutil.copy(cpu, d / cpu.name)
    assert main([str(d), "--json", "--definitions", "hta"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ranks"][0]["steps"] == 0
    assert "--definitions hta: HolisticTraceAnalysis figures GPU kernels only" in captured.err


@pytest.mark.unit
def test_the_report_with_definitions_hta_shows_htas_figures_per_point(tmp_path):
    from bench.report.page import write_report
    from tests.report_fixtures import make_training_run

    run = make_training_run(
        tmp_path / "run", {("mlp", 1.0, "native"): 5.0, ("mlp", 25.0, "native"): 6.0}
    )
    points = pd.read_csv(run / "results.csv")["point"].unique()
    for point in points:  # the HTA pair stands for each point's traces
        folder = run / "traces" / point
        folder.mkdir(parents=True, exist_ok=True)
        for f in GROUPS[0]:
            shutil.copy(DATA / f, folder / f)
    plain, _ = write_report(run, tmp_path / "reports", timelines="none")
    assert "<h2>HolisticTraceAnalysis's figures</h2>" not in plain.read_text()
    out, _ = write_report(run, tmp_path / "reports-hta", timelines="none", definitions="hta")
    page = out.read_text()
    assert "<h2>HolisticTraceAnalysis's figures</h2>" in page
    for point in points:
        assert page.count(f">{point}<") >= 2  # one row per rank
    assert "53.56" in page and "54.72" in page  # HTA's idle % of the two ranks
