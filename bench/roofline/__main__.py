"""``python -m bench.roofline [--out FILE] [--device-name NAME]``: this device's roofline,
measured here (the GPU where CUDA is, else the CPU), or a datasheet GPU's stated one; written to
``FILE`` (the format of docs/roofline.md) and printed as a short table.
``python -m bench.roofline --check FILE`` checks a profile: a malformed one is one line, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.roofline.datasheet import MEMORY, datasheet_profile
from bench.roofline.profile import Roofline, RooflineError, read, write
from bench.runfolder.atomic import OutputError


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def _si(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _points(curve, unit: str) -> str:
    """The curve's ends and middle: size -> efficiency."""
    picks = sorted({0, len(curve.sizes) // 2, len(curve.sizes) - 1})
    return ", ".join(f"{_si(curve.sizes[i], unit)} {curve.efficiency[i]:.0%}" for i in picks)


def table(profile: Roofline) -> str:
    """The profile in a few lines: peaks, bandwidth, launch, points of each curve, step costs."""
    lines = [f"device   {profile.device}", f"source   {profile.source}"]
    for p, tflops in profile.peak_tflops.items():
        curve = profile.matmul.get(p)
        points = f"; matmul efficiency {_points(curve, 'FLOP')}" if curve else ""
        lines.append(f"peak     {p} {tflops:.4g} TFLOP/s{points}")
    lines.append(
        f"memory   {profile.memory_GBps:.4g} GB/s; efficiency {_points(profile.memory, 'B')}"
    )
    if profile.memory_cold is not None:
        lines.append(
            f"cold     allocating, operands out of cache: {_points(profile.memory_cold, 'B')}"
        )
    lines.append(f"launch   {profile.launch_us:.3g} us per op")
    if profile.traced_op_us is not None:
        lines.append(
            f"traced   {profile.traced_op_us:.3g} us per operator in a profiled step's trace"
        )
    if profile.step is not None:
        step = profile.step
        lines.append(
            f"in step  {step.op_us:.3g} us per op; efficiencies x{step.efficiency:.3g} "
            "(an op inside a training step)"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.roofline", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, help="write the profile to this file")
    p.add_argument(
        "--device-name",
        help="a datasheet GPU as torch names it (e.g. 'NVIDIA H100 80GB HBM3'): its stated "
        f"profile, not a measurement (known: {', '.join(m.gpu for m in MEMORY)})",
    )
    p.add_argument("--check", type=Path, metavar="FILE", help="check a profile file and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.check:
            profile = read(args.check)
            print(f"{args.check}: a valid profile of {profile.device}")
            return 0
        if args.device_name:
            profile = datasheet_profile(args.device_name)
            if profile is None:
                return _fail(f"no datasheet GPU matches {args.device_name!r}")
        else:
            from bench.roofline.measure import remeasure  # torch: imported only to measure

            profile = remeasure()
        if args.out:
            write(profile, args.out)
    except (RooflineError, OutputError) as e:
        return _fail(str(e))
    print(table(profile))
    if args.out:
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
