"""What the benchmarks time, run on the ranks of the session's pool (module-level functions, so
that spawned rank processes can import them).

Each call runs ``iters`` iterations with the suite's own timing discipline (``timed_steps``:
barrier, per-iteration times, slowest rank) and returns the median seconds per iteration, so a
benchmark round measures the work and never the pool's start-up or its messaging. ``slow``
makes every iteration of the reference implementation ``1 + slow`` times as long (a sleep of
``slow`` times the iteration's own time, so the factor holds however loaded the machine is):
the tests use it to prove that the regression gate fails when a kernel gets slower.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from bench.runner.measure.timing import timed_steps
from bench.runner.train.data import Batches
from parallel_kernels.collectives import COLLECTIVES, count_wrong
from parallel_kernels.mesh import data_parallel_coords
from parallel_kernels.models import MLP, MODELS, Transformer
from parallel_kernels.strategies import STRATEGIES

CPU = torch.device("cpu")


def _slowed(fn, impl: str, slow: float):
    if impl == "native" or slow <= 0:
        return fn

    def slowed():
        start = time.perf_counter()
        fn()
        time.sleep(slow * (time.perf_counter() - start))

    return slowed


def collective(name: str, impl: str, nbytes: int, iters: int, slow: float = 0.0) -> dict:
    """Seconds per call of a collective on ``nbytes`` (float32, sum), and #wrong elements of
    one checked call afterwards."""
    coll, n, rank = COLLECTIVES[name], dist.get_world_size(), dist.get_rank()
    count = coll.align(nbytes // 4, n)
    op = coll.ops[0] if coll.ops[0] != "none" else "sum"
    inp, out, _ = coll.buffers(count, torch.float32, rank, n, op, CPU)
    run = _slowed(lambda: coll.run(impl, inp, out, op), impl, slow)
    run()  # warm-up: connections, workspaces
    slowest, _ = timed_steps(run, iters, device=CPU, group=None)
    inp, out, expected = coll.buffers(count, torch.float32, rank, n, op, CPU)
    coll.run(impl, inp, out, op)
    seconds = float(np.median(slowest)) / 1e3
    size = coll.size_bytes(count, torch.float32)
    return {
        "seconds": seconds,
        "size_bytes": size,
        "busbw_GBps": size / seconds * coll.busbw_factor(n) / 1e9,
        "wrong": count_wrong(out, expected),
    }


def tiny_transformer() -> Transformer:
    torch.manual_seed(0)
    return Transformer(vocab=128, dim=64, heads=4, layers=2, seq=32)


# (strategy, options, model builder, model spec for data and loss) per training workload
TRAINING = {
    "ddp": ("ddp", {"bucket_cap_mb": 1.0}, lambda: MLP(), "mlp"),
    "fsdp": ("fsdp", {"sharding_strategy": "FULL_SHARD"}, tiny_transformer, "transformer"),
    "tp": ("tp", {"tp_degree": 2}, lambda: MLP((784, 1024, 1024, 10)), "mlp"),
}
_LIVE: dict[tuple[str, str], tuple] = {}  # the models a rank keeps between rounds


def _trainer(workload: str, impl: str, batch_size: int = 32):
    strategy, options, build, spec_name = TRAINING[workload]
    spec = MODELS[spec_name]
    torch.manual_seed(0)
    model = STRATEGIES[strategy].apply(impl, build(), group=None, device=CPU, **options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dp_rank, dp_size = data_parallel_coords(model, dist.get_rank(), dist.get_world_size())
    data = spec.dataset(batch_size * dp_size * 4, 0)
    if spec_name == "transformer":  # the tiny model's vocabulary and sequence
        x, y = (t[:, :32] % 128 for t in data.tensors)
        data = torch.utils.data.TensorDataset(x.contiguous(), y.contiguous())
    batches = Batches(data, batch_size=batch_size, rank=dp_rank, world_size=dp_size, device=CPU)

    last = [torch.zeros(())]

    def step() -> None:
        x, y = next(batches)
        opt.zero_grad(set_to_none=True)
        loss = spec.loss(model(x), y)
        loss.backward()
        opt.step()
        last[0] = loss.detach()  # read after timing, not here

    step()
    first = float(last[0])
    for _ in range(2):
        step()
    return model, step, first, last


def train_step(workload: str, impl: str, iters: int, slow: float = 0.0) -> dict:
    """Seconds per training step, and the loss of the model's first and latest step; the model
    is built on the first call and kept."""
    key = (workload, impl)
    if key not in _LIVE:
        _LIVE[key] = _trainer(workload, impl)
    _, step, first, last = _LIVE[key]
    slowest, _ = timed_steps(_slowed(step, impl, slow), iters, device=CPU, group=None)
    # the loss of the first step the model took, and of its latest: the steps timed train it
    return {"seconds": float(np.median(slowest)) / 1e3, "first_loss": first, "loss": float(last[0])}


def release() -> None:
    """Drop every kept model on every rank."""
    _LIVE.clear()
