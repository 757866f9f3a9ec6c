"""TensorBoard with torch-tb-profiler on a small generated run: every point a run, every rank a
worker, the overview and the distributed view filled, and the sweep's scalars browsable."""

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pandas as pd
import pytest

# Both are declared dependencies (tensorboard, and torch-tb-profiler in the test extra): a
# missing one fails here rather than skipping.
import tensorboard  # noqa: F401
import torch_tb_profiler  # noqa: F401

from bench.report.tb_scalars import write_sweep_scalars
from tests.rank_pool import free_port
from tests.test_harness import FAST, point, run_points


def get(base: str, path: str, **params):
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=20) as r:
        return json.loads(r.read())


@pytest.mark.timeout(240)
def test_profiler_plugin_shows_points_ranks_and_distributed_view(pool, tmp_path):
    traces = tmp_path / "run" / "traces"
    rows = pool(2).run(
        run_points, [point("mlp", "native", 1.0), point("mlp", "reference", 1.0)], str(traces), FAST
    )[0]
    assert [r["status"] for r in rows] == ["ok", "ok"]
    write_sweep_scalars(tmp_path / "run", "bucket_cap_mb", pd.DataFrame(rows))

    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            str(traces),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    base = f"http://127.0.0.1:{port}/data/plugin"
    try:
        deadline, runs = time.monotonic() + 90, {}
        while time.monotonic() < deadline:
            try:
                runs = get(base, "/pytorch_profiler/runs")
                if not runs.get("loading") and len(runs.get("runs", [])) == 2:
                    break
            except OSError:
                pass  # not listening yet
            time.sleep(1)
        expected = sorted(r["point"] for r in rows)
        assert sorted(runs["runs"]) == expected, runs
        for run in expected:
            views = get(base, "/pytorch_profiler/views", run=run)
            assert "Overview" in views and "Distributed" in views, views
            assert get(base, "/pytorch_profiler/workers", run=run, view="Overview") == [
                "rank0",
                "rank1",
            ]
            span = get(base, "/pytorch_profiler/spans", run=run, worker="rank0")[0]
            overview = get(base, "/pytorch_profiler/overview", run=run, worker="rank0", span=span)
            assert overview["steps"]["rows"], overview
            overlap = get(
                base, "/pytorch_profiler/distributed/overlap", run=run, worker="All", span=span
            )
            assert set(overlap["data"]["all"]) == {"rank0", "rank1"}
            ops = get(
                base, "/pytorch_profiler/distributed/commops", run=run, worker="All", span=span
            )
            assert ops["data"]["rank0"]["rows"], ops
        tags = get(base, "/scalars/tags")
        assert "step_ms_median/mlp/native" in tags["sweep_scalars"], tags
    finally:
        server.terminate()
        server.wait(timeout=20)
