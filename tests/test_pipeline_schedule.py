"""Pipeline schedules: the arithmetic against hand values, and GPipe and 1F1B, ours (from
point-to-point primitives) and torch's (``PipelineStage`` with ``ScheduleGPipe`` and
``Schedule1F1B``), against the plain model at 2 ranks, in one call into the rank pool.

Each rank builds the whole model from one seed and trains it on the full batch itself, so the
plain model's gradients of its own stage are at hand without gathering anything.
"""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from parallel_kernels import pipeline_theory as theory
from parallel_kernels.pipeline_schedule import MicroBatches, Stage, run_schedule
from parallel_kernels.pipeline_theory import Action, Pipeline

M = 4  # micro-batches
BATCH, WIDTH, OUT = 8, 16, 4
SPLIT = 4  # stage 0: the first two Linear+ReLU pairs, stage 1: the rest
SCHEDULES = ("gpipe", "1f1b")


# -- the arithmetic ------------------------------------------------------------------------------
@pytest.mark.unit
def test_bubble_fraction_by_hand():
    assert theory.bubble_fraction(Pipeline(2, 4)) == pytest.approx(1 / 5)
    assert theory.bubble_fraction(Pipeline(4, 8)) == pytest.approx(3 / 11)
    assert theory.bubble_fraction(Pipeline(4, 8, per_rank=2)) == pytest.approx(3 / 19)
    assert theory.bubble_fraction(Pipeline(1, 3)) == 0


@pytest.mark.unit
def test_orders_by_hand():
    f, b = (lambda i: Action("F", i)), (lambda i: Action("B", i))
    assert theory.schedule_order("1f1b", Pipeline(2, 4), 0) == (
        f(0), f(1), b(0), f(2), b(1), f(3), b(2), b(3),
    )  # fmt: skip
    assert theory.schedule_order("1f1b", Pipeline(2, 4), 1) == (
        f(0), b(0), f(1), b(1), f(2), b(2), f(3), b(3),
    )  # fmt: skip
    assert theory.schedule_order("1f1b", Pipeline(4, 2), 0) == (f(0), f(1), b(0), b(1))
    assert theory.schedule_order("gpipe", Pipeline(3, 2), 2) == (f(0), f(1), b(0), b(1))


@pytest.mark.unit
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_in_flight_of_the_orders_is_the_formula(schedule):
    for p in range(1, 6):
        for m in range(1, 9):
            pipe = Pipeline(p, m)
            for s in range(p):
                order = theory.schedule_order(schedule, pipe, s)
                assert sorted((a.kind, a.micro) for a in order) == sorted(
                    [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
                )
                assert theory.most_in_flight(order) == theory.max_in_flight(schedule, pipe, s)
    assert theory.max_in_flight("gpipe", Pipeline(4, 8), 0) == 8
    assert theory.max_in_flight("1f1b", Pipeline(4, 8), 0) == 4
    assert theory.max_in_flight("1f1b", Pipeline(4, 8), 3) == 1


@pytest.mark.unit
def test_p2p_bytes_by_hand():
    pipe = Pipeline(3, 4)
    assert theory.p2p_bytes_per_step(pipe, 0, received=100, sent=64) == 4 * 64
    assert theory.p2p_bytes_per_step(pipe, 1, received=64, sent=32) == 4 * (32 + 64)
    assert theory.p2p_bytes_per_step(pipe, 2, received=32, sent=8) == 4 * 32


@pytest.mark.unit
def test_bad_arithmetic_input_is_one_line():
    for call in (
        lambda: Pipeline(0, 4),
        lambda: Pipeline(2, 4, per_rank=0),
        lambda: theory.schedule_order("zb", Pipeline(2, 4), 0),
        lambda: theory.max_in_flight("1f1b", Pipeline(2, 4), 2),
        lambda: theory.p2p_bytes_per_step(Pipeline(2, 4), 0, -1, 4),
    ):
        with pytest.raises(ValueError) as e:
            call()
        assert "\n" not in str(e.value)


# -- at 2 ranks ----------------------------------------------------------------------------------
def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, OUT),
    )  # fmt: skip


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, OUT, generator=g)


def _grads(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in module.named_parameters()}


