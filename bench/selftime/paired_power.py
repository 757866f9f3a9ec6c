"""How well interleaved, paired verdicts resolve a small difference here: the A/A rate and the
power against a known effect, through the sweep's own cohort runner.

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 bench/selftime/paired_power.py \
        [--model wide_mlp] [--aa 20] [--effect 10] [--effect-pct 5] [--max-point-s 8] [--json]

Each trial is one cohort of two candidates (``bench/runner/train/cycles.py``) with the
sweep's default budget (``--max-steps`` cycles, ``--max-point-s`` seconds per candidate) and
tie band: an A/A trial enters one configuration twice (DDP native at the default bucket size)
and counts as right when the paired verdict ties them; an effect trial makes the second
candidate's every timed step ``--effect-pct`` % longer (a spin of that share of its last step,
so the effect stays that size however loaded the machine is) and counts as found when the
verdict separates it, slower. The targets (docs/confidence.md): A/A tied in at least 19 of 20,
a 5 % effect found in at least 9 of 10. Run it with another job beside it to see what load
does; the trials' verdicts, cycles and seconds are printed one line each.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from bench.runner.configure.config import DEFAULTS, TRAINING_MAX_STEPS, RunConfig
from bench.runner.configure.resolve import build_points
from bench.runner.session.distenv import init_distributed, rank0_print
from bench.runner.train.cycles import CycleBudget
from bench.runner.train.lifecycle import Cohort, PointSettings, run_cohort
from bench.stats.paired import DECIDED, look_confidence, versus_best_paired


@dataclass
class _Run:
    """What ``run_cohort`` asks of a run: its ranks, a folder, a row writer."""

    env: object
    run_dir: Path
    rows: list = field(default_factory=list)

    def write(self, row: dict) -> None:
        self.rows.append(row)


def trial(env, point, slow_pct: float, seed: int, root: Path, max_point_s: float) -> dict:
    """One cohort of ``point`` and its copy (slowed by ``slow_pct``): the paired verdict."""
    again = dataclasses.replace(point, id=point.id + "-again")
    run = _Run(env=env, run_dir=root / f"trial{seed}")
    budget = CycleBudget(
        min_cycles=DEFAULTS.steps,
        max_cycles=TRAINING_MAX_STEPS,
        max_s=2 * max_point_s,
        band_pct=DEFAULTS.tie_band_pct,
        seed=seed,
    )
    t0 = time.perf_counter()
    results = run_cohort(
        run,
        PointSettings(point_timeout_s=120.0),
        Cohort(points=(point, again), slow_pct={again.id: slow_pct}),
        budget,
        progress=lambda _m: None,
    )
    rows = [r.as_dict() for r in results]
    seconds = time.perf_counter() - t0
    by = {r["point"]: r for r in rows}
    if any(r["status"] != "ok" for r in rows):
        raise RuntimeError("; ".join(r["error"] for r in rows if r["status"] != "ok"))
    samples = {p: by[p]["samples_ms"] for p in (point.id, again.id)}
    early = by[point.id]["stop"] == DECIDED
    v = versus_best_paired(samples, look_confidence(len(samples[point.id]), early))
    r = next(iter(v.ratios.values()))  # the other candidate over the best
    ratio, low, high = r.ratio, r.low, r.high  # again over point
    if v.best == again.id:
        ratio, low, high = 1 / r.ratio, 1 / r.high, 1 / r.low
    return {
        "slow_pct": slow_pct,
        "tied": len(v.tied) == 2,
        "found": len(v.tied) == 1 and v.best == point.id,
        "ratio": ratio,
        "low": low,
        "high": high,
        "cycles": v.cycles,
        "stop": by[point.id]["stop"],
        "step_ms": float(np.median(by[point.id]["samples_ms"])),
        "seconds": seconds,
        "samples_ms": [samples[point.id], samples[again.id]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="wide_mlp")
    p.add_argument("--aa", type=int, default=20, help="A/A trials")
    p.add_argument("--effect", type=int, default=10, help="trials with a known effect")
    p.add_argument("--effect-pct", type=float, default=5.0)
    p.add_argument(
        "--max-point-s",
        type=float,
        default=DEFAULTS.max_point_s,
        help="seconds of timed steps per candidate (the sweep's default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="the summary as one JSON line")
    args = p.parse_args(argv)
    env = init_distributed()
    (point,) = build_points(
        RunConfig(sweep="bucket_cap_mb", values="25", model=args.model, impl="native"),
        world_size=env.world_size,
    )
    trials = [0.0] * args.aa + [args.effect_pct] * args.effect
    out = []
    with tempfile.TemporaryDirectory(prefix="paired-power-") as root:
        for i, pct in enumerate(trials):
            t = trial(env, point, pct, seed=i, root=Path(root), max_point_s=args.max_point_s)
            out.append(t)
            rank0_print(json.dumps({"trial": i, **t}) if args.json else _line(i, t))
            t.pop("samples_ms")
    aa = [t for t in out if not t["slow_pct"]]
    eff = [t for t in out if t["slow_pct"]]
    summary = {
        "model": args.model,
        "max_point_s": args.max_point_s,
        "aa_tied": sum(t["tied"] for t in aa),
        "aa_runs": len(aa),
        "effect_pct": args.effect_pct,
        "effect_found": sum(t["found"] for t in eff),
        "effect_runs": len(eff),
        "median_cycles": float(np.median([t["cycles"] for t in out])),
        "median_half_width_pct": float(
            np.median([50 * (t["high"] - t["low"]) / t["ratio"] for t in out])
        ),
        "median_seconds": float(np.median([t["seconds"] for t in out])),
    }
    rank0_print(json.dumps(summary) if args.json else _summary(summary))
    return 0


def _line(i: int, t: dict) -> str:
    kind = f"{t['slow_pct']:g} % slower" if t["slow_pct"] else "A/A"
    outcome = "tied" if t["tied"] else ("found" if t["found"] else "separated")
    return (
        f"trial {i} ({kind}): {outcome}, ratio {t['ratio']:.3f} [{t['low']:.3f}, {t['high']:.3f}] "
        f"over {t['cycles']} cycles (stop: {t['stop']}, step {t['step_ms']:.1f} ms, "
        f"{t['seconds']:.1f} s)"
    )


def _summary(s: dict) -> str:
    return (
        f"{s['model']}: A/A tied in {s['aa_tied']} of {s['aa_runs']}; a {s['effect_pct']:g} % "
        f"effect found in {s['effect_found']} of {s['effect_runs']}; median "
        f"{s['median_cycles']:.0f} cycles, interval +-{s['median_half_width_pct']:.1f} %, "
        f"{s['median_seconds']:.1f} s per trial"
    )


if __name__ == "__main__":
    sys.exit(main())
