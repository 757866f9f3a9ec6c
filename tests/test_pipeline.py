"""Pipeline parallelism as a strategy (parallel_kernels/pipeline.py): every point run through
the harness at 2 ranks, its first step checked against the plain model (``checked`` says
"ok"), torch's schedules and ours alike; a point the pipeline cannot run is an error row
naming why. One call into the session's rank pool runs every case."""

from pathlib import Path

import pytest

from bench.analysis import critical_path as cp
from bench.analysis.critical_graph import COMM
from tests.test_harness import run_points
from tests.test_plain_check import case

pytestmark = pytest.mark.ranks

RIGHT = [  # both implementations, both schedules, a tied embedding and head (gpt2)
    ("transformer", "native", {"pp_schedule": "gpipe", "pp_microbatches": 2}),
    ("transformer", "reference", {"pp_schedule": "1f1b", "pp_microbatches": 4}),
    ("gpt2:tiny", "native", {"pp_schedule": "1f1b", "pp_microbatches": 2}),
    ("llama:tiny", "reference", {"pp_schedule": "gpipe", "pp_microbatches": 2}),
]
WRONG = [
    ("mlp", "native", {}, "does not say where its repeated blocks are"),
    ("transformer", "reference", {"pp_microbatches": 3}, "does not split into 3"),
    ("transformer", "native", {"grad_accum": 2}, "grad_accum must be 1"),
]


KEPT = ("status", "error", "checked", "peak_mem_mb")  # and every pp_* column


def worker(root: str) -> list[dict]:
    points = [case(i, m, "pp", impl, **k) for i, (m, impl, k) in enumerate(RIGHT)]
    points += [case(100 + i, m, "pp", impl, **k) for i, (m, impl, k, _) in enumerate(WRONG)]
    return [
        {k: v for k, v in r.items() if k in KEPT or k.startswith("pp_")}
        for r in run_points(points, root)
    ]


def check_pipeline_figures(r: dict, microbatches: int) -> None:
    """A pipelined row's own figures: 2 stages' bubbles, their theory, bytes and memory."""
    assert 0 <= r["pp_bubble_mean_pct"] <= r["pp_bubble_pct"] < 100
    assert r["pp_bubble_theory_pct"] == pytest.approx(100 / (microbatches + 1))  # (p-1)/(m+p-1)
    stages = [float(b) for b in r["pp_bubble_by_rank_pct"].split(";")]
    assert len(stages) == 2 and max(stages) == pytest.approx(r["pp_bubble_pct"], rel=1e-3)
    # every byte the stages' sends carried, and nothing else, is what their shapes say
    assert r["pp_p2p_bytes_per_step"] == r["pp_p2p_bytes_expected"] > 0
    peaks = [float(m) for m in r["pp_peak_mem_by_rank_mb"].split(";")]
    assert len(peaks) == 2 and max(peaks) == pytest.approx(r["peak_mem_mb"], rel=1e-3)


@pytest.mark.timeout(300)
def test_pipelines_train_as_the_plain_model_and_refuse_what_they_cannot_run(pool, tmp_path):
    rows = pool(2).run(worker, str(tmp_path), timeout=280)[0]
    for i, (r, (model, impl, knobs)) in enumerate(zip(rows, RIGHT, strict=False)):
        assert r["status"] == "ok", (model, impl, knobs, r["error"])
        assert r["checked"].startswith("ok (fp32 tolerance"), (model, impl, knobs, r["checked"])
        check_pipeline_figures(r, knobs["pp_microbatches"])
        check_path_crosses_stages(tmp_path / case(i, model, "pp", impl, **knobs).id)
    for r, (model, impl, knobs, says) in zip(rows[len(RIGHT) :], WRONG, strict=True):
        assert r["status"] == "error" and says in r["error"], (model, impl, knobs, r["error"])
        assert r.get("pp_bubble_pct") is None


def check_path_crosses_stages(folder: Path) -> None:
    """A pipelined step's critical path, from the point's own traces: it adds up to the step
    and runs through a receive from one stage to the other (the sends and receives joined,
    bench/analysis/critical_graph.py)."""
    paths, problems = cp.folder_paths(folder)
    assert paths and problems == [], problems
    for sp in paths:
        path = sp.path
        assert path["dur_us"].sum() == pytest.approx(sp.summary["length_us"], rel=1e-6)
        recv = path[path["op"] == "recv"]
        assert len(recv) and set(recv["category"]) == {COMM}, path.to_string()
        assert set(path["rank"]) == {0, 1}, path.to_string()