def _stage(rank: int) -> Stage:
    module = _model()[:SPLIT] if rank == 0 else _model()[SPLIT:]
    return Stage(
        module, rank, 2, None, None if rank == 0 else 0, 1 if rank == 0 else None,
        (BATCH // M, WIDTH),
    )  # fmt: skip


def _micro(rank: int, x, y, count: int = M) -> MicroBatches:
    return MicroBatches(
        count, tuple(x.chunk(count)) if rank == 0 else (), tuple(y.chunk(count)) if rank else ()
    )


def _refusal(stage: Stage, micro: MicroBatches, schedule: str = "1f1b") -> str:
    try:
        run_schedule(stage, micro, nn.functional.mse_loss, schedule)
    except ValueError as e:
        return str(e)
    return "no error"


def _bad_inputs(rank: int, x, y) -> dict[str, str]:
    """Each rank's error for a count that differs between ranks, a first stage's input of the
    wrong shape, a last stage with fewer targets than micro-batches, and a first stage asking
    for a schedule there is none of."""
    return {
        "count": _refusal(_stage(rank), _micro(rank, x, y, M if rank == 0 else 2)),
        "shape": _refusal(_stage(rank), _micro(rank, x[:, :-1], y)),
        "targets": _refusal(_stage(rank), MicroBatches(M, tuple(x.chunk(M)), tuple(y.chunk(2)))),
        "schedule": _refusal(_stage(rank), _micro(rank, x, y), "zb" if rank == 0 else "1f1b"),
    }


def _native(rank: int, schedule: str, x, y) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = _stage(rank)
    native = PipelineStage(stage.module, rank, 2, torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    run = kind(native, M, loss_fn=nn.functional.mse_loss)
    losses = []
    run.step(x) if rank == 0 else run.step(target=y, losses=losses)
    return {"losses": [t.detach() for t in losses], "grads": _grads(stage.module)}


def pipeline_worker() -> dict:
    rank = dist.get_rank()
    x, y = _data()
    out = {"refusals": _bad_inputs(rank, x, y)}  # first: a stray send would spoil what follows
    plain = _model()
    loss = nn.functional.mse_loss(plain(x), y)
    loss.backward()
    names = set(dict(_stage(rank).module.named_parameters()))
    out["plain"] = {
        "loss": loss.detach(),
        "grads": {k: g for k, g in _grads(plain).items() if k in names},
    }
    for schedule in SCHEDULES:
        stage = _stage(rank)
        step = run_schedule(stage, _micro(rank, x, y), nn.functional.mse_loss, schedule)
        out[f"reference {schedule}"] = {
            "losses": list(step.losses),
            "grads": _grads(stage.module),
            "bytes": step.bytes_sent,
            "in_flight": step.max_in_flight,
        }
        out[f"native {schedule}"] = _native(rank, schedule, x, y)
    return out


def _check_matches_plain(rank: int, res: dict, case: str) -> None:
    got, plain = res[case], res["plain"]
    assert got["grads"].keys() == plain["grads"].keys(), case
    for k, g in plain["grads"].items():
        torch.testing.assert_close(got["grads"][k], g, rtol=1e-5, atol=1e-6, msg=f"{case} {k}")
    if rank == 1:  # the last stage has the losses: their mean is the full batch's loss
        assert len(got["losses"]) == M, case
        torch.testing.assert_close(
            torch.stack(got["losses"]).mean(), plain["loss"], rtol=1e-5, atol=1e-6
        )


def _check_refusals(results: list[dict]) -> None:
    for res in results:
        for case, message in res["refusals"].items():
            assert message != "no error" and "\n" not in message, (case, message)
    first, last = (r["refusals"] for r in results)
    assert "disagree on the micro-batch count" in first["count"] + last["count"]
    assert "input micro-batch 0 is (2, 15)" in first["shape"]
    assert "another stage refused" in last["shape"]
    assert "1 has 2 target micro-batches" in last["targets"]
    assert "unknown pipeline schedule 'zb'" in first["schedule"]


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_schedules_match_the_plain_model_at_2_ranks(pool):
    results = pool(2).run(pipeline_worker, timeout=90)
    pipe = Pipeline(2, M)
    activation = BATCH // M * WIDTH * 4  # fp32 bytes of one micro-batch between the stages
    for rank, res in enumerate(results):
        for schedule in SCHEDULES:
            for impl in ("reference", "native"):
                _check_matches_plain(rank, res, f"{impl} {schedule}")
            ours = res[f"reference {schedule}"]
            received = BATCH // M * WIDTH * 4  # stage 0 receives its input's size
            assert ours["bytes"] == theory.p2p_bytes_per_step(pipe, rank, received, activation)
            assert ours["in_flight"] == theory.max_in_flight(schedule, pipe, rank)
    _check_refusals(results)
