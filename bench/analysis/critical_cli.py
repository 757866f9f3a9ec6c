"""``python -m bench.analysis TRACE_DIR --critical-path``: each step's critical path across the
ranks, on the console or as JSON, with what-ifs (``--what-if``) and the three changes that
would save the most."""

from __future__ import annotations

import argparse
import json
import sys

from bench.analysis.critical_graph import CATEGORIES, GraphError
from bench.analysis.critical_path import LAST_STEPS, folder_paths
from bench.analysis.critical_what_if import best_changes, parse_change, what_if
from bench.analysis.trace import TraceError
from bench.console import records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--critical-path",
        action="store_true",
        help="each step's critical path across the ranks (docs/analysis.md), instead of tables",
    )
    p.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="CHANGE",
        help="with --critical-path: the step recomputed with a change (compute=0.8x, "
        "all_reduce=0.5x, link=2x, overhead=0.5x, rank1=1.0x-of-rank0); repeatable",
    )
    p.add_argument(
        "--step",
        type=int,
        action="append",
        help="with --critical-path: this step (repeatable; default the last 5 every rank holds)",
    )
    p.add_argument("--all-steps", action="store_true", help="with --critical-path: every step")


def run(args: argparse.Namespace) -> int:
    if not args.critical_path:
        print("error: --what-if, --step and --all-steps go with --critical-path", file=sys.stderr)
        return 2
    try:
        changes = [parse_change(s) for s in args.what_if]
        last = None if args.all_steps else LAST_STEPS
        paths, problems = folder_paths(args.trace_dir, args.step, last)
        results = [_result(sp, changes) for sp in paths]
    except (ValueError, TraceError, GraphError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"critical_path": results, "problems": problems}, default=float))
        return 0
    for problem in problems:
        print(f"warning: {problem}", file=sys.stderr)
    for r in results:
        print(_text(r))
    return 0


def _result(sp, changes) -> dict:
    s = dict(sp.summary)
    s["what_if"] = [what_if(sp.graph, [c]) for c in changes]
    s["best_changes"] = records(best_changes(sp.graph))
    s["path"] = records(sp.path)
    return s


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms"


def _text(r: dict) -> str:
    length = r["length_us"]
    ranks = ", ".join(map(str, r["ranks"]))
    lines = [f"\n== critical path, step {r['step']} (ranks {ranks}) =="]
    lines.append(f"length {_ms(length)}; the rank whose work sets it: {r['setting_rank']}")
    for c in CATEGORIES:
        v = r["categories_us"][c]
        if v > 0:
            lines.append(f"  {c:<26} {_ms(v):>12} {100 * v / length:6.1f} %")
    lines.append("  per rank: " + ", ".join(f"{k} {_ms(v)}" for k, v in r["ranks_us"].items()))
    lines.append("on the path:")
    lines += [f"  {t['share_pct']:5.1f} %  {_ms(t['us']):>12}  {t['label']}" for t in r["top"][:5]]
    for title, rows in (("what-if", r["what_if"]), ("would save the most", r["best_changes"])):
        if rows:
            lines.append(f"{title}:")
            lines += [
                f"  {w['what_if']:<24} {_ms(w['predicted_us']):>12}  saves {_ms(w['saves_us'])} "
                f"({w['saves_pct']:.1f} %)"
                for w in rows
            ]
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
