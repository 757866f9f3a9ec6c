"""The analyser against HolisticTraceAnalysis's own figures on real NCCL traces, and its readers
(streamed, whole, event by event) against each other."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.analysis import breakdown as analysis
from bench.analysis import folder as trace_folder
from bench.analysis import reader as trace_reader

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


@pytest.mark.parametrize("files", GROUPS, ids=["sampled_pair", "nccl_data"])
def test_temporal_breakdown_and_overlap_agree_with_hta(tmp_path, files):
    ts = trace_folder.load_trace_dir(folder_of(tmp_path, files))
    ranks = trace_folder.analyse(ts)["ranks"].set_index("file")
    for f in files:
        rank, idle, compute, non_compute, kernel_time, overlap = EXPECTED[f]
        row = ranks.loc[f]
        assert row["rank"] == rank
        assert row["kernel_time_us"] == pytest.approx(kernel_time, abs=1)
        assert row["idle_pct"] == pytest.approx(idle, abs=0.1)
        assert row["compute_pct"] == pytest.approx(compute, abs=0.1)
        assert row["non_compute_pct"] == pytest.approx(non_compute, abs=0.1)
        assert row["comm_comp_overlap_pct"] == pytest.approx(overlap, abs=0.1)
        assert row["gpu_util_pct"] == pytest.approx(100 - idle, abs=0.1)


def test_collectives_from_nccl_metadata(tmp_path):
    tables = trace_folder.analyse(trace_folder.load_trace_dir(folder_of(tmp_path, GROUPS[1])))
    coll = tables["collectives"].set_index("collective")
    ar = coll.loc["all_reduce"]
    assert ar["calls"] > 0 and ar["bytes"] > 0 and ar["busbw_GBps"] > 0
    # world size 2: busbw = algbw x 2(n-1)/n = algbw
    assert ar["busbw_GBps"] == pytest.approx(ar["algbw_GBps"])
    steps = tables["steps"]
    assert (steps["gpu_util_pct"] > 0).all() and steps["cpu_busy_pct"].isna().all()


def test_cross_rank_wait_split_on_the_sampled_pair(tmp_path):
    tables = trace_folder.analyse(trace_folder.load_trace_dir(folder_of(tmp_path, GROUPS[0])))
    coll = tables["collectives"]
    assert set(coll["rank"]) == {0, 1}
    both = coll.groupby("collective")["transfer_us"].nunique()
    assert (both == 1).all()  # the transfer time of a call is shared by its ranks
    for row in coll.itertuples():
        assert row.wait_us + row.transfer_us == pytest.approx(row.total_us)
    assert len(tables["stragglers"]) >= 1


def _summary(path):
    return analysis.rank_summary(analysis.load_trace(path))


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
    assert rank["idle_pct"] == pytest.approx(77.78, abs=0.1)
    assert out["steps"] and "window_us" in out["steps"][0]
    assert "1 of 2 ranks have no trace here" in proc.stderr
    assert (tmp_path / "csv" / "ranks.csv").exists() and (tmp_path / "csv" / "steps.csv").exists()
