"""Your own model through ``--model FILE:FACTORY``: the worked example trains under every
strategy it has the facts for, a missing fact is an error row naming it, and every way a
factory can be wrong is one line and exit 2 before any rank trains."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from bench.runner.cli import main
from bench.runner.configure.resolve import PointRequest, VisitSettings, resolve_point
from parallel_kernels.models import build_model, workload
from tests.test_harness import FAST, TRAINED_STEPS, pool_env

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = f"{REPO}/examples/custom_model.py:workload"
BAD = f"{REPO}/tests/data/models/bad_models.py"


@pytest.mark.e2e
@pytest.mark.parametrize(
    "model,message",
    [
        (f"{BAD}:not_callable", "not_callable is a int, not callable"),
        (f"{BAD}:a_module", "a_module() returned a Linear, not a parallel_kernels.Workload"),
        (f"{BAD}:raises", "raises() raised RuntimeError: no GPU configured"),
        (f"{BAD}:missing", "has no 'missing'"),
        (f"{BAD}:plan_names_a_missing_module", "names 'blocks.*.upp', a module the model does"),
        (f"{BAD}:units_the_model_lacks", "has no module of its fsdp_units (GRU)"),
        (f"{REPO}/tests/data/models/broken_model.py:x", "does not import: ImportError"),
        ("no/such/file.py:workload", "model file no/such/file.py does not exist"),
        ("no.such.module:workload", "model module no.such.module does not import"),
        ("llama:huge", "unknown size 'huge' of llama"),
        ("gpt3", "unknown model 'gpt3'"),
    ],
)
def test_a_wrong_model_is_one_line_and_exit_2(model, message, capsys, no_torchrun):
    with pytest.raises(SystemExit) as exc:
        main(["--sweep", "bucket_cap_mb", "--model", model])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.unit
def test_the_example_builds_the_same_weights_and_batches():
    a, b = build_model(EXAMPLE, seed=3), build_model(EXAMPLE, seed=3)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    wl = workload(EXAMPLE)
    x1, y1 = wl.batch(8, 0)
    x2, y2 = wl.batch(8, 0)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and x1.shape == (8, wl.tokens_per_sample)


def _point(sweep: str, strategy: str, impl: str, knobs: dict, model: str = EXAMPLE):
    return resolve_point(
        PointRequest(
            sweep=sweep,
            values={sweep: next(iter(knobs.values()))},
            model=model,
            strategy=strategy,
            impl=impl,
            knobs=knobs,
            world_size=2,
            per_visit=VisitSettings(batch_size=8, **TRAINED_STEPS),
        )
    )


def example_points(root: str) -> list[dict]:
    from bench.runner.train.lifecycle import run_point

    points = [
        _point("bucket_cap_mb", "ddp", "native", {"bucket_cap_mb": 1.0}),
        _point("sharding_strategy", "fsdp", "native", {"sharding_strategy": "FULL_SHARD"}),
        _point("sharding_strategy", "fsdp", "reference", {"sharding_strategy": "FULL_SHARD"}),
        _point("tp_degree", "tp", "native", {"tp_degree": 2}),
        _point("tp_degree", "tp", "reference", {"tp_degree": 2}),
        _point("activation_checkpointing", "ddp", "native", {"activation_checkpointing": "on"}),
        _point("tp_degree", "tp", "native", {"tp_degree": 2}, model=f"{BAD}:no_tp_plan"),
        _point("sharding_strategy", "fsdp", "native", {"sharding_strategy": "HYBRID_SHARD"}),
    ]
    return [run_point(p, pool_env(), FAST, Path(root) / p.id).as_dict() for p in points]


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_the_example_runs_every_strategy_and_a_missing_fact_is_named(pool, tmp_path):
    rows = pool(2).run(example_points, str(tmp_path))[0]
    *ok, no_plan, hybrid = rows
    for r in ok:
        assert r["status"] == "ok", (r["point"], r["error"])
        # it trained (chance is ln 16 = 2.77; 1.97 measured) and it communicated
        assert r["loss"] < 2.3 and r["comm_bytes_per_step"] > 0, r["point"]
    # the same steps on the same data: every data-parallel strategy reaches the same loss, and
    # so do the two tensor-parallel implementations (another batch per replica at dp 1)
    ddp, fsdp, fsdp_ref, tp, tp_ref, ckpt = (r["loss"] for r in ok)
    for other in (fsdp, fsdp_ref, ckpt):
        assert other == pytest.approx(ddp, rel=1e-4)
    assert tp_ref == pytest.approx(tp, rel=1e-4)
    assert no_plan["status"] == "error"
    assert "tensor parallelism needs a tp_plan" in no_plan["error"], no_plan["error"]
    assert hybrid["status"] == "error" and "HYBRID_SHARD needs" in hybrid["error"]


@pytest.mark.unit
def test_a_dict_batch_and_a_model_that_returns_its_own_loss():
    """Hugging Face's shape: ``model(**inputs).loss``, no loss function, no targets."""

    class OwnLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": ((self.lin(x).squeeze(-1) - labels) ** 2).mean()}

    def batch(n, seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 4, generator=g)
        return {"x": x, "labels": x.sum(-1)}, None

    wl = dataclasses.replace(workload(EXAMPLE), name="own", build=OwnLoss, batch=batch, loss=None)
    data = torch.utils.data.DataLoader(wl.dataset(16, 0), batch_size=8)
    inputs, _ = next(iter(data))
    model = OwnLoss()
    loss = wl.compute_loss(wl.forward(model, inputs), None)
    assert loss.dim() == 0 and torch.isfinite(loss)
    with pytest.raises(ValueError, match="gives no loss and its model's output carries none"):
        dataclasses.replace(wl, loss=None).compute_loss(torch.zeros(2), None)


