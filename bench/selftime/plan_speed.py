"""The planner's speed target, measured: planning a large model at a large world size over the
whole space, its time and its memory, against the issue's 60 s and 2 GB here.

    python bench/selftime/plan_speed.py [--runs 1] [--model llama:1b] [--world-size 1024]
        [--gpus-per-node 8] [--device h100] [--link nvlink4,ib_ndr] [--global-batch 2048]
        [--baseline DIR]

Each run is the planner's own command (``python -m bench.plan``) as a user runs it, in a fresh
process: the whole command's seconds, the planning's (``plan.json``'s ``planning_s``: the
trackings and the rows, without the imports and the page), and the memory resident summed over
the planner's process and its tracking workers, sampled every 0.25 s (forked workers share the
pages they have not written, so the sum counts those in each: an upper bound). ``--baseline``
runs another checkout's planner (its repository root) alternately with this one, A B A B, and
prints the ratio per pair: the machine's speed moves by more than most changes do (59 to 68 s
for one tree over a morning here). The figures are in docs/plan.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET_S, TARGET_GB = 60.0, 2.0  # issue 33's speed target for llama:1b at 1024 ranks


def _plan_args(args) -> list[str]:
    return [
        "--model", args.model, "--world-size", str(args.world_size),
        "--gpus-per-node", str(args.gpus_per_node), "--device", args.device,
        "--link", args.link, "--global-batch", str(args.global_batch),
    ]  # fmt: skip


def _resident(root: int) -> int:
    """Bytes resident in process ``root`` and its descendants now (Linux's /proc; those that end
    meanwhile are skipped)."""
    parent, rss = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            pages = int((entry / "statm").read_text().split()[1])
            rss[int(entry.name)] = pages * os.sysconf("SC_PAGE_SIZE")

    def under(pid: int) -> bool:
        while pid > 1:
            if pid == root:
                return True
            pid = parent.get(pid, 0)
        return False

    return sum(b for pid, b in rss.items() if under(pid))


def run_once(root: Path, plan_args: list[str]) -> dict:
    """One plan in a fresh process from checkout ``root``: its seconds, planning seconds,
    configurations and peak summed resident memory."""
    with tempfile.TemporaryDirectory(prefix="plan-speed-") as tmp:
        out = Path(tmp) / "plan"
        cmd = [sys.executable, "-m", "bench.plan", *plan_args, "--out", str(out)]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _resident(proc.pid))
            time.sleep(0.25)
        took = time.perf_counter() - start
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode:
            raise SystemExit(f"the plan failed (exit {proc.returncode}): {err.strip()[-300:]}")
        meta = json.loads((out / "plan.json").read_text())
    return {
        "command_s": took,
        "planning_s": float(meta["planning_s"]),
        "configurations": int(meta["configurations"]),
        "peak_gb": peak / 1e9,
    }


def _line(name: str, got: dict) -> str:
    return (
        f"{name}: {got['configurations']} configurations, planning {got['planning_s']:.1f} s, "
        f"the command {got['command_s']:.1f} s, peak resident {got['peak_gb']:.2f} GB"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--model", default="llama:1b")
    p.add_argument("--world-size", type=int, default=1024)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--device", default="h100")
    p.add_argument("--link", default="nvlink4,ib_ndr")
    p.add_argument("--global-batch", type=int, default=2048)
    p.add_argument("--baseline", type=Path, help="another checkout's root, run alternately")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs: at least 1")
    if args.baseline is not None and not (args.baseline / "bench" / "plan").is_dir():
        p.error(f"--baseline {args.baseline}: not a checkout of this project")
    plan_args = _plan_args(args)
    ours, theirs = [], []
    for i in range(args.runs):
        ours.append(run_once(ROOT, plan_args))
        print(_line(f"run {i + 1}", ours[-1]), flush=True)
        if args.baseline is not None:
            theirs.append(run_once(args.baseline, plan_args))
            print(_line(f"run {i + 1}, baseline", theirs[-1]), flush=True)
    median = {k: statistics.median(r[k] for r in ours) for k in ("command_s", "planning_s")}
    peak = max(r["peak_gb"] for r in ours)
    print(
        f"{args.model} at {args.world_size} ranks: planning {median['planning_s']:.1f} s, the "
        f"command {median['command_s']:.1f} s (median of {len(ours)}; target {TARGET_S:g} s), "
        f"peak resident {peak:.2f} GB (target {TARGET_GB:g} GB)"
    )
    if theirs:
        ratios = [a["command_s"] / b["command_s"] for a, b in zip(ours, theirs, strict=True)]
        print(
            f"against the baseline, the command's seconds per pair: "
            f"{', '.join(f'{r:.3f}' for r in ratios)} (median {statistics.median(ratios):.3f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
