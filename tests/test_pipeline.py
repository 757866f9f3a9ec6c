"""Pipeline parallelism as a strategy (parallel_kernels/pipeline.py): every point run through
the harness at 2 ranks, its first step checked against the plain model (``checked`` says
"ok"), torch's schedules and ours alike; a point the pipeline cannot run is an error row
naming why. One call into the session's rank pool runs every case."""

import pytest

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


def worker(root: str) -> list[tuple]:
    points = [case(i, m, "pp", impl, **k) for i, (m, impl, k) in enumerate(RIGHT)]
    points += [case(100 + i, m, "pp", impl, **k) for i, (m, impl, k, _) in enumerate(WRONG)]
    return [(r["status"], r["error"], r.get("checked")) for r in run_points(points, root)]


@pytest.mark.timeout(300)
def test_pipelines_train_as_the_plain_model_and_refuse_what_they_cannot_run(pool, tmp_path):
    rows = pool(2).run(worker, str(tmp_path), timeout=280)[0]
    for (status, error, checked), (model, impl, knobs) in zip(rows, RIGHT, strict=False):
        assert status == "ok", (model, impl, knobs, error)
        assert checked.startswith("ok (fp32 tolerance"), (model, impl, knobs, checked)
    for (status, error, _), (model, impl, knobs, says) in zip(
        rows[len(RIGHT) :], WRONG, strict=True
    ):
        assert status == "error" and says in error, (model, impl, knobs, error)
