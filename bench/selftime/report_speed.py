"""How long the report takes for a large sweep: 200 points (synthetic), with a baseline.

    python -m bench.selftime.report_speed [--points 200]

Target: under 10 s on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.selftime.report_speed")
    p.add_argument("--points", type=int, default=200)
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from bench.report.page import write_report
    from tests.report_fixtures import make_training_run

    models = ["mlp", "wide_mlp", "transformer", "wide_mlp2"]
    impls = ["native", "reference"]
    per_model = max(1, args.points // (len(models) * len(impls)))
    values = [0.25 * 2**i for i in range(per_model)]
    points = {(m, v, i): 50.0 + 10 * j for m in models for j, v in enumerate(values) for i in impls}
    with tempfile.TemporaryDirectory() as tmp:
        old = make_training_run(Path(tmp) / "old", points, seed=1)
        new = make_training_run(Path(tmp) / "new", points, seed=2)
        t0 = time.perf_counter()
        write_report(new, Path(tmp) / "reports")
        alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_report(new, Path(tmp) / "reports", baseline=old)
        compared = time.perf_counter() - t0
    print(
        f"report for {len(points)} points: {alone:.2f} s; with a baseline comparison: "
        f"{compared:.2f} s (target: under 10 s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
