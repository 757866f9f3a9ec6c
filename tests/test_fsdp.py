"""Sharded data parallelism, reference and native, against single-process training."""

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist

from bench.runner.train.data import Batches
from parallel_kernels.fsdp_layout import fsdp_units, unit_params
from parallel_kernels.models import MODELS, Transformer
from parallel_kernels.strategies import STRATEGIES
from parallel_kernels.wrapped_step import unsynced

pytestmark = pytest.mark.ranks

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


def train(module, batches, lr: float = 0.1) -> list[float]:
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
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


def fsdp_worker(
    impl: str, strategy: str, steps: int, mixed_precision: str = "none", lr: float = 0.1
) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    model = STRATEGIES["fsdp"].apply(
        impl,
        tiny(),
        group=None,
        device=CPU,
        sharding_strategy=strategy,
        mixed_precision=mixed_precision,
    )
    losses = train(model, rank_batches(world, rank, steps), lr)
    full = STRATEGIES["fsdp"].replicated(model)
    if impl == "native_fsdp1":
        names = [n.replace("_fsdp_wrapped_module.", "") for n, _ in model.named_parameters()]
        out = {"params": dict(zip(names, full, strict=True))}
    elif impl == "native":
        names = [n for n, _ in model.named_parameters()]
        out = {"params": dict(zip(names, full, strict=True))}
    else:
        out = {
            "flats": full,
            "comm": (model.comm_stats.calls, model.comm_stats.bytes),
            "sharded_bytes": model.sharded_bytes(),
        }
    out["losses"] = losses
    return out


def single_process(world: int, steps: int, micro: int = 1):
    """The same SGD steps on one process, each batch the concatenation of every rank's; with
    ``micro`` > 1 each step accumulates the gradients of ``micro`` such batches. The losses:
    one per batch."""
    per_rank = [rank_batches(world, r, steps * micro) for r in range(world)]
    merged = [
        tuple(torch.cat([per_rank[r][b][k] for r in range(world)]) for k in range(2))
        for b in range(steps * micro)
    ]
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for s in range(steps):
        opt.zero_grad()
        for x, y in merged[s * micro : (s + 1) * micro]:
            loss = MODELS["transformer"].loss(model(x), y)
            loss.backward()
            losses.append(loss.item())
        opt.step()
    return model, losses


CASES = [(2, s) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")] + [
    (4, s) for s in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("impl", ["reference", "native", "native_fsdp1"])
@pytest.mark.parametrize("world,strategy", CASES)
def test_fsdp_matches_single_process(pool, impl, world, strategy):
    steps = 3
    results = pool(world).run(fsdp_worker, impl, strategy, steps)
    expected_model, expected_losses = single_process(world, steps)
    for res in results:
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(expected_losses), rtol=1e-5, atol=1e-5
        )
        if impl.startswith("native"):
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


def accumulating_worker(impl: str, steps: int, micro: int) -> dict:
    """FSDP training whose every step accumulates ``micro`` micro-batches, synchronising in the
    last one's backward only: the implementation's own way to skip it (its ``skip_sync``
    fact), through the helper the harness uses."""
    world, rank = dist.get_world_size(), dist.get_rank()
    model = STRATEGIES["fsdp"].apply(
        impl, tiny(), group=None, device=CPU, sharding_strategy="FULL_SHARD"
    )
    skip_sync = unsynced(model, STRATEGIES["fsdp"].impls[impl].skip_sync)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    batches = rank_batches(world, rank, steps * micro)
    losses = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        for j, (x, y) in enumerate(batches[s * micro : (s + 1) * micro]):
            with nullcontext() if j == micro - 1 else skip_sync():
                loss = MODELS["transformer"].loss(model(x), y)
                loss.backward()
            losses.append(loss.detach())
        opt.step()
    losses = torch.stack(losses)
    dist.all_reduce(losses)
    names = [n.replace("_fsdp_wrapped_module.", "") for n, _ in model.named_parameters()]
    full = STRATEGIES["fsdp"].replicated(model)
    return {"losses": (losses / world).tolist(), "params": dict(zip(names, full, strict=True))}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("impl", ["native", "native_fsdp1"])
