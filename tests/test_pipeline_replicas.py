"""A pipeline composed with data and tensor parallelism over a (replica, stage, TP) grid
(``pp_degree`` ranks a pipeline, ``tp_degree`` a stage's TP group, the rest data parallel,
parallel_kernels/pipeline.py and pipeline_mesh.py), at 4 ranks: 2 pipelines of 2 ranks, each
reading its own batch, each stage's gradients averaged over the replicas after the schedule, or
its parameters sharded over them by FSDP2 (``dp_shard``); and one pipeline of 2 stages, each
tensor-parallel over 2 ranks (a 2 x 2 mesh). Every point run through the harness and its first
step checked against the plain model on the global batch, and the gradients themselves compared
with the plain model's (AdamW's step hides a gradient scaled as a whole). One call into the
session's rank pool runs every case; one case of each composition runs every stage of the
harness (profile and memory too), the rest only what the test reads (``checked_only``)."""

import pytest
import torch

from parallel_kernels.models import build_model, workload
from parallel_kernels.pipeline import apply_pipeline
from parallel_kernels.pipeline_mesh import full_tensor
from tests.test_harness import checked_only, make_point, run_points

pytestmark = pytest.mark.ranks

TIED = "tests/data/models/pipeline_models.py:tied"
FSDP = {"pp_degree": 2, "dp_shard": True}  # 2 pipelines of 2 ranks, each stage sharded over 2
TP = {"pp_degree": 2, "tp_degree": 2}  # 1 pipeline of 2 stages, each over 2 TP ranks
RIGHT = [  # both implementations; two stages a rank; a tie summed, then averaged
    (TIED, "native", {"pp_schedule": "1f1b", "pp_degree": 2}),
    (TIED, "reference", {"pp_schedule": "gpipe", "pp_degree": 2}),
    (TIED, "native", {"pp_schedule": "zbv", "pp_degree": 2}),
    (TIED, "reference", {"pp_schedule": "1f1b", "pp_degree": 1}),  # 4 replicas of one stage
    (TIED, "native", {"pp_schedule": "1f1b", **FSDP}),
    (TIED, "reference", {"pp_schedule": "gpipe", **FSDP}),
    (TIED, "native", {"pp_schedule": "interleaved_1f1b", **FSDP}),
    ("transformer", "native", {"pp_schedule": "1f1b", **TP}),
    ("transformer", "reference", {"pp_schedule": "1f1b", **TP}),
]
FULL = (0, 4, 7)  # RIGHT's cases run through every stage: a pipeline, x FSDP2, x TP
STEPS = {"batch_size": 8, "warmup_steps": 1, "steps": 1, "profile_steps": 1}
GRADIENTS = [  # (model, implementation, knobs) whose gradients are compared after one step
    (TIED, "native", {"pp_schedule": "1f1b", "pp_degree": 2}),
    (TIED, "native", {"pp_schedule": "zbv", "pp_degree": 2}),
    (TIED, "native", {"pp_schedule": "1f1b", **FSDP}),
    (TIED, "reference", {"pp_schedule": "gpipe", **FSDP}),
    ("transformer", "native", {"pp_schedule": "1f1b", **TP}),
    ("transformer", "reference", {"pp_schedule": "1f1b", **TP}),
]


def gradient_error(model: str, impl: str, knobs: dict) -> float:
    """The largest difference between this rank's gradients (in full) after one step of the
    pipeline (each replica on its own batch) and the plain model's on every replica's batch."""
    wl = workload(model)
    pipe = apply_pipeline(
        build_model(model),
        group=None,
        device=torch.device("cpu"),
        native=impl == "native",
        pp_microbatches=2,
        **knobs,
    )
    batches = [wl.batch(8, 10 + r) for r in range(pipe.dp_size)]
    pipe.train_step(*batches[pipe.dp_rank])
    plain = build_model(model)
    loss = sum(wl.compute_loss(plain(x), y) for x, y in batches) / len(batches)
    loss.backward()
    want = dict(plain.named_parameters())
    return max(
        (full_tensor(p.grad, pipe._tp_dims.get(n), pipe.groups) - want[n].grad).abs().max().item()
        for n, p in pipe._mine().items()
    )


def worker(root: str) -> tuple[list[tuple], list[float]]:
    points = [
        make_point("case", m, i, impl, "pp", knobs=k, world_size=4, **STEPS)
        for i, (m, impl, k) in enumerate(RIGHT)
    ]
    full = run_points([points[i] for i in FULL], root)
    with checked_only():
        rest = run_points([p for i, p in enumerate(points) if i not in FULL], root)
    ordered = [full.pop(0) if i in FULL else rest.pop(0) for i in range(len(points))]
    rows = [(r["status"], r["error"], r.get("checked")) for r in ordered]
    return rows, [gradient_error(*case) for case in GRADIENTS]


@pytest.mark.timeout(300)
def test_pipeline_replicas_train_as_the_plain_model(pool, tmp_path):
    every = pool(4).run(worker, str(tmp_path), timeout=280)
    rows, grad_errors = every[0][0], [e for _, errors in every for e in errors]
    for (status, error, checked), case in zip(rows, RIGHT, strict=True):
        assert status == "ok", (case, error)
        assert checked.startswith("ok (fp32 tolerance"), (case, checked)
    assert max(grad_errors) < 1e-5, grad_errors
    assert len(grad_errors) == 4 * len(GRADIENTS)