ODD = f"{REPO}/tests/data/models/odd_model.py"
ODD_POINTS = [  # (sweep, strategy, impl, knobs)
    ("bucket_cap_mb", "ddp", "native", {"bucket_cap_mb": 1.0}),
    ("bucket_cap_mb", "ddp", "reference", {"bucket_cap_mb": 1.0}),
    ("sharding_strategy", "fsdp", "reference", {"sharding_strategy": "FULL_SHARD"}),
    ("activation_checkpointing", "ddp", "native", {"activation_checkpointing": "on"}),
    ("grad_accum", "ddp", "native", {"grad_accum": 2}),
    ("tp_degree", "tp", "native", {"tp_degree": 2}),
    ("tp_degree", "tp", "reference", {"tp_degree": 2}),
    ("sharding_strategy", "fsdp", "native", {"sharding_strategy": "FULL_SHARD"}),
    ("sharding_strategy", "fsdp", "native_fsdp1", {"sharding_strategy": "FULL_SHARD"}),
]
TORCH_FSDPS = 2  # the last two: torch's FSDP2 and FSDP1, which refuse 0-dim parameters


def odd_points(root: str) -> list[dict]:
    """The odd model (every kind of parameter and buffer) through every strategy; torch's two
    FSDPs once more with its gates 1-D."""
    from bench.runner.train.lifecycle import run_point

    points = [_point(*p, model=f"{ODD}:workload") for p in ODD_POINTS]
    points += [_point(*p, model=f"{ODD}:workload_1d_gate") for p in ODD_POINTS[-TORCH_FSDPS:]]
    return [run_point(p, pool_env(), FAST, Path(root) / p.id).as_dict() for p in points]


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_a_model_with_every_kind_of_parameter_and_buffer_runs_every_strategy(pool, tmp_path):
    """0-dim and frozen parameters, tied weights, a ModuleDict and a ParameterList, integer,
    boolean, non-contiguous and non-persistent buffers, a dict output with its own loss."""
    rows = pool(2).run(odd_points, str(tmp_path))[0]
    n = len(ODD_POINTS) - TORCH_FSDPS
    ok, refused, one_d = rows[:n], rows[n : len(ODD_POINTS)], rows[len(ODD_POINTS) :]
    for r in ok + one_d:
        assert r["status"] == "ok", (r["point"], r["error"])
        assert r["comm_bytes_per_step"] > 0, r["point"]
    # torch's FSDPs say what to change, by the parameter's name: an error row, the sweep goes on
    for r in refused:
        assert r["status"] == "error" and "support scalar parameters" in r["error"], r["error"]
        assert "Change gate to a 1D tensor" in r["error"], r["error"]
    # the same steps on the same data: the data-parallel strategies reach the same loss, and
    # so do the two tensor-parallel implementations; the 1-D gates compute the same function
    ddp, ddp_ref, fsdp_ref, ckpt, _accum, tp, tp_ref = (r["loss"] for r in ok)
    for other in (ddp_ref, fsdp_ref, ckpt, *(r["loss"] for r in one_d)):
        assert other == pytest.approx(ddp, rel=1e-4)
    assert tp_ref == pytest.approx(tp, rel=1e-4)


@pytest.mark.e2e
def test_a_batch_that_is_not_inputs_and_targets_is_one_line_and_exit_2(capsys, no_torchrun):
    with pytest.raises(SystemExit) as exc:
        main(["--sweep", "bucket_cap_mb", "--model", f"{ODD}:returns_a_dict_batch"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert (
        "returns_a_dict_batch().batch(2, 0) returned a dict with keys ['labels', 'tokens'], "
        "not (inputs, targets): return (inputs, None) when the model's output carries its own "
        "loss" in err
    ), err
