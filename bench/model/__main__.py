"""``python -m bench.model fit|validate|whatif``: the cost model from the command line.

    python -m bench.model fit --collectives RUN_DIR[,RUN_DIR]
    python -m bench.model validate --collectives RUN_DIR TRAINING_RUN_DIR... [--json]
    python -m bench.model whatif --collectives RUN_DIR --compute RUN_DIR \\
        --world-size 8,64,1024 [--link PRESET|alpha=..,beta=..] [--speedup 10] [--json]

Bad input (runs that are not runs, from different machines, without traces or without the
collectives a strategy needs; an unknown link; a world size below 1) prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from bench.console import fail, human_bytes, records
from bench.model.comm import FitError, load_runs
from bench.model.fitting import CONFIDENCE, RESAMPLES, SEED
from bench.model.links import PRESETS, parse_link
from bench.model.validate import POINT_COLUMNS, bucket_choices, median_abs_error, validate
from bench.model.whatif import link_costs, load_compute, predict_scales, recommend


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        fail(f"{message} (see --help)")


def _dirs(values: list[str]) -> list[Path]:
    return [Path(p) for v in values for p in v.split(",") if p]


def _world_sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"world size {part!r} is not an integer") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"world size {n} must be at least 1")
        out.append(n)
    return out


def _speedup(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"speed-up {text!r} is not a number") from None
    if not v > 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"speed-up {text!r} must be positive")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m bench.model", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    f = sub.add_parser("fit", help="fit the collectives' costs and print the fit's quality")
    v = sub.add_parser("validate", help="predict every ok point of training runs")
    w = sub.add_parser("whatif", help="predict larger worlds, other links, a faster device")
    for s in (f, v, w):
        s.add_argument(
            "--collectives",
            action="append",
            required=True,
            help="--sweep message_size run folder(s), comma separated or repeated",
        )
        s.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument("training", nargs="+", help="training run folders")
    w.add_argument(
        "--compute", required=True, help="a training run with DDP points (the step's computation)"
    )
    w.add_argument("--model", help="which model of the compute run (default: the largest)")
    w.add_argument("--world-size", type=_world_sizes, default=[8, 64, 1024])
    w.add_argument(
        "--link",
        help=f"a preset ({', '.join(PRESETS)}) or alpha=S,beta=S_PER_BYTE; "
        "default: the fitted collectives",
    )
    w.add_argument(
        "--speedup",
        type=_speedup,
        default=1.0,
        help="computation this many times faster (a faster device)",
    )
    return p


def _print_table(df: pd.DataFrame) -> None:
    with pd.option_context(
        "display.width", 200, "display.max_columns", 30, "display.max_colwidth", 60
    ):
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3g}"))


# What the fit table's columns measure, printed with it (docs/model.md says the same).
FIT_NOTES = {
    "r2_log": "R^2 of log time, the scale the fit minimises (relative residuals); every size, "
    "outliers included",
    "intervals": f"*_low, *_high: {CONFIDENCE:.0%} percentile bootstrap over each size's timed "
    f"iterations (samples.csv), {RESAMPLES} resamples, seed {SEED}; NaN (JSON: null) without "
    "samples",
    "max_abs_residual_pct": "over the sizes fitted; the sizes set aside as outliers and their "
    "residuals are in outlier_residuals",
}


def cmd_fit(args) -> int:
    comm = load_runs(_dirs(args.collectives))
    table = comm.table()
    if args.json:
        print(
            json.dumps(
                {
                    "backend": comm.backend,
                    "world_sizes": comm.world_sizes,
                    "gamma_ns_per_B": None if comm.gamma is None else comm.gamma * 1e9,
                    "notes": FIT_NOTES,
                    "fits": records(table),
                    "residuals": [
                        {
                            "ranks": ranks,
                            "impl": f.impl,
                            "collective": f.collective,
                            "sizes": records(f.residuals),
                        }
                        for ranks, f in comm.all_fits()
                    ],
                }
            )
        )
        return 0
    for k, v in FIT_NOTES.items():
        print(f"# {k}: {v}")
    _print_table(table)
    for ranks, f in comm.all_fits():
        res = ", ".join(
            f"{human_bytes(int(r.size_bytes))} {r.residual_pct:+.0f}%{' (outlier)' * r.outlier}"
            for r in f.residuals.itertuples()
            if str(r.world_size) in ranks.split(",")
        )
        print(f"{f.impl} {f.collective} ({ranks} ranks) residuals: {res}")
    return 0


def cmd_validate(args) -> int:
    comm, points = validate(_dirs(args.collectives), [Path(t) for t in args.training])
    mae = median_abs_error(points)
    choices = bucket_choices(points)
    if args.json:
        print(
            json.dumps(
                {
                    "points": records(points),
                    "median_abs_error_pct": mae,
                    "median_abs_window_error_pct": median_abs_error(points, "window_error_pct"),
                    "bucket_choice": records(choices),
                    "fits": records(comm.table()),
                }
            )
        )
        return 0
    cols = ["point", "world_size", *POINT_COLUMNS[1:]]
    _print_table(points[cols])
    if len(choices):
        _print_table(choices)
    print(
        f"median absolute step-time error: {mae:.1f} % over "
        f"{int(points['predicted_step_ms'].notna().sum())} points (against the profiled steps: "
        f"{median_abs_error(points, 'window_error_pct'):.1f} %)"
    )
    return 0


def cmd_whatif(args) -> int:
    if args.link:
        parse_link(args.link)  # a bad link fails before any run is read
    prof, point, run_meta = load_compute(
        _dirs(args.collectives), Path(args.compute), model=args.model
    )
    model, batch = point.model, point.batch_per_replica
    costs, about, share = link_costs(args.link, _dirs(args.collectives), run_meta)
    table = predict_scales(
        prof,
        point=point,
        comm=costs,
        world_sizes=args.world_size,
        share=share,
        speedup=args.speedup,
    )
    rec = recommend(table)
    assumptions = {
        "link": about,
        "compute": prof.source,
        "model": model,
        "batch_per_rank": batch,
        "compute_ms": prof.total_ms / args.speedup,
        "speedup": args.speedup,
        "overlap_share": share,
        "scaling": "weak (every rank keeps its batch)",
        "ranges": "*_low, *_high: every collective at the low or high end of its "
        f"{CONFIDENCE:.0%} interval; NaN (JSON: null) for a link, whose figures are given",
    }
    if args.json:
        print(
            json.dumps(
                {
                    "assumptions": assumptions,
                    "predictions": records(table),
                    "recommendations": records(rec),
                }
            )
        )
        return 0
    for k, v in assumptions.items():
        print(f"# {k}: {v}")
    _print_table(table)
    _print_table(rec)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"fit": cmd_fit, "validate": cmd_validate, "whatif": cmd_whatif}[args.command](args)
    except (FitError, ValueError, OSError) as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
