"""The analyser against HolisticTraceAnalysis, side by side in one run, and on a large folder.

    python -m bench.selftime.analysis_speed [--repeats 5] [--big-gb 1.0]

For each folder of ``tests/data/hta`` (the sampled pair together, nccl_data alone, as HTA's
reference figures were made) it times, in this process, load + temporal breakdown +
communication-computation overlap: ours (``load_trace_dir`` and ``hta_summary``) and, when
traceinsight is installed (``pip install -e '.[hta]'``), HTA's ``TraceAnalysis`` with
``get_temporal_breakdown`` and ``get_comm_comp_overlap``; it prints the median of each, their
ratio, and whether the figures agree. ``--big-gb`` also writes a folder of synthetic
Kineto-layout traces of that size and reports the time and peak memory (VmHWM) of our full
analysis of it, and of the critical path of its every step (``--critical-path``) beside it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import logging
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

from bench.analysis import breakdown as analysis
from bench.analysis import trace_folder as trace_folder
from bench.runner.measure.profiling import peak_rss_bytes, reset_peak_rss

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "hta"
GROUPS = {
    "sampled_rank pair": ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"],
    "nccl_data": ["nccl_data.json.gz"],
}


def ours(folder: Path) -> dict[int, tuple[float, float, float, float]]:
    ts = trace_folder.load_trace_dir(folder)
    out = {}
    for t in ts.traces:
        s = analysis.hta_summary(t)
        out[t.rank] = (
            s["idle_pct"],
            s["compute_pct"],
            s["non_compute_pct"],
            s["comm_comp_overlap_pct"],
        )
    return out


def hta(folder: Path) -> dict[int, tuple[float, float, float, float]]:
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(folder))
    tb = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    ov = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    return {
        int(r): (
            tb.loc[r, "idle_time_pctg"],
            tb.loc[r, "compute_time_pctg"],
            tb.loc[r, "non_compute_time_pctg"],
            ov.loc[r, "comp_comm_overlap_pctg"],
        )
        for r in tb.index
    }


def timed(fn, folder: Path, repeats: int) -> tuple[float, dict]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn(folder)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def big_folder(root: Path, gigabytes: float) -> Path:
    sys.path.insert(0, str(REPO))
    from tests.kineto_writer import gpu_step_events, write_trace

    folder = root / "big"
    folder.mkdir()
    files = 8
    steps = max(1, int(gigabytes * 1e9 / files / 21_500))  # ~21.5 kB of text per step
    for rank in range(files):
        meta = {"distributedInfo": {"rank": rank, "world_size": files, "backend": "nccl"}}
        write_trace(folder / f"rank{rank}.1.pt.trace.json", gpu_step_events(steps, 60, rank), meta)
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.selftime.analysis_speed")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--big-gb", type=float, default=0.0, help="also analyse a folder this large")
    args = p.parse_args(argv)
    have_hta = importlib.util.find_spec("hta") is not None
    if not have_hta:
        print("traceinsight is not installed (pip install -e '.[hta]'): timing ours alone")
    logging.disable(logging.INFO)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        for label, files in GROUPS.items():
            folder = Path(tmp) / label.replace(" ", "_")
            folder.mkdir()
            for f in files:
                shutil.copy(DATA / f, folder / f)
            t_ours, r_ours = timed(ours, folder, args.repeats)
            line = f"{label:<18} ours {t_ours * 1e3:7.1f} ms"
            if have_hta:
                t_hta, r_hta = timed(hta, folder, args.repeats)
                agree = all(
                    abs(a - b) <= 0.1
                    for r in r_hta
                    for a, b in zip(r_ours[r], r_hta[r], strict=True)
                )
                line += (
                    f"   HTA {t_hta * 1e3:7.1f} ms   HTA/ours {t_hta / t_ours:5.1f}x   "
                    f"figures agree to 0.1 pp: {'yes' if agree else 'NO'}"
                )
            print(line, flush=True)
        if args.big_gb > 0:
            folder = big_folder(Path(tmp), args.big_gb)
            size = sum(f.stat().st_size for f in folder.iterdir())
            gc.collect()
            reset_peak_rss()
            before = peak_rss_bytes()
            t0 = time.perf_counter()
            ts = trace_folder.load_trace_dir(folder, digest_each=True)
            tables = trace_folder.analyse(ts)
            elapsed = time.perf_counter() - t0
            print(
                f"{size / 1e9:.2f} GB folder ({len(ts.traces)} traces, "
                f"{sum(t.n_events for t in ts.traces):,} events): full analysis "
                f"{elapsed:.1f} s, peak memory +{(peak_rss_bytes() - before) / 1e6:.0f} MB "
                f"({len(tables['steps'])} step rows)"
            )
            critical_path_speed(folder, elapsed)
    return 0


def critical_path_speed(folder: Path, analysis_s: float) -> None:
    """The critical path of every step of the same folder, against the analysis just timed."""
    from bench.analysis.critical_path import folder_paths

    gc.collect()
    reset_peak_rss()
    before = peak_rss_bytes()
    t0 = time.perf_counter()
    paths, _ = folder_paths(folder)
    elapsed = time.perf_counter() - t0
    print(
        f"critical path of its {len(paths)} steps: {elapsed:.1f} s "
        f"({elapsed / analysis_s:.2f}x the analysis), peak memory "
        f"+{(peak_rss_bytes() - before) / 1e6:.0f} MB"
    )


if __name__ == "__main__":
    raise SystemExit(main())
