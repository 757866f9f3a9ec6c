"""``python -m bench.analysis TRACE_DIR --mfu [--device-profile FILE]``: the MFU waterfall of
every rank's trace (``waterfall.py``), on the console, as JSON or as CSV files.

The roofline is the file given, else the device's own: a CPU trace is priced on this host's
measured profile (``bench.roofline.measure.host_profile``), a GPU trace on the datasheet
profile of the GPU its ``deviceProperties`` names (``bench.roofline.datasheet``). Where none
is found the waterfall still gives the parts it can measure and says what it cannot price.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from bench.analysis.trace import Trace, TraceError
from bench.analysis.trace_folder import load_trace_dir
from bench.console import records
from bench.roofline.profile import Roofline, RooflineError, read
from bench.runfolder.atomic import OutputError, write_tables

TOP_CLASSES = 5  # op classes shown per rank on the console, by loss


def device_name(trace: Trace) -> str | None:
    """The GPU a trace ran on, as its ``deviceProperties`` names it."""
    props = trace.meta.get("deviceProperties") or []
    return props[0].get("name") if props and isinstance(props[0], dict) else None


def default_profile(trace: Trace) -> tuple[Roofline | None, str | None]:
    """(the device's own profile or None, why there is none)."""
    if not trace.is_gpu:
        try:
            from bench.roofline.measure import host_profile
        except ImportError as e:
            return None, f"no host profile ({e})"
        return host_profile("cpu"), None
    name = device_name(trace)
    if name is None:
        return None, "the trace names no GPU (no deviceProperties): give --device-profile"
    try:
        from bench.roofline.datasheet import datasheet_profile
    except ImportError as e:
        return None, f"no datasheet profiles ({e})"
    found = datasheet_profile(name)
    return found, None if found else f"no datasheet profile for {name}: give --device-profile"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mfu",
        action="store_true",
        help="the MFU waterfall per rank and step: from the peak down to the achieved MFU, "
        "and the op classes that lose the most (docs/analysis.md)",
    )
    p.add_argument(
        "--device-profile",
        type=Path,
        metavar="FILE",
        help="--mfu: the device's roofline (docs/roofline.md); default: this host's measured "
        "profile for a CPU trace, the datasheet's for the GPU a trace names",
    )


def run(args: argparse.Namespace) -> int:
    from bench.analysis.waterfall import waterfall  # torch is imported for --mfu alone

    try:
        given = read(args.device_profile) if args.device_profile else None
        ts = load_trace_dir(args.trace_dir)
    except (RooflineError, TraceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems = list(ts.problems)
    steps, classes, profiles = [], [], {}
    for trace in ts.traces:
        roofline, why = (given, None) if given else default_profile(trace)
        if why:
            problems.append(f"rank {trace.rank}: {why}")
        w = waterfall(trace, roofline)
        problems += [f"rank {trace.rank}: {u}" for u in w.unpriced]
        steps.append(w.steps)
        classes.append(w.classes)
        profiles[trace.rank] = (
            None if roofline is None else f"{roofline.device} ({roofline.source})"
        )
    tables = {
        "waterfall": pd.concat(steps, ignore_index=True),
        "op_classes": pd.concat(classes, ignore_index=True),
    }
    return _output(args, tables, problems, profiles)


def _output(args, tables: dict, problems: list[str], profiles: dict) -> int:
    if args.csv:
        try:
            write_tables(args.csv, tables)
        except OutputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if args.json:
        out = {name: records(df) for name, df in tables.items()}
        print(json.dumps(out | {"problems": problems, "profiles": profiles}))
        return 0
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    for rank, steps in tables["waterfall"].groupby("rank"):
        classes = tables["op_classes"][tables["op_classes"]["rank"] == rank]
        print(_text(rank, steps, classes, profiles.get(rank)))
    return 0


PARTS_SHOWN = (
    ("ideal", "ideal (FLOPs at peak)"),
    ("matmul_loss", "matmul/attention/conv loss"),
    ("matmul", "matmul/attention/conv (unsplit)"),
    ("memory_bound", "memory-bound ops"),
    ("recompute", "recomputation"),
    ("optimizer", "optimizer step"),
    ("exposed_comm", "exposed communication"),
    ("idle", "idle"),
    ("other", "other (outside any op)"),
)


def _text(rank, steps: pd.DataFrame, classes: pd.DataFrame, profile: str | None) -> str:
    """A rank's waterfall, its steps' mean, and its op classes that lose the most."""
    m = steps.mean(numeric_only=True)
    step = m["step_us"]
    lines = [f"\n== MFU waterfall, rank {rank} ({len(steps)} steps, against {profile}) =="]
    lines.append(f"{'step':<34}{step / 1e3:>10.3f} ms  100.0 %")
    split = pd.notna(m["ideal_us"])
    hidden = ("matmul",) if split else ("ideal", "matmul_loss")  # split where it can be
    for key, label in PARTS_SHOWN:
        if key not in hidden:
            us = m[f"{key}_us"]
            lines.append(f"{label:<34}{us / 1e3:>10.3f} ms {100 * us / step:>6.1f} %")
    worst = steps["closure_pct"].abs().max()
    mfu = f"{m['mfu_pct']:.2f} %" if split else "not priced"
    lines.append(f"MFU {mfu}; parts add up to the step within {worst:.3f} % (max over steps)")
    top = classes.dropna(subset=["loss_us"]).head(TOP_CLASSES)
    if len(top):
        lines.append("top op classes by loss (time beyond the roofline, all steps):")
        lines.append(
            top[["op", "part", "calls", "time_us", "roofline_us", "loss_us"]].to_string(
                index=False, float_format=lambda v: f"{v:.1f}"
            )
        )
    return "\n".join(lines)
