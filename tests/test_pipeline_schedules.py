"""torch's schedules as values of ``pp_schedule`` (parallel_kernels/pp_schedules.py): two
stages a rank, looped or in a V, each point run through the harness at 2 ranks and its first
step checked against the plain model; what a pipeline cannot run refused at the command line
in one line (exit 2), or an error row naming why (a schedule only torch runs asked of the
reference, a stage whose forward fails). One call into the session's rank pool runs every
point."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bench.runner.cli import main
from bench.runner.configure.flags import parse_config
from bench.runner.configure.resolve import build_points
from parallel_kernels import pp_schedules
from parallel_kernels.pp_schedules import SCHEDULES
from tests.test_harness import make_point, run_points

MODELS = "tests/data/models/pipeline_models.py"
TIED, FAILING = f"{MODELS}:tied", f"{MODELS}:failing"

RIGHT = [  # torch's schedules of two stages a rank, a tie held apart and on one rank
    ("transformer", {"pp_schedule": "interleaved_1f1b", "pp_microbatches": 2}),
    (TIED, {"pp_schedule": "interleaved_zb", "pp_microbatches": 4}),
    (TIED, {"pp_schedule": "zbv", "pp_microbatches": 2}),
    (TIED, {"pp_schedule": "dualpipev", "pp_microbatches": 4}),
]
WRONG = [
    ("transformer", "reference", {"pp_schedule": "zbv"}, "runs in torch's schedules only"),
    (FAILING, "native", {"pp_schedule": "1f1b"}, "pipeline stage 1: RuntimeError: this block"),
]
STEPS = {"batch_size": 8, "warmup_steps": 1, "steps": 1, "profile_steps": 1}


def point(i: int, model: str, impl: str, knobs: dict):
    return make_point("case", model, i, impl, "pp", knobs=knobs, **STEPS)


def worker(root: str) -> list[tuple]:
    points = [point(i, m, "native", k) for i, (m, k) in enumerate(RIGHT)]
    points += [point(100 + i, m, impl, k) for i, (m, impl, k, _) in enumerate(WRONG)]
    return [(r["status"], r["error"], r.get("checked")) for r in run_points(points, root)]


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_torch_schedules_train_as_the_plain_model_and_failures_are_rows(pool, tmp_path):
    missing = {k["pp_schedule"] for _, k in RIGHT} - set(SCHEDULES)
    if missing:
        pytest.skip(f"the installed torch lacks {', '.join(sorted(missing))}")
    rows = pool(2).run(worker, str(tmp_path), timeout=280)[0]
    for (status, error, checked), case in zip(rows, RIGHT, strict=False):
        assert status == "ok", (case, error)
        assert checked.startswith("ok (fp32 tolerance"), (case, checked)
    for (status, error, _), (model, impl, knobs, says) in zip(
        rows[len(RIGHT) :], WRONG, strict=True
    ):
        assert status == "error" and says in error, (model, impl, knobs, error)


@pytest.mark.unit
def test_the_micro_batch_rules_are_torchs():
    """Each row's rule refuses exactly the counts torch's schedule refuses when made, at 2 to
    4 ranks (a fake process group: rank 0 of p)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.testing._internal.distributed.fake_pg import FakeStore

    differ = []
    for p in (2, 3, 4):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=p)
        try:
            for row in SCHEDULES.values():
                n = p * row.per_rank
                stages = [
                    PipelineStage(nn.Linear(2, 2), s, n, torch.device("cpu"))
                    for s in row.stages_of(0, p)
                ]
                for m in range(1, 3 * p + 2):
                    try:
                        row.torch_type()(stages[0] if n == p else stages, n_microbatches=m)
                        torch_runs = True
                    except ValueError:
                        torch_runs = False
                    if torch_runs != (row.refusal(m, p) is None):
                        differ.append((row.name, p, m, torch_runs))
        finally:
            dist.destroy_process_group()
    assert differ == []


