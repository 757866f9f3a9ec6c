"""``python -m bench.analysis TRACE_DIR``: the tables of a folder of per-rank traces."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from bench.analysis import critical_cli, mfu_cli
from bench.analysis.trace import TraceError
from bench.analysis.trace_folder import DEFINITIONS, analyse, load_trace_dir
from bench.console import records
from bench.runfolder.atomic import OutputError, write_tables


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.analysis", description="Analyse a folder of per-rank Kineto traces."
    )
    p.add_argument("trace_dir", type=Path)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--csv", type=Path, metavar="DIR", help="also write each table as DIR/<t>.csv")
    p.add_argument(
        "--definitions",
        choices=sorted(DEFINITIONS),
        default="suite",
        help="the ranks table: every traced step totalled (suite, the default), or exactly "
        "HolisticTraceAnalysis's figures (hta: its last step left out; GPU traces only)",
    )
    critical_cli.add_arguments(p)
    mfu_cli.add_arguments(p)
    args = p.parse_args(argv)
    if args.critical_path or args.what_if or args.step or args.all_steps:
        return critical_cli.run(args)
    if args.mfu or args.device_profile:
        return mfu_cli.run(args)

    try:
        ts = load_trace_dir(args.trace_dir, digest_each=True, definitions=args.definitions)
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for problem in ts.problems:
        print(f"warning: {problem}", file=sys.stderr)
    tables = analyse(ts)
    if args.csv:
        try:
            write_tables(args.csv, tables)
        except OutputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    if args.json:
        print(
            json.dumps(
                {name: records(df) for name, df in tables.items()}
                | {"problems": ts.problems, "definitions": args.definitions}
            )
        )
        return 0
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        for name, df in tables.items():
            label = f" ({args.definitions} definitions)" if name == "ranks" else ""
            print(f"\n== {name}{label} ==")
            print(
                df.to_string(index=False, float_format=lambda v: f"{v:.2f}")
                if len(df)
                else "(none)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
