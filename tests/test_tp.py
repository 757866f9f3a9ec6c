"""Tensor parallelism, reference (Megatron), naive and native (DTensor), against the dense model.

Every check runs inside the session's pool of gloo ranks: each rank builds the dense model too
(same seed), so the worker returns both sides and the test compares them.
"""

import pytest
import torch
import torch.distributed as dist

from bench.runner.train.data import Batches
from parallel_kernels import tensor_parallel as tp
from parallel_kernels.models import MLP, MODELS, Transformer
from parallel_kernels.strategies import STRATEGIES

CPU = torch.device("cpu")


def tiny_transformer(seed: int = 0):
    torch.manual_seed(seed)
    return Transformer(vocab=64, dim=32, heads=4, layers=2, seq=16)


def tiny_mlp(seed: int = 0):
    torch.manual_seed(seed)
    return MLP((16, 32, 24, 8))  # col 16->32, row 32->24, then 24->8 replicated


BUILD = {"transformer": tiny_transformer, "mlp": tiny_mlp}


def _inputs(model_name: str):
    g = torch.Generator().manual_seed(1)
    if model_name == "mlp":
        return torch.randn(6, 16, generator=g), torch.randn(6, 8, generator=g)
    return torch.randint(0, 64, (3, 16), generator=g), torch.randn(3, 16, 64, generator=g)


class SeedNaiveColumnLinear(tp.ColumnParallelLinear):
    """The seed's naive column layer: gathers its output with the list all-gather, which
    autograd cannot see (its own slice is put back so the weights still get a gradient), and
    no ``f`` in front, so the input gradient stays partial on every rank."""

    def forward(self, x):
        y = torch.nn.functional.linear(x, self.weight, self.bias)
        parts = [torch.empty_like(y) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, y.contiguous(), group=self.group)
        parts[dist.get_rank(self.group)] = y
        return torch.cat(parts, dim=-1)


def layer_worker(impl: str, model_name: str, degree: int) -> dict:
    """Forward output, input gradient and full weight gradients, TP and dense, on one batch."""
    x, w = _inputs(model_name)
    dense = BUILD[model_name]()
    apply_impl = "naive" if impl == "seed" else impl
    if impl == "seed":  # the seed's layer in place of the corrected naive one
        tp._LAYERS[tp.NAIVE] = lambda d, group, place: SeedNaiveColumnLinear(d, group)
    try:
        model = STRATEGIES["tp"].apply(
            apply_impl, BUILD[model_name](), group=None, device=CPU, tp_degree=degree
        )
    finally:
        tp._LAYERS[tp.NAIVE] = lambda d, group, place: tp.NaiveColumnLinear(d, group)
    out = {}
    for name, m in (("tp", model), ("dense", dense)):
        xi = x.clone().requires_grad_(model_name == "mlp")
        y = m(xi)
        (y * w).sum().backward()
        grads = m.full_grads() if name == "tp" else {k: p.grad for k, p in m.named_parameters()}
        out[name] = {"y": y.detach(), "dx": xi.grad, "grads": grads}
    out["plan"] = sorted(model.shard_dims)
    return out


def compare_layers(res: dict) -> None:
    tp_, dense = res["tp"], res["dense"]
    torch.testing.assert_close(tp_["y"], dense["y"], rtol=1e-4, atol=1e-5)
    if dense["dx"] is not None:
        torch.testing.assert_close(tp_["dx"], dense["dx"], rtol=1e-4, atol=1e-5)
    assert tp_["grads"].keys() == dense["grads"].keys()
    for k, g in dense["grads"].items():
        torch.testing.assert_close(tp_["grads"][k], g, rtol=1e-4, atol=1e-5, msg=k)


LAYER_CASES = [(2, 2), (4, 2), (4, 4)]


@pytest.mark.ranks
@pytest.mark.timeout(240)
@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
@pytest.mark.parametrize("world,degree", LAYER_CASES)
def test_tp_layers_match_dense(pool, world, degree, model_name):
    for impl in ("reference", "naive", "native"):
        for res in pool(world).run(layer_worker, impl, model_name, degree):
            compare_layers(res)
            assert res["plan"], "nothing was split"


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_the_seed_naive_layer_is_caught(pool):
    """Its input gradient is partial, so the comparison with the dense model fails."""
    results = pool(2).run(layer_worker, "seed", "mlp", 2)
    with pytest.raises(AssertionError):
        compare_layers(results[0])