@pytest.mark.unit
def test_placements():
    loop, v = SCHEDULES["interleaved_1f1b"], SCHEDULES["zbv"]
    assert [loop.stages_of(r, 2) for r in range(2)] == [(0, 2), (1, 3)]
    assert loop.owners(2) == (0, 1, 0, 1)
    assert [v.stages_of(r, 3) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]
    assert v.owners(3) == (0, 1, 2, 2, 1, 0)


@pytest.mark.unit
@pytest.mark.usefixtures("no_torchrun")
@pytest.mark.parametrize(
    "args,message",
    [
        (["--sweep", "pp_degree", "--values", "3"], "PP degree 3 does not divide the world size 4"),
        (
            ["--sweep", "pp_schedule", "--values", "1f1b", "--option", "pp_degree=3"],
            "PP degree 3 does not divide the world size 4",
        ),
        (
            ["--sweep", "pp_schedule", "--values", "interleaved_1f1b", "--model", "llama:tiny"],
            "llama:tiny has 2 blocks, fewer than the 8 stages of pp_schedule=interleaved_1f1b",
        ),
        (
            ["--sweep", "pp_microbatches", "--values", "2,4"],
            "pp_schedule=1f1b over 4 ranks needs at least as many micro-batches as its 4 stages",
        ),
        (
            ["--sweep", "pp_microbatches", "--values", "6", "--option", "pp_schedule=zbv"],
            "has 4 blocks, fewer than the 8 stages",
        ),
        (["--sweep", "pp_schedule", "--values", "looped"], "'looped' is not a pipeline schedule"),
        (
            [
                *("--sweep", "pp_schedule", "--values", "1f1b"),
                *("--option", "pp_degree=4", "--option", "tp_degree=2"),
            ],
            "PP x TP 4 x 2 does not divide the world size 4",
        ),
        (
            ["--sweep", "pp_degree", "--values", "2", "--option", "tp_degree=3"],
            "TP degree 3 does not divide the world size 4",
        ),
        (
            ["--sweep", "pp_degree", "--values", "2", "--option", "tp_degree=2", "--model", TIED],
            f"tensor parallelism needs a tp_plan, which workload {TIED} does not give",
        ),
        (
            [
                *("--sweep", "pp_schedule", "--values", "zbv", "--model", TIED),
                *("--option", "pp_degree=2", "--option", "dp_shard=true"),
            ],
            "dp_shard=true cannot shard pp_schedule=zbv: its weight gradients run in a pass",
        ),
    ],
)
def test_a_pipeline_that_cannot_run_is_one_line_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*args, "--nproc-per-node", "4"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.unit
@pytest.mark.usefixtures("no_torchrun")
def test_a_schedule_the_installed_torch_lacks_is_named(monkeypatch, capsys):
    monkeypatch.delitem(pp_schedules.SCHEDULES, "dualpipev")
    with pytest.raises(SystemExit) as exc:
        main(["--sweep", "pp_schedule", "--values", "dualpipev", "--nproc-per-node", "2"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "ScheduleDualPipeV, which torch" in err, err


@pytest.mark.unit
def test_default_values_a_layout_cannot_run_are_left_out():
    """A sweep's own values that a model or the world cannot run are left out, as TP degrees
    past the world are: llama:tiny's 2 blocks make no 4 stages, DualPipeV takes 4 micro-batches
    at 2 ranks, where the default is 2."""
    ids = [p.id for p in build_points(parse_config(["--sweep", "pp_schedule"]), 2)]
    assert "transformer-pp_schedule=zbv-native" in ids
    assert not [i for i in ids if "dualpipev" in i]
    tiny = build_points(parse_config(["--sweep", "pp_schedule", "--model", "llama:tiny"]), 2)
    assert {p.knobs["pp_schedule"] for p in tiny} == {"gpipe", "1f1b"}
    grid = build_points(parse_config(["--sweep", "pp_degree"]), 4)
    # PP degree 4 is left out: 1F1B over 4 ranks needs 4 micro-batches, the default is 2
    assert {(p.knobs["pp_degree"], p.dp_size) for p in grid} == {(1, 4), (2, 2)}
