"""How often the sweep's claims are right on this machine: A/A ties and a known effect.

    python -m bench.selftime.claims_check --aa 20 --effect 10 [--extra-pct 5]
        [--model wide_mlp] [-- more bench/run.py arguments, e.g. --rounds 5]

Each repetition is a real sweep of two points, run like any other (torchrun, 2 ranks, the
default budget unless arguments after ``--`` change it; ``claims_sweep.py``): the A/A sweep
measures the model and its twin (the same configuration entered twice), the effect sweep the
model and the model doing ``--extra-pct`` % more arithmetic. The two points are compared with
the machinery of the report's headline (``bench.stats.ties.versus_best``), and the tally says
how often A/A was declared tied (a false difference otherwise) and how often the effect was
declared slower. The effect's real size is measured too, from every effect run pooled.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.analysis.confidence import run_estimates
from bench.runfolder.schema import read_run
from bench.stats.estimates import paired_ratio, ratio
from bench.stats.ties import versus_best

REPO = Path(__file__).resolve().parents[2]
SWEEP = ["--sweep", "bucket_cap_mb", "--values", "25", "--impl", "native", "--no-report"]


def sweep(out: Path, models: list[str], extra_pct: float, seed: int, more: list[str]) -> Path:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [
        str(torchrun),
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "bench" / "selftime" / "claims_sweep.py"),
        "--extra-pct",
        str(extra_pct),
        *SWEEP,
        "--model",
        ",".join(models),
        "--seed",
        str(seed),
        "--out",
        str(out),
        *more,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"sweep failed: {proc.stderr[-1500:]}")
    return out


def judge(run_dir: Path, base: str, other: str) -> tuple[float, float, float, bool, list]:
    """(ratio other/base, its interval, other separable from base, per-round medians)."""
    run = read_run(run_dir)
    est = run_estimates(run.samples, run.noise)
    ids = {p.model: pid for pid, p in run.points.items()}
    a, b = est[ids[base]], est[ids[other]]
    # the headline's comparison with the best, read as other / base whichever was faster
    r = ratio(b, a, versus_best({"base": a, "other": b}).confidence)
    medians = run.samples.groupby(["point", "round"])["ms"].median().unstack("point")
    pairs = list(zip(medians[ids[other]], medians[ids[base]], strict=True))
    return r.ratio, r.low, r.high, r.separable, pairs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    more = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.selftime.claims_check")
    p.add_argument("--aa", type=int, default=20, help="A/A repetitions (default 20)")
    p.add_argument("--effect", type=int, default=10, help="known-effect repetitions (10)")
    p.add_argument("--extra-pct", type=float, default=5.0, help="the effect (default 5 %%)")
    p.add_argument("--model", default="wide_mlp", choices=["mlp", "wide_mlp"])
    p.add_argument("--keep", type=Path, help="keep the run folders here")
    args = p.parse_args(argv)
    root = args.keep or Path(tempfile.mkdtemp(prefix="claims-"))
    m = args.model
    ties, found, pairs = 0, 0, []
    for i in range(args.aa):
        r, lo, hi, sep, _ = judge(
            sweep(root / f"aa{i}", [m, f"{m}_twin"], args.extra_pct, i, more), m, f"{m}_twin"
        )
        ties += not sep
        print(
            f"A/A {i + 1}/{args.aa}: twin/model x{r:.3f} [{lo:.3f}, {hi:.3f}] "
            f"{'separable: a false difference' if sep else 'tied'}",
            flush=True,
        )
    for i in range(args.effect):
        run = sweep(root / f"effect{i}", [m, f"{m}_slowed"], args.extra_pct, 100 + i, more)
        r, lo, hi, sep, rounds = judge(run, m, f"{m}_slowed")
        slower = sep and lo > 1
        found += slower
        pairs += rounds
        print(
            f"effect {i + 1}/{args.effect}: slowed/model x{r:.3f} [{lo:.3f}, {hi:.3f}] "
            f"{'declared slower' if slower else 'not declared slower'}",
            flush=True,
        )
    if args.aa:
        print(
            f"A/A: tied in {ties} of {args.aa} ({100 * (1 - ties / args.aa):.0f} % false "
            "differences)"
        )
    if args.effect:
        true = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
        sd = float(np.std(np.log([a / b for a, b in pairs]), ddof=1)) if len(pairs) > 1 else 0
        print(
            f"effect: declared slower in {found} of {args.effect}; its real size over all "
            f"{len(pairs)} rounds: x{true.ratio:.3f} [{true.low:.3f}, {true.high:.3f}], "
            f"the rounds' log ratio varying by {100 * sd:.1f} % (one round pair)"
        )
        # paired rounds: n pairs give a standard error sd / sqrt(n); 95 % two-sided and 90 %
        # power need the effect to be 1.96 + 1.28 standard errors (normal approximation)
        need = math.ceil((3.24 * sd / math.log(1 + args.extra_pct / 100)) ** 2) if sd else 0
        print(
            f"rounds a 2-point sweep needs to separate a {args.extra_pct:g} % effect 9 times "
            f"in 10 at this spread: about {need}"
        )
    print(f"runs: {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