def test_gradient_accumulation_matches_single_process(pool, impl):
    """FSDP2's set_requires_gradient_sync(False), FSDP1's no_sync: micro-batches accumulated
    without synchronisation train as one process does on every rank's micro-batches."""
    steps, micro = 3, 2
    results = pool(2).run(accumulating_worker, impl, steps, micro)
    expected_model, expected_losses = single_process(2, steps, micro)
    for res in results:
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(expected_losses), rtol=1e-5, atol=1e-5
        )
        for name, p in expected_model.named_parameters():
            torch.testing.assert_close(
                res["params"][name],
                p.detach(),
                rtol=1e-5,
                atol=1e-5,
                msg=lambda m, n=name: f"{n}: {m}",
            )


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


def state_dict_worker(impl: str, strategy: str) -> dict:
    world, rank = dist.get_world_size(), dist.get_rank()
    model = STRATEGIES["fsdp"].apply(
        impl, tiny(), group=None, device=CPU, sharding_strategy=strategy
    )
    train(model, rank_batches(world, rank, 2))
    if impl == "reference":
        state = model.full_state_dict()
    elif impl == "native_fsdp1":  # the seed's way: a full state dict gathered on rank 0
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
            state = model.state_dict()
        state = state if rank == 0 else {}
    else:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        state = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        state = state if rank == 0 else {}
    x, _ = rank_batches(world, 0, 1)[0]
    with torch.no_grad():
        out = model(x)  # a collective: every rank runs it
    return {"state": state, "x": x, "out": out}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("impl", ["reference", "native", "native_fsdp1"])
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_full_state_dict_on_rank0_loads_into_a_plain_model(pool, impl, strategy):
    res = pool(2).run(state_dict_worker, impl, strategy)
    assert res[1]["state"] == {}  # rank 0 only
    plain = tiny(seed=123)  # different weights until the state dict is loaded
    plain.load_state_dict(res[0]["state"])
    with torch.no_grad():
        torch.testing.assert_close(plain(res[0]["x"]), res[0]["out"], rtol=1e-5, atol=1e-5)


def held_bytes_worker(strategy: str) -> tuple[int, int]:
    """Parameter bytes the reference holds between forward and backward, and at rest."""
    from parallel_kernels.models import MLP

    torch.manual_seed(0)
    model = STRATEGIES["fsdp"].apply(
        "reference",
        MLP((512, 1024, 1024, 1024, 10)),
        group=None,
        device=CPU,
        sharding_strategy=strategy,
    )
    loss = model(torch.randn(4, 512)).square().mean()
    after_forward = model.held_bytes()
    loss.backward()
    at_rest = model.held_bytes()
    return after_forward, at_rest


@pytest.mark.timeout(120)
def test_memory_per_rank_falls_with_sharding(pool):
    held = {
        s: pool(2).run(held_bytes_worker, s)[0] for s in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
    }
    psi_bytes = 4 * (512 * 1024 + 1024 + 2 * (1024 * 1024 + 1024) + 1024 * 10 + 10)
    # between forward and backward: ZeRO-3 keeps its shard, ZeRO-2 the gathered parameters too
    assert held["FULL_SHARD"][0] == psi_bytes / 2
    assert held["SHARD_GRAD_OP"][0] == psi_bytes / 2 + psi_bytes
    assert held["NO_SHARD"][0] == psi_bytes  # replicated, nothing to gather
    assert held["FULL_SHARD"][0] < held["NO_SHARD"][0] < held["SHARD_GRAD_OP"][0]
    # at rest both sharded strategies hold half of what replication holds
    assert held["FULL_SHARD"][1] == held["SHARD_GRAD_OP"][1] == held["NO_SHARD"][1] / 2


def hybrid_without_mesh(root: str) -> list[dict]:
    from pathlib import Path

    from bench.runner.train.lifecycle import run_point
    from tests.test_harness import FAST, make_point, pool_env

    rows = []
    for hybrid_mesh in (False, True):
        point = make_point(
            "sharding_strategy",
            "mlp",
            "HYBRID_SHARD",
            "native_fsdp1",
            "fsdp",
            world_size=4,
            knobs={"sharding_strategy": "HYBRID_SHARD", "hybrid_mesh": hybrid_mesh},
        )
        rows.append(run_point(point, pool_env(), FAST, Path(root) / str(hybrid_mesh)).as_dict())
    return rows


