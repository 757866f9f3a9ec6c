"""Bad input to the analyser: clear messages naming the file, the valid part still analysed,
exit status 2 when nothing is usable; and memory that does not grow with the file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.analysis import trace_folder as trace_folder
from tests.kineto_writer import gpu_step_events, write_trace

REPO = Path(__file__).resolve().parents[1]


def run_cli(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.analysis", str(folder), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def dist(rank: int, world: int) -> dict:
    return {"distributedInfo": {"rank": rank, "world_size": world, "backend": "nccl"}}


@pytest.mark.e2e
def test_an_empty_folder_is_exit_2(tmp_path):
    proc = run_cli(tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == f"error: {tmp_path}: no trace files (*.pt.trace.json, "
        "*.json.gz) in it"
    )


@pytest.mark.e2e
def test_a_missing_folder_is_exit_2(tmp_path):
    proc = run_cli(tmp_path / "nope")
    assert proc.returncode == 2 and "not a folder" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_only_broken_files_is_exit_2_naming_them(tmp_path):
    (tmp_path / "a.pt.trace.json").write_text('{"traceEvents": [{"ph": "X"')
    (tmp_path / "b.json").write_text("not json at all")
    proc = run_cli(tmp_path)
    assert proc.returncode == 2
    assert "a.pt.trace.json: truncated" in proc.stderr and "b.json" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.e2e
def test_valid_traces_are_analysed_beside_broken_mixed_and_missing_ones(tmp_path):
    events = gpu_step_events(steps=3, kernels_per_step=8)
    write_trace(tmp_path / "rank0.1.pt.trace.json", events, dist(0, 4))
    write_trace(tmp_path / "rank1.1.pt.trace.json", gpu_step_events(3, 8, rank=1), dist(1, 4))
    write_trace(tmp_path / "other.1.pt.trace.json", events, dist(0, 8))  # another run
    text = (tmp_path / "rank0.1.pt.trace.json").read_text()
    (tmp_path / "rank2.1.pt.trace.json").write_text(text[: len(text) // 2])  # truncated
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert sorted(r["rank"] for r in out["ranks"]) == [0, 1]
    err = proc.stderr
    assert "rank2.1.pt.trace.json: truncated after" in err
    assert "other.1.pt.trace.json: from another run (world size 8" in err
    assert "2 of 4 ranks have no trace here (2, 3)" in err
    assert len(out["problems"]) == 3


@pytest.mark.unit
def test_two_traces_of_one_rank_keep_the_newer(tmp_path):
    import os

    old = write_trace(tmp_path / "rank0.1.pt.trace.json", gpu_step_events(2, 4), dist(0, 1))
    new = write_trace(tmp_path / "rank0.2.pt.trace.json", gpu_step_events(3, 4), dist(0, 1))
    os.utime(old, (1, 1))
    ts = trace_folder.load_trace_dir(tmp_path)
    assert [t.path.name for t in ts.traces] == [new.name]
    assert any("rank 0 has a newer trace" in p for p in ts.problems)


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_memory_does_not_grow_with_the_file(tmp_path):
    """~64 MB of trace text in 363,000 events: reading it keeps columns, not a dict per event.
    ``json.load`` of it grows the process by about 310 MB here (850 bytes per event)."""
    path = write_trace(tmp_path / "big.pt.trace.json", gpu_step_events(3000, 60), dist(0, 1))
    size = path.stat().st_size
    assert size > 60e6
    # VmHWM (peak resident memory) belongs to this process image; ru_maxrss would carry the
    # parent's peak across exec.
    code = (
        "from bench.analysis.trace import load_trace\n"
        "from bench.runner.measure.profiling import peak_rss_bytes\n"
        "before = peak_rss_bytes()\n"
        f"t = load_trace({str(path)!r})\n"
        "print(len(t.events), peak_rss_bytes() - before)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=200, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    n_events, grown = map(int, proc.stdout.split())
    assert n_events == 3000 * (1 + 2 * 60)
    # typed columns: under 150 bytes an event, plus one read chunk and its decoded batch
    limit = 150 * n_events + 16e6
    assert 0 < grown < limit, f"peak memory grew by {grown / 1e6:.0f} MB (limit {limit / 1e6:.0f})"


def profiler_trace(path: Path, name: str) -> Path:
    """A real trace: torch's profiler on the CPU, one ``record_function`` named ``name``."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function(name):
        torch.ones(4).add_(1)
    prof.export_chrome_trace(str(path))
    return path


@pytest.mark.unit
def test_a_quote_in_a_record_function_name_is_named_not_called_truncation(tmp_path):
    """torch's profiler writes a name as given, so a ``"`` in it breaks the JSON mid-file: the
    reader says what is wrong and where, not that the file ended early."""
    from bench.analysis.reader import TraceError, read_trace

    path = profiler_trace(tmp_path / "quote.pt.trace.json", 'a"b')
    text = path.read_text()
    assert '"name": "a"b"' in text  # torch's own output: the quote is not escaped
    with pytest.raises(TraceError) as e:
        read_trace(path)
    message = str(e.value)
    assert "truncated" not in message, message
    at = text.index('"a"b"')
    assert f"{path}: invalid JSON at byte " in message
    byte = int(message.split("at byte ")[1].split()[0])
    assert at < byte < at + 8  # where it breaks: just past the name's second quote
    assert f"line {text[:at].count(chr(10)) + 1}" in message
    assert "unescaped quote" in message and 'a"b' in message  # what, and an excerpt
    assert len(message.splitlines()) == 1


@pytest.mark.unit
def test_a_trace_cut_anywhere_in_its_events_says_truncated(tmp_path):
    """A real trace cut at any character of its events is truncated, never 'invalid'."""
    from bench.analysis.reader import TraceError, read_trace

    text = profiler_trace(tmp_path / "whole.pt.trace.json", "step").read_text()
    cut = tmp_path / "cut.pt.trace.json"
    start = text.index('"traceEvents"')
    for end in range(start + 20, len(text.rstrip()) - 1, 3):
        cut.write_text(text[:end])
        with pytest.raises(TraceError) as e:
            read_trace(cut)
        assert f"{cut}: truncated" in str(e.value), (end, text[end - 20 : end], str(e.value))
