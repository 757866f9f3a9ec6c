"""Sharded data parallelism, reference and native, against single-process training."""

import pytest
import torch
import torch.distributed as dist

from bench.data import Batches
from parallel_kernels.fsdp import unit_params
from parallel_kernels.models import MODELS, Transformer
from parallel_kernels.strategies import STRATEGIES, fsdp_units

CPU = torch.device("cpu")
BATCH = 8


def tiny(seed: int = 0):
    torch.manual_seed(seed)
    return Transformer(vocab=64, dim=32, heads=2, layers=2, seq=16)


def rank_batches(world: int, rank: int, steps: int) -> list[tuple]:
    data = MODELS["transformer"].dataset(BATCH * world * 2, 0)
    tokens = data.tensors[0] % 64, data.tensors[1] % 64  # the tiny model's vocabulary
    data = torch.utils.data.TensorDataset(
        tokens[0][:, :16].contiguous(), tokens[1][:, :16].contiguous()
    )
    it = Batches(data, batch_size=BATCH, rank=rank, world_size=world, device=CPU)
    return [next(it) for _ in range(steps)]


def train(module, batches) -> list[float]:
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = MODELS["transformer"].loss(module(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    # the mean loss over ranks is the loss of the whole batch
    losses = torch.stack(losses)
    dist.all_reduce(losses)
    return (losses / dist.get_world_size()).tolist()


def flat_by_unit(model) -> list[torch.Tensor]:
    return [
        torch.cat([p.detach().reshape(-1) for _, _, p in params])
        for _, params in unit_params(model, fsdp_units(model))
    ]


def fsdp_worker(impl: str, strategy: str, steps: int) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    model = STRATEGIES["fsdp"].apply(
        impl, tiny(), group=None, device=CPU, sharding_strategy=strategy
    )
    losses = train(model, rank_batches(world, rank, steps))
    full = STRATEGIES["fsdp"].replicated(model)
    if impl == "native":
        names = [n for n, _ in model.named_parameters()]
        out = {"params": dict(zip(names, full, strict=True))}
    else:
        out = {
            "flats": full,
            "comm": (model.comm_stats.calls, model.comm_stats.bytes),
            "sharded_bytes": model.sharded_bytes(),
        }
        model.close()
    out["losses"] = losses
    return out


def single_process(world: int, steps: int):
    per_rank = [rank_batches(world, r, steps) for r in range(world)]
    merged = [
        tuple(torch.cat([per_rank[r][s][k] for r in range(world)]) for k in range(2))
        for s in range(steps)
    ]
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in merged:
        opt.zero_grad()
        loss = MODELS["transformer"].loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


CASES = [(2, s) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")] + [
    (4, s) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("impl", ["reference", "native"])
@pytest.mark.parametrize("world,strategy", CASES)
def test_fsdp_matches_single_process(pool, impl, world, strategy):
    steps = 3
    results = pool(world).run(fsdp_worker, impl, strategy, steps)
    expected_model, expected_losses = single_process(world, steps)
    for res in results:
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(expected_losses), rtol=1e-5, atol=1e-5
        )
        if impl == "native":
            for name, p in expected_model.named_parameters():
                torch.testing.assert_close(
                    res["params"][name],
                    p.detach(),
                    rtol=1e-5,
                    atol=1e-5,
                    msg=lambda m, n=name: f"{n}: {m}",
                )
        else:
            for got, want in zip(res["flats"], flat_by_unit(expected_model), strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def hybrid_at_two() -> str:
    try:
        STRATEGIES["fsdp"].apply(
            "reference", tiny(), group=None, device=CPU, sharding_strategy="HYBRID_SHARD"
        )
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.timeout(60)
def test_hybrid_needs_four_ranks(pool):
    msg = pool(2).run(hybrid_at_two)[0]
    assert "HYBRID_SHARD needs a shard group" in msg and "world size 2" in msg


def comm_worker(strategy: str, steps: int) -> tuple:
    world, rank = dist.get_world_size(), dist.get_rank()
    model = STRATEGIES["fsdp"].apply(
        "reference", tiny(), group=None, device=CPU, sharding_strategy=strategy
    )
    train(model, rank_batches(world, rank, steps))
    padded = [u.padded * 4 for u in model.units]
    out = (model.comm_stats.calls, model.comm_stats.bytes, padded, model.sharded_bytes())
    model.close()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "strategy,collectives_per_unit",
    [
        ("FULL_SHARD", 3),  # all-gather forward, all-gather again in backward, reduce-scatter
        ("SHARD_GRAD_OP", 2),  # all-gather forward, reduce-scatter
        ("NO_SHARD", 1),  # all-reduce
    ],
)
def test_communication_per_step_is_what_the_strategy_implies(pool, strategy, collectives_per_unit):
    steps = 2
    calls, nbytes, padded, sharded = pool(2).run(comm_worker, strategy, steps)[0]
    assert calls == steps * collectives_per_unit * len(padded)
    assert nbytes == steps * collectives_per_unit * sum(padded)
    expected_shard = sum(padded) // (1 if strategy == "NO_SHARD" else 2)
    assert sharded == expected_shard  # what this rank holds at rest
