"""``python -m bench.report RUN_DIR [--baseline OLD] [--collectives COLL_RUN]
[--timelines best|all|none] [--diff POINT_A POINT_B] [--view POINT]``: the HTML report of a
run folder, its comparison with an earlier run, two of its points compared, and one point's
traces as an interactive timeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.report.page import write_report
from bench.report.timeline_section import TIMELINES, write_diff, write_view
from bench.runfolder.atomic import OutputError
from bench.runfolder.points import RunFolderError
from bench.runfolder.schema import read_run


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.report")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--reports-dir", type=Path, default=Path("reports"))
    p.add_argument("--baseline", type=Path, help="an earlier run to compare with, point by point")
    p.add_argument(
        "--collectives",
        type=Path,
        action="append",
        help="a --sweep message_size run of the same machine: adds the cost model's section",
    )
    p.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when a point is slower than in the baseline (the 95 %% interval of its "
        "ratio, over every point together, above 1)",
    )
    p.add_argument(
        "--timelines",
        choices=TIMELINES,
        default="best",
        help="step timelines in the report: each model and implementation's best and default "
        "point (best, the default), every point (all), or none",
    )
    p.add_argument(
        "--definitions",
        choices=("suite", "hta"),
        default="suite",
        help="hta: add each point's ranks exactly as HolisticTraceAnalysis figures them (its "
        "last step left out) beside the suite's own (every traced step)",
    )
    p.add_argument(
        "--diff",
        nargs=2,
        metavar=("POINT_A", "POINT_B"),
        help="instead of the report: the two points' step timelines, one above the other, and "
        "what changed per collective and operator (reports/<run>-diff.html)",
    )
    p.add_argument(
        "--view",
        metavar="POINT",
        help="instead of the report: the point's traces as an interactive timeline that needs "
        "no network, every rank's threads and streams (reports/<run>-<point>-trace.html)",
    )
    return p


def _print_comparison(cmp, fail_on_regression: bool) -> int:
    """Print the comparison with the baseline; 1 when a point regressed and that fails the run."""
    slower = cmp[cmp["regression"]]
    print(
        f"{len(cmp)} points compared: {(cmp['verdict'] == 'faster').sum()} faster, "
        f"{len(slower)} slower, {(cmp['verdict'] == 'tied').sum()} tied (95 %)"
        + "".join(
            f"\n  slower: {r.point} x{r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}]"
            for r in slower.itertuples()
        )
    )
    return 1 if fail_on_regression and len(slower) else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.diff or args.view:
            run = read_run(args.run_dir)
            if args.diff:
                print(f"diff: {write_diff(run, *args.diff, args.reports_dir)}")
            if args.view:
                print(f"trace view: {write_view(run, args.view, args.reports_dir)}")
            return 0
        out, cmp = write_report(
            args.run_dir,
            args.reports_dir,
            args.baseline,
            args.collectives,
            args.timelines,
            args.definitions,
        )
    except (RunFolderError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OutputError as e:  # a full disk: the page that was there is still whole
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"report: {out}")
    if cmp is not None:
        return _print_comparison(cmp, args.fail_on_regression)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
