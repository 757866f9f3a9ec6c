"""Activation checkpointing: the same gradients, alone and under DDP and FSDP, less memory."""

import pytest
import torch
import torch.distributed as dist

from bench.runner.configure.config import RunConfig
from bench.runner.configure.resolve import build_points
from parallel_kernels.checkpointing import checkpoint_blocks
from parallel_kernels.models import MLP, MODELS
from parallel_kernels.strategies import STRATEGIES
from tests.test_fsdp import CPU, rank_batches, single_process, tiny, train
from tests.test_harness import FAST, run_points


@pytest.mark.unit
def test_checkpointed_blocks_give_identical_gradients():
    x, y = rank_batches(1, 0, 1)[0]
    grads = []
    for ac in (False, True):
        model = tiny()
        if ac:
            checkpoint_blocks(model)
        MODELS["transformer"].loss(model(x), y).backward()
        grads.append({k: p.grad for k, p in model.named_parameters()})
    for k, g in grads[0].items():
        torch.testing.assert_close(grads[1][k], g, rtol=0, atol=0, msg=k)
    with pytest.raises(ValueError, match="works per block; MLP has none"):
        checkpoint_blocks(MLP())


def checkpointed_worker(strategy: str, impl: str, steps: int) -> list[float]:
    model = STRATEGIES[strategy].apply(impl, checkpoint_blocks(tiny()), group=None, device=CPU)
    return train(model, rank_batches(dist.get_world_size(), dist.get_rank(), steps))


@pytest.mark.ranks
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "strategy,impl",
    [("ddp", "native"), ("ddp", "reference"), ("fsdp", "native"), ("fsdp", "native_fsdp1")],
)
def test_checkpointed_training_matches_single_process(pool, strategy, impl):
    steps = 3
    results = pool(2).run(checkpointed_worker, strategy, impl, steps)
    _, expected = single_process(2, steps)  # without checkpointing
    for losses in results:
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(expected), rtol=1e-5, atol=1e-5
        )


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_the_sweep_saves_memory_and_names_what_it_cannot_do(pool, tmp_path):
    points = build_points(
        RunConfig(sweep="activation_checkpointing", impl="native", batch_size=16), world_size=2
    )
    points += build_points(
        RunConfig(
            sweep="activation_checkpointing",
            values="on",
            strategy="fsdp",
            impl="reference",
            batch_size=16,
        ),
        world_size=2,
    )
    rows = pool(2).run(run_points, points, str(tmp_path), FAST, timeout=280)[0]
    by = {(r["strategy"], r["value"]): r for r in rows}
    off, on = by[("ddp", "off")], by[("ddp", "on")]
    assert off["status"] == on["status"] == "ok", (off["error"], on["error"])
    # activations of 4 blocks at batch 16 x 64 tokens are dropped after forward
    print(
        f"peak MB off {off['peak_mem_mb']:.1f} on {on['peak_mem_mb']:.1f}; step ms "
        f"off {off['step_ms_median']:.1f} on {on['step_ms_median']:.1f}"
    )
    assert on["peak_mem_mb"] < off["peak_mem_mb"] - 10, (on["peak_mem_mb"], off["peak_mem_mb"])
    assert on["comm_bytes_per_step"] == off["comm_bytes_per_step"]
    ref = by[("fsdp", "on")]
    assert ref["status"] == "error" and "not supported by the reference FSDP" in ref["error"]