def _batches(dp_size: int, dp_rank: int, steps: int) -> list[tuple]:
    data = MODELS["transformer"].dataset(4 * dp_size * 2, 0)
    x, y = (t[:, :16] % 64 for t in data.tensors)
    data = torch.utils.data.TensorDataset(x.contiguous(), y.contiguous())
    it = Batches(data, batch_size=4, rank=dp_rank, world_size=dp_size, device=CPU)
    return [next(it) for _ in range(steps)]


def train_worker(impl: str, degree: int, dp_shard: bool, steps: int, clip=None) -> dict:
    model = STRATEGIES["tp"].apply(
        impl, tiny_transformer(), group=None, device=CPU, tp_degree=degree, dp_shard=dp_shard
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in _batches(model.dp_size, model.dp_rank, steps):
        opt.zero_grad(set_to_none=True)
        loss = MODELS["transformer"].loss(model(x), y)
        loss.backward()
        if clip is not None:
            model.clip_grad_norm_(clip)
        opt.step()
        losses.append(loss.detach())
    losses = torch.stack(losses)
    dist.all_reduce(losses)  # every rank's loss: replicas' mean, TP ranks' copies
    out = {
        "losses": (losses / dist.get_world_size()).tolist(),
        "params": model.full_state(),
        "dp": (model.dp_rank, model.dp_size),
    }
    return out


def single_process(dp_size: int, steps: int, clip=None):
    per_rank = [_batches(dp_size, r, steps) for r in range(dp_size)]
    model = tiny_transformer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for s in range(steps):
        x, y = (torch.cat([per_rank[r][s][k] for r in range(dp_size)]) for k in range(2))
        opt.zero_grad()
        loss = MODELS["transformer"].loss(model(x), y)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return model, losses


TRAIN_CASES = [(2, 2, False), (4, 4, False), (4, 2, False), (4, 2, True), (4, 1, False)]


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("impl", ["reference", "naive", "native"])
@pytest.mark.parametrize("world,degree,dp_shard", TRAIN_CASES)
def test_tp_training_matches_single_process(pool, impl, world, degree, dp_shard):
    steps = 3
    results = pool(world).run(train_worker, impl, degree, dp_shard, steps)
    model, losses = single_process(world // degree, steps)
    for rank, res in enumerate(results):
        assert res["dp"] == (rank // degree, world // degree)
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-5
        )
        for name, p in model.named_parameters():
            torch.testing.assert_close(
                res["params"][name], p.detach(), rtol=1e-4, atol=1e-5, msg=name
            )


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("impl", ["reference", "native"])
@pytest.mark.parametrize("world,degree", [(2, 2), (4, 2)])
def test_tp_gradient_clipping_matches_single_process(pool, impl, world, degree):
    # max norm 0.05: below the gradients' norm, so every step is really clipped
    results = pool(world).run(train_worker, impl, degree, False, 3, clip=0.05)
    model, losses = single_process(world // degree, 3, clip=0.05)
    for res in results:
        torch.testing.assert_close(
            torch.tensor(res["losses"]), torch.tensor(losses), rtol=1e-5, atol=1e-5
        )
        for name, p in model.named_parameters():
            torch.testing.assert_close(
                res["params"][name], p.detach(), rtol=1e-4, atol=1e-5, msg=name
            )


def bad_degree_worker(degree: int) -> str:
    try:
        STRATEGIES["tp"].apply(
            "reference", tiny_transformer(), group=None, device=CPU, tp_degree=degree
        )
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.ranks
@pytest.mark.timeout(120)
def test_bad_degrees_are_refused_before_any_group(pool):
    # 3 does not divide 4 ranks; on 4 ranks a model with 2 heads cannot split them 4 ways
    assert "does not divide the world size 4" in pool(4).run(bad_degree_worker, 3)[0]


@pytest.mark.unit
def test_plans_and_analytical_communication():
    model = Transformer()  # dim 256, 4 blocks, 4 heads
    plan = tp.tp_plan(model)
    assert sum(p.style == tp.ROWWISE for p in plan.values()) == 8
    # Megatron: per block two all-reduces forward (proj, fc2) and two backward (shared f on
    # ln1, f of fc1), each of b*s*h elements
    b_s = 8 * 64
    assert tp.comm_elements(model, plan, b_s, 2) == {
        "all_reduce": 4 * 4 * b_s * 256,
        "all_gather": 0.0,
    }
    naive = tp.naive_plan(model, 2)
    el = tp.comm_elements(model, naive, b_s, 2)
    assert el["all_reduce"] + el["all_gather"] > 4 * 4 * b_s * 256
    mlp = MLP((784, 2048, 2048, 2048, 10))
    # the first layer's input is the data: its f moves nothing backward
    assert tp.comm_elements(mlp, tp.tp_plan(mlp), 64, 2)["all_reduce"] == 64 * (2048 + 10 + 2048)
    # the 10-way classifier stays replicated in the naive plan at degree 4
    assert "net.6" not in tp.naive_plan(mlp, 4) and "net.6" in tp.naive_plan(mlp, 2)
    with pytest.raises(ValueError, match="does not divide the 4 heads"):
        tp.check_degree(Transformer(heads=4, dim=96), tp.tp_plan(Transformer(heads=4, dim=96)), 3)


def harness_points(points, root):
    from tests.test_harness import FAST, run_points

    return run_points(points, root, FAST)


def tp_point(model: str, impl: str, value, **knobs):
    from tests.test_harness import make_point

    return make_point("mesh", model, value, impl, "tp", world_size=4, knobs=knobs)


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_harness_counts_tp_communication_as_predicted(pool, tmp_path):
    """Bytes per step read from the traces equal the analytical figure: Megatron pairs, the
    naive layer (more bytes), DDP or FSDP over the data-parallel dimension; a degree that does
    not divide the world size is an error row."""
    points = [
        tp_point("mlp", impl, f"{'fsdp' if shard else 'ddp'}_tp2", tp_degree=2, dp_shard=shard)
        for shard in (False, True)
        for impl in ("reference", "naive", "native")
    ] + [tp_point("mlp", "reference", "tp3", tp_degree=3)]
    rows = pool(4).run(harness_points, points, str(tmp_path), timeout=280)[0]
    by = {(r["value"], r["impl"]): r for r in rows}
    for (value, impl), r in by.items():
        if value == "tp3":
            assert r["status"] == "error"
            assert "TP degree 3 does not divide the world size 4" in r["error"]
            continue
        assert r["status"] == "ok", r["error"]
        measured, expected = r["comm_bytes_per_step"], r["comm_bytes_expected"]
        if value == "fsdp_tp2" and impl != "native":
            # The reference re-gathers a unit in backward only when autograd asks for its
            # weights: the first layer's input is the data, so its weights are not needed and
            # one all-gather of its shard (784 x 128 + 128 parameters over 2 replicas) is saved.
            expected -= 4 * (784 * 128 + 128) / 2
        assert measured == pytest.approx(expected, rel=1e-6), (value, impl)
        assert r["state_mb"] == pytest.approx(r["state_mb_expected"], rel=1e-6)
    assert (
        by[("ddp_tp2", "naive")]["comm_bytes_per_step"]
        > by[("ddp_tp2", "reference")]["comm_bytes_per_step"]
    )


@pytest.mark.ranks
@pytest.mark.timeout(300)
def test_tp_degree_sweep_fits_the_world_size_and_counts_its_bytes(pool, tmp_path):
    """``--sweep tp_degree``'s default degrees 1, 2, 4 at 2 ranks: 1 and 2 resolve, and run;
    bytes from the traces are the analytical ones (data-parallel gradients at degree 1,
    Megatron's all-reduces at 2)."""
    from bench.runner.configure.config import RunConfig
    from bench.runner.configure.resolve import build_points

    points = build_points(RunConfig(sweep="tp_degree", model="mlp", impl="reference,native"), 2)
    assert sorted({p.value for p in points}) == [1, 2]
    rows = pool(2).run(harness_points, points, str(tmp_path), timeout=280)[0]
    assert [r["status"] for r in rows] == ["ok"] * 4, [r["error"] for r in rows]
    for r in rows:
        assert r["comm_bytes_per_step"] == r["comm_bytes_expected"], r["point"]
        if r["value"] == 2:
            assert r["comm_calls_per_step"] == 1  # one row all-reduce
