"""Reference DDP against native DDP and against single-process training on the whole batch."""

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist

from bench.runner.train.data import Batches
from parallel_kernels.ddp import MB, plan_buckets
from parallel_kernels.models import MODELS, build_model, grad_bytes
from parallel_kernels.strategies import STRATEGIES

BATCH = 16
CPU = torch.device("cpu")


def rank_batches(model: str, world: int, rank: int, steps: int, micro: int) -> list[list[tuple]]:
    data = MODELS[model].dataset(BATCH * world * 4, 0)
    it = Batches(data, batch_size=BATCH, rank=rank, world_size=world, device=CPU)
    return [[next(it) for _ in range(micro)] for _ in range(steps)]


def train(module, loss_fn, step_batches) -> list[torch.Tensor]:
    """SGD steps; all micro-batches but the last of a step run under ``no_sync``.

    SGD rather than the harness's AdamW: Adam divides by the gradient's own magnitude, which
    turns last-bit differences of near-zero gradients (summation order) into visible parameter
    differences, while what is under test here is that the averaged gradients are right."""
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    for micro_batches in step_batches:
        opt.zero_grad(set_to_none=True)
        for j, (x, y) in enumerate(micro_batches):
            last = j == len(micro_batches) - 1
            ctx = nullcontext() if last or not hasattr(module, "no_sync") else module.no_sync()
            with ctx:
                loss_fn(module(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in module.parameters()]


def ddp_worker(model: str, cap_mb: float, steps: int, micro: int) -> dict:
    """On every rank: train each DDP implementation from a rank-specific initialisation (the
    start-up broadcast must make them equal) and return the final parameters and counters."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for impl in STRATEGIES["ddp"].impls:
        plain = build_model(model, seed=1000 + rank)  # different on every rank on purpose
        if rank != 0:
            reference_init = build_model(model, seed=1000)
            assert any(
                not torch.equal(a, b)
                for a, b in zip(plain.parameters(), reference_init.parameters(), strict=True)
            )
        wrapped = STRATEGIES["ddp"].apply(impl, plain, group=None, device=CPU, bucket_cap_mb=cap_mb)
        params = train(wrapped, MODELS[model].loss, rank_batches(model, world, rank, steps, micro))
        stats = getattr(wrapped, "comm_stats", None)
        out[impl] = {
            "params": params,
            "comm": (stats.calls, stats.bytes) if stats else None,
            "buckets": len(wrapped.bucket_sizes) if hasattr(wrapped, "bucket_sizes") else None,
        }
    return out


def single_process(model: str, world: int, steps: int, micro: int) -> list[torch.Tensor]:
    """The same steps on one process, each micro-batch the concatenation of all ranks' ones."""
    per_rank = [rank_batches(model, world, r, steps, micro) for r in range(world)]
    merged = [
        [
            tuple(torch.cat([per_rank[r][s][m][k] for r in range(world)]) for k in range(2))
            for m in range(micro)
        ]
        for s in range(steps)
    ]
    return train(build_model(model, seed=1000), MODELS[model].loss, merged)


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("cap_mb,micro", [(0.25, 1), (25.0, 1), (0.25, 2)])
def test_ddp_matches_native_and_single_process(pool, world, cap_mb, micro):
    model, steps = "mlp", 3
    results = pool(world).run(ddp_worker, model, cap_mb, steps, micro)
    expected = single_process(model, world, steps, micro)
    largest = max(p.numel() * p.element_size() for p in build_model(model).parameters())
    if cap_mb == 0.25:
        assert cap_mb * MB < largest  # the case where a parameter exceeds the cap
    for rank, res in enumerate(results):
        for impl, got in res.items():
            for g, e in zip(got["params"], expected, strict=True):
                torch.testing.assert_close(g, e, msg=lambda m, i=impl, r=rank: f"{i} rank {r}: {m}")
        for g, n in zip(res["reference"]["params"], res["native"]["params"], strict=True):
            torch.testing.assert_close(g, n)


@pytest.mark.ranks
@pytest.mark.timeout(180)
@pytest.mark.parametrize("world,micro", [(2, 1), (4, 2)])
def test_comm_bytes_are_gradient_bytes_per_synchronised_step(pool, world, micro):
    model, steps, cap_mb = "mlp", 3, 0.25
    results = pool(world).run(ddp_worker, model, cap_mb, steps, micro)
    m = build_model(model)
    n_buckets = len(plan_buckets(list(reversed(list(m.parameters()))), cap_mb))
    param_bytes = grad_bytes(m)
    for res in results:
        for impl in ("reference", "reference_nooverlap"):
            calls, nbytes = res[impl]["comm"]
            assert res[impl]["buckets"] == n_buckets
            # one broadcast of the parameters at start, then one all-reduce per bucket per
            # optimiser step: no_sync micro-steps send nothing
            assert calls == 1 + steps * n_buckets
            assert nbytes == param_bytes + steps * param_bytes


@pytest.mark.unit
def test_plan_buckets_respects_cap_and_order():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (10, 300_000, 20, 30, 70_000)]
    buckets = plan_buckets(params, cap_mb := 0.5)
    flat = [p for b in buckets for p in b]
    assert [id(p) for p in flat] == [id(p) for p in params]  # order kept, nothing split
    for b in buckets:
        size = sum(p.numel() * 4 for p in b)
        assert size <= cap_mb * MB or len(b) == 1
    assert [len(b) for b in buckets] == [1, 1, 3]  # 1.2 MB alone; 10 alone before it
    with pytest.raises(ValueError):
        plan_buckets(params, 0)


def released_worker() -> tuple[bool, bool]:
    """(a parameter of a trained reference DDP model alive after its last reference went,
    and the same for native DDP), after the collector ran."""
    import gc
    import weakref

    alive = []
    for impl in ("reference", "native"):
        model = build_model("mlp", seed=0)
        wrapped = STRATEGIES["ddp"].apply(impl, model, group=None, device=torch.device("cpu"))
        wrapped(torch.ones(4, model.net[0].in_features)).sum().backward()
        param = weakref.ref(next(model.parameters()))
        del model, wrapped
        gc.collect()
        alive.append(param() is not None)
    return tuple(alive)


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_a_released_reference_ddp_model_is_freed(pool):
    """Its gradients' hooks hold the wrapper weakly: a bound method there kept the whole model
    alive after its point ended (a cycle through autograd's C++ side, which the collector
    cannot see), and the harness's memory figures read it as the point's leftover."""
    for reference, native in pool(2).run(released_worker):
        assert not reference and not native
