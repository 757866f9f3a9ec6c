"""--strategy accelerate: Hugging Face Accelerate's prepared DDP step equals ours."""

import os

import pytest
import torch
import torch.distributed as dist

from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from parallel_kernels.models import MODELS
from parallel_kernels.strategies import STRATEGIES
from tests.test_fsdp import CPU, rank_batches, single_process, tiny
from tests.test_harness import FAST, run_points
from tests.test_precision import AUTOCAST_TOLERANCE

# The test extra installs Accelerate: under CI="true" its absence fails these tests.
pytestmark = [pytest.mark.ci_needs("Accelerate"), pytest.mark.ranks]


@pytest.fixture(autouse=True)
def _accelerate():
    pytest.importorskip(
        "accelerate", reason="Accelerate is not installed (pip install -e '.[accelerate]')"
    )


def _torchrun_env() -> None:
    """What torchrun would have set: Accelerate reads it to know it is distributed."""
    os.environ.update(
        RANK=str(dist.get_rank()),
        LOCAL_RANK=str(dist.get_rank()),
        WORLD_SIZE=str(dist.get_world_size()),
        LOCAL_WORLD_SIZE=str(dist.get_world_size()),
    )


def accelerate_worker(impl: str, steps: int) -> list[float]:
    _torchrun_env()
    model = STRATEGIES["accelerate"].apply(impl, tiny(), group=None, device=CPU)
    backward = model.accelerator.backward if impl == "accelerate" else torch.Tensor.backward
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in rank_batches(dist.get_world_size(), dist.get_rank(), steps):
        opt.zero_grad(set_to_none=True)
        loss = MODELS["transformer"].loss(model(x), y)
        backward(loss)
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses)
    dist.all_reduce(losses)
    return (losses / dist.get_world_size()).tolist()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("impl", ["accelerate", "native"])
def test_accelerate_step_matches_single_process(pool, impl):
    steps = 3
    results = pool(2).run(accelerate_worker, impl, steps)
    _, expected = single_process(2, steps)
    for losses in results:
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(expected), rtol=1e-5, atol=1e-5
        )


def accelerate_points(root: str) -> list[dict]:
    _torchrun_env()
    points = build_points(
        RunConfig(sweep="precision", model="mlp", strategy="accelerate"), world_size=2
    )
    points += build_points(
        RunConfig(
            sweep="grad_accum", values="2", model="mlp", strategy="accelerate", impl="accelerate"
        ),
        world_size=2,
    )
    return run_points(points, root, FAST)


@pytest.mark.timeout(300)
def test_accelerate_points_in_sweeps(pool, tmp_path):
    rows = pool(2).run(accelerate_points, str(tmp_path))[0]
    by = {(r["sweep"], r["value"], r["impl"]): r for r in rows}
    for key, r in by.items():
        assert r["status"] == "ok", (key, r["error"])
        assert r["comm_bytes_per_step"] == r["grad_bytes"]  # fp32 gradients, once per step
    for impl in ("native", "accelerate"):
        fp32, bf16 = by[("precision", "fp32", impl)], by[("precision", "bf16", impl)]
        assert bf16["loss"] != fp32["loss"]  # autocast really ran
        # measured: 0.045 %, as under DDP's autocast (test_precision.py)
        assert abs(bf16["loss"] - fp32["loss"]) <= AUTOCAST_TOLERANCE * fp32["loss"], (impl, bf16)
    # the same autocast, the same numbers: Accelerate adds no arithmetic of its own
    assert by[("precision", "bf16", "accelerate")]["loss"] == pytest.approx(
        by[("precision", "bf16", "native")]["loss"], rel=1e-6
    )