@pytest.mark.timeout(240)
def test_silently_diverging_hybrid_shard_is_caught(pool, tmp_path):
    """FSDP1's HYBRID_SHARD without an explicit device mesh trains, but its replicas drift
    apart; the harness compares the gathered parameters of every rank and refuses the point."""
    without_mesh, with_mesh = pool(4).run(hybrid_without_mesh, str(tmp_path))[0]
    assert without_mesh["status"] == "error" and "diverged" in without_mesh["error"], without_mesh
    assert with_mesh["status"] == "ok", with_mesh["error"]


def fsdp_sweep_rows(root: str) -> list[dict]:
    from pathlib import Path

    from bench.runner.train.lifecycle import run_point
    from tests.test_harness import FAST, make_point, pool_env

    rows = []
    for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
        for impl in ("native", "native_fsdp1", "reference"):
            point = make_point(
                "sharding_strategy",
                "mlp",
                strategy,
                impl,
                "fsdp",
                knobs={"sharding_strategy": strategy},
            )
            rows.append(run_point(point, pool_env(), FAST, Path(root) / point.id).as_dict())
    return rows


@pytest.mark.timeout(300)
def test_sweep_points_report_what_the_zero_accounting_predicts(pool, tmp_path):
    rows = pool(2).run(fsdp_sweep_rows, str(tmp_path))[0]
    for r in rows:
        assert r["status"] == "ok", (r["point"], r["error"])
        # communication read back from the traces, against the strategy's own arithmetic
        if r["impl"] == "reference" and r["value"] == "FULL_SHARD":
            # the reference gathers again in backward only what backward reads: not the first
            # layer, whose input needs no gradient; so between ZeRO-2's volume and ZeRO-3's
            zero2 = r["comm_bytes_expected"] - r["grad_bytes"] / 2
            assert zero2 < r["comm_bytes_per_step"] < r["comm_bytes_expected"], r
        else:
            assert r["comm_bytes_per_step"] == pytest.approx(r["comm_bytes_expected"], rel=1e-3), r
        assert r["peak_rss_mb"] > 0 and r["peak_mem_mb"] > 0
        if r["value"] != "SHARD_GRAD_OP":  # FSDP's ZeRO-2 shards parameters at rest too
            assert r["state_mb"] == pytest.approx(r["state_mb_expected"], rel=1e-3), r
        # fp32 AdamW: gradient as large as the parameters, two moments twice as large
        assert r["grad_mb"] == pytest.approx(r["param_mb"]) and r["optim_mb"] == pytest.approx(
            2 * r["param_mb"]
        )
        assert r["state_mb"] == pytest.approx(r["param_mb"] + r["grad_mb"] + r["optim_mb"])
    state = {r["value"]: r["state_mb"] for r in rows if r["impl"] == "reference"}
    assert state["FULL_SHARD"] < state["NO_SHARD"]


# bf16 against fp32 training, measured over BF16_STEPS SGD steps (torch 2.13 CPU, every impl
# alike): the losses differ by at most 0.032, one bf16 spacing (2**-5 for losses in [4, 8):
# the loss is computed, so rounded, in bf16), the fp32 parameters by at most 2.8e-4. The same
# run with lr 0 (a model that does not train): losses 0.122 apart, parameters 0.045.
BF16_STEPS = 6
BF16_LOSS_ATOL = 2 * 2**-5
BF16_PARAM_ATOL = 1e-3


def bf16_losses_follow_fp32(res: dict, expected_losses: list[float]) -> None:
    torch.testing.assert_close(
        torch.tensor(res["losses"]), torch.tensor(expected_losses), rtol=0, atol=BF16_LOSS_ATOL
    )


def bf16_params_follow_fp32(res: dict, expected_model) -> None:
    if "flats" in res:  # the reference: one flat tensor per unit
        pairs = zip(res["flats"], flat_by_unit(expected_model), strict=True)
    else:
        pairs = ((res["params"][n], p.detach()) for n, p in expected_model.named_parameters())
    for got, want in pairs:
        assert got.dtype == torch.float32  # fp32 master weights
        torch.testing.assert_close(got, want, rtol=0, atol=BF16_PARAM_ATOL)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("impl", ["reference", "native", "native_fsdp1"])
def test_bf16_mixed_precision_trains_fp32_master_weights(pool, impl):
    """bf16 compute and reduction, fp32 shards: the losses and the weights follow fp32
    training to bf16's precision, and the weights stay fp32."""
    results = pool(2).run(fsdp_worker, impl, "FULL_SHARD", BF16_STEPS, "bf16")
    expected_model, expected_losses = single_process(2, BF16_STEPS)
    for res in results:
        bf16_losses_follow_fp32(res, expected_losses)
        bf16_params_follow_fp32(res, expected_model)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("impl", ["reference", "native", "native_fsdp1"])
def test_bf16_checks_fail_a_model_that_does_not_train(pool, impl):
    """The tolerances above tell training from no training: the same bf16 run with lr 0 fails
    the loss check and the parameter check, each on its own."""
    results = pool(2).run(fsdp_worker, impl, "FULL_SHARD", BF16_STEPS, "bf16", 0.0)
    expected_model, expected_losses = single_process(2, BF16_STEPS)
    for res in results:
        with pytest.raises(AssertionError, match="not close"):
            bf16_losses_follow_fp32(res, expected_losses)
        with pytest.raises(AssertionError, match="not close"):
            bf16_params_follow_fp32(res, expected_model)


def fsdp1_option_rows(root: str) -> list[dict]:
    from pathlib import Path

    from bench.runner.train.lifecycle import run_point
    from tests.test_harness import QUICK_FAIL, make_point, pool_env

    cases = [
        ("native_fsdp1", {"cpu_offload": True}),
        ("native_fsdp1", {"auto_wrap": "size"}),
        ("reference", {"cpu_offload": True}),
    ]
    rows = []
    for impl, extra in cases:
        point = make_point(
            "sharding_strategy",
            "wide_mlp",
            "FULL_SHARD",
            impl,
            "fsdp",
            knobs={"sharding_strategy": "FULL_SHARD", **extra},
        )
        row = run_point(point, pool_env(), QUICK_FAIL, Path(root) / f"{impl}{len(rows)}")
        rows.append(row.as_dict())
    return rows


@pytest.mark.timeout(240)
def test_fsdp1_options_run_or_say_why(pool, tmp_path):
    offload, size_wrap, not_for_reference = pool(2).run(fsdp1_option_rows, str(tmp_path))[0]
    # CPUOffload needs pinned memory, which needs an accelerator: an error row, with the reason
    if torch.cuda.is_available():
        assert offload["status"] == "ok"
    else:
        assert offload["status"] == "error" and offload["error"].startswith("rank "), offload
    assert size_wrap["status"] == "ok", size_wrap["error"]
    assert size_wrap["comm_calls_per_step"] > 0
    assert not_for_reference["status"] == "error"
    assert "exists only for native_fsdp1" in not_for_reference["error"]


def clipped_worker(impl: str, max_norm: float) -> dict:
    from parallel_kernels.wrapped_step import clip_grad_norm

    world, rank = dist.get_world_size(), dist.get_rank()
    model = STRATEGIES["fsdp"].apply(
        impl, tiny(), group=None, device=CPU, sharding_strategy="FULL_SHARD"
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    for x, y in rank_batches(world, rank, 3):
        opt.zero_grad(set_to_none=True)
        MODELS["transformer"].loss(model(x), y).backward()
        norms.append(float(clip_grad_norm(model, max_norm)))
        opt.step()
    full = STRATEGIES["fsdp"].replicated(model)
    return {"norms": norms, "full": full}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("impl", ["reference", "native", "native_fsdp1"])
def test_clip_grad_norm_sees_the_whole_model(pool, impl):
    max_norm = 0.2  # below the gradient norms of these steps (about 0.43)
    res = pool(2).run(clipped_worker, impl, max_norm)[0]
    per_rank = [rank_batches(2, r, 3) for r in range(2)]
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    for s in range(3):
        x, y = (torch.cat([per_rank[r][s][k] for r in range(2)]) for k in range(2))
        opt.zero_grad()
        MODELS["transformer"].loss(model(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
    assert min(norms) > max_norm  # clipping really happened
    torch.testing.assert_close(
        torch.tensor(res["norms"]), torch.tensor(norms), rtol=1e-4, atol=1e-5
    )
    want = flat_by_unit(model) if impl == "reference" else [p.detach() for p in model.parameters()]
    for got, w in zip(res["full"], want, strict=True):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-5)
