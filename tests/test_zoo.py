"""The model zoo: GPT-2, Llama, BERT (Hugging Face configs) and ResNet (the paper's definition)
at their tiny sizes build, make deterministic batches and train; their real sizes have the
published parameter counts; and on the tiny sizes every strategy and implementation trains
exactly as one process does."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bench.runner.train.data import Batches
from parallel_kernels.fsdp_layout import fsdp_units
from parallel_kernels.models import build_model, param_count, workload
from parallel_kernels.strategies import STRATEGIES
from parallel_kernels.workload import COLWISE, ROWWISE, expand_plan, modules_of_types
from parallel_kernels.zoo import ZOO
from parallel_kernels.zoo.resnet import ResNet

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
# The test extra installs transformers: under CI="true" a skip for its absence is a failure.
NEEDS_HF = [
    pytest.mark.ci_needs("transformers"),
    pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers (pip install '.[models]')"),
]


def needs_hf(test):
    for mark in NEEDS_HF:
        test = mark(test)
    return test


def zoo(*names: str) -> list:
    """Zoo model names as test parameters, the Hugging Face ones marked as needing it."""
    return [pytest.param(n, marks=[] if n.startswith("resnet") else NEEDS_HF, id=n) for n in names]


TINY = ("gpt2:tiny", "llama:tiny", "bert:tiny", "resnet:tiny")


def apply_loss(wl, model, batch) -> torch.Tensor:
    x, y = batch
    return wl.compute_loss(wl.forward(model, x), y)


def same(a, b) -> bool:
    """Equal tensors, or dicts/tuples of them (None equals None)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a is b is None or (torch.is_tensor(a) and torch.equal(a, b))


@pytest.mark.unit
@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", zoo(*TINY))
def test_tiny_builds_makes_deterministic_batches_and_learns(name):
    wl = workload(name)
    assert wl.name == name
    model = build_model(name, seed=0)
    assert 100_000 < param_count(model) < 2_000_000  # seconds on a CPU, yet every layer kind
    again = build_model(name, seed=0)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )
    assert not torch.equal(next(build_model(name, seed=1).parameters()), next(model.parameters()))
    assert same(wl.batch(8, 3), wl.batch(8, 3))
    assert not same(wl.batch(8, 3)[0], wl.batch(8, 4)[0])
    assert len(wl.dataset(8, 3)) == 8
    assert len(modules_of_types(model, wl.fsdp_units)) > 1  # several units to shard

    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = wl.batch(8, 0)
    losses = []
    for _ in range(5):
        opt.zero_grad(set_to_none=True)
        loss = apply_loss(wl, model, batch)
        assert torch.isfinite(loss) and loss.ndim == 0
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.95 * losses[0], losses


@pytest.mark.unit
def test_resnet50_is_the_papers_network():
    with torch.device("meta"):
        model = ResNet()
        assert param_count(model) == 25_557_032  # torchvision's resnet50 and the paper's
        assert model(torch.empty(2, 3, 224, 224)).shape == (2, 1000)
        assert param_count(workload("resnet:50").build()) == 25_557_032
    assert [len(stage) for stage in model.stages] == [3, 4, 6, 3]
    # the stride of a stage's first block on its 3 x 3 convolution (v1.5), not on the 1 x 1
    first = model.stages[1][0].residual
    assert first[0].stride == (1, 1) and first[3].stride == (2, 2)
    assert isinstance(model.stages[1][1].shortcut, nn.Identity)  # identity where shapes match


@pytest.mark.unit
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "name,params",
    [
        pytest.param("gpt2:small", 124_439_808, marks=NEEDS_HF),  # the 124M, head tied
        pytest.param("llama:1b", 1_038_682_112, marks=NEEDS_HF),  # Llama 3.2 1B, vocab 32000
        pytest.param("llama:70b", 68_976_648_192, marks=NEEDS_HF),  # Llama 2 70B, for planning
        pytest.param("bert:base", 109_483_778, marks=NEEDS_HF),  # BERT-base, 2-class head
    ],
)
def test_real_sizes_have_their_published_shapes(name, params):
    with torch.device("meta"):
        model = workload(name).build()
    assert param_count(model) == params


@pytest.mark.unit
@needs_hf
def test_llama_1b_has_llama_3_2_1bs_norm_epsilon():
    with torch.device("meta"):
        model = workload("llama:1b").build()
    # meta-llama/Llama-3.2-1B's config.json: 1e-5 (LlamaConfig's default is 1e-6)
    assert model.config.rms_norm_eps == 1e-5
    assert model.model.norm.variance_epsilon == 1e-5


@pytest.mark.unit
def test_resnet_tiny_trains_on_one_sample_per_replica():
    """Batch normalisation needs more than one value per channel: at 64 x 64 the last stage is
    2 x 2, so a replica's single image still has four (at 32 x 32 it had one, and raised)."""
    wl = workload("resnet:tiny")
    model = build_model("resnet:tiny", seed=0).train()
    x, y = wl.batch(1, 0)
    assert x.shape == (1, 3, 64, 64)
    loss = apply_loss(wl, model, (x, y))
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.unit
@pytest.mark.parametrize(
    "name,known",
    [
        pytest.param("gpt2:huge", "tiny, small", marks=NEEDS_HF),
        pytest.param("llama:7b", "tiny, 1b", marks=NEEDS_HF),
        pytest.param("bert:large", "tiny, base", marks=NEEDS_HF),
        ("resnet:101", "tiny, 50"),
    ],
)
def test_unknown_size_names_the_known_ones(name, known):
    with pytest.raises(ValueError, match=f"unknown size '{name.split(':')[1]}'.*known: {known}"):
        workload(name)


@pytest.mark.unit
def test_without_transformers_a_zoo_language_model_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # what a missing package raises
    with pytest.raises(ValueError, match=r"need transformers>=5.*pip install '\.\[models\]'"):
        ZOO["llama"]("tiny")
    assert ZOO["resnet"]("tiny").name == "resnet:tiny"  # the CNN needs none


@pytest.mark.e2e
def test_importing_the_suite_imports_no_transformers():
    code = (
        "import sys, parallel_kernels.models, parallel_kernels.zoo; "
        "print('transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "False", out


# per layer: attention q, k, v column-wise, its output row-wise; the MLP's first layer(s)
# column-wise (Llama's gate and up, BERT's intermediate), its last row-wise
@pytest.mark.unit
@pytest.mark.parametrize(
    "name,columns",
    [pytest.param("llama:tiny", 5, marks=NEEDS_HF), pytest.param("bert:tiny", 4, marks=NEEDS_HF)],
)
def test_tp_plans_name_real_modules_in_megatron_pairs(name, columns):
    model = build_model(name)
    plan = expand_plan(model, workload(name).tp_plan)
    layers = len(fsdp_units(model))
    assert sum(p == COLWISE for p in plan.values()) == columns * layers, plan
    assert sum(p == ROWWISE for p in plan.values()) == 2 * layers, plan
    modules = dict(model.named_modules())
    assert all(isinstance(modules[n], nn.Linear) for n in plan)


@pytest.mark.unit
@pytest.mark.parametrize("name", zoo("gpt2:tiny", "resnet:tiny"))
def test_models_without_a_split_give_no_tp_plan(name):
    assert workload(name).tp_plan is None  # a TP point is then an error row naming tp_plan


@pytest.mark.unit
@needs_hf
def test_llama_tiny_is_a_workload_of_the_suite():
    wl = workload("llama:tiny")
    model = build_model("llama:tiny")
    assert model.bench_workload is wl  # FSDP, checkpointing and TP find its facts
    assert [type(u).__name__ for u in fsdp_units(model)] == ["LlamaDecoderLayer"] * 2
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.out_features == 2 * attn.k_proj.out_features  # grouped-query attention
    assert type(model.model.norm).__name__ == "LlamaRMSNorm"
    assert wl.tokens_per_sample == 32 and wl.loss is None  # the model returns its loss


# -- multi-rank: every strategy and implementation against single-process training ----------

BATCH, STEPS = 4, 3


def merge(parts: list):
    """Per-rank batches (tensors, or dicts of them) concatenated along the batch."""
    if isinstance(parts[0], dict):
        return {k: merge([p[k] for p in parts]) for k in parts[0]}
    return torch.cat(parts)


def rank_batches(name: str, world: int, rank: int) -> list:
    data = workload(name).dataset(BATCH * world * STEPS, 0)
    it = Batches(data, batch_size=BATCH, rank=rank, world_size=world, device=CPU)
    return [next(it) for _ in range(STEPS)]


def sgd_steps(name: str, model: nn.Module, batches: list) -> torch.Tensor:
    """SGD rather than the harness's AdamW, as in test_ddp: Adam divides by each gradient's
    magnitude and so blows last-bit summation differences up into parameter differences."""
    wl = workload(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss = apply_loss(wl, model, batch)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def single_process(name: str, replicas: int) -> tuple[nn.Module, list[float]]:
    """The same steps on one process over every replica's batch. A model with batch
    normalisation normalises each replica's batch by its own statistics (as every data-parallel
    strategy here does): its replicas' batches go through one at a time and their losses are
    averaged; any other model takes the concatenated batch."""
    per_rank = [rank_batches(name, replicas, r) for r in range(replicas)]
    model = build_model(name, seed=0)
    wl = workload(name)
    per_replica = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        if per_replica:
            loss = sum(apply_loss(wl, model, per_rank[r][s]) for r in range(replicas)) / replicas
        else:
            x, y = (merge([per_rank[r][s][k] for r in range(replicas)]) for k in range(2))
            loss = apply_loss(wl, model, (x, y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def mean_over_ranks(losses: torch.Tensor) -> list[float]:
    dist.all_reduce(losses)
    return (losses / dist.get_world_size()).tolist()


def param_names(name: str) -> list[str]:
    """The plain model's parameter names, a tied parameter under each of its names."""
    return [n for n, _ in build_model(name).named_parameters(remove_duplicate=False)]


def data_parallel_worker(name: str) -> dict:
    """Every DDP and FSDP implementation on this rank: losses (mean over ranks) and the full
    parameters after training, by name."""
    world, rank = dist.get_world_size(), dist.get_rank()
    batches = rank_batches(name, world, rank)
    out = {}
    for impl in STRATEGIES["ddp"].default_impls:
        # a different start on every rank: DDP's start-up broadcast must make them equal
        model = STRATEGIES["ddp"].apply(
            impl, build_model(name, seed=rank), group=None, device=CPU, bucket_cap_mb=0.25
        )
        losses = mean_over_ranks(sgd_steps(name, model, batches))
        names = [n for n, _ in build_model(name).named_parameters()]
        params = dict(zip(names, [p.detach() for p in model.parameters()], strict=True))
        out[("ddp", impl)] = {"losses": losses, "params": params}
    for impl in STRATEGIES["fsdp"].default_impls:
        model = STRATEGIES["fsdp"].apply(
            impl, build_model(name, seed=0), group=None, device=CPU, sharding_strategy="FULL_SHARD"
        )
        losses = mean_over_ranks(sgd_steps(name, model, batches))
        full = STRATEGIES["fsdp"].replicated(model)  # a collective: on every rank
        if hasattr(model, "full_state_dict"):  # the reference: one flat vector per unit
            state = model.full_state_dict(rank0_only=False)
            params = {n: state[n] for n in param_names(name)}
        else:
            names = [n.replace("_fsdp_wrapped_module.", "") for n, _ in model.named_parameters()]
            params = dict(zip(names, full, strict=True))
        out[("fsdp", impl)] = {"losses": losses, "params": params}
    return out


def assert_trains_as_one_process(got: dict, model: nn.Module, losses: list[float], what: str):
    torch.testing.assert_close(
        torch.tensor(got["losses"]),
        torch.tensor(losses),
        rtol=1e-5,
        atol=1e-5,
        msg=lambda m: f"{what} losses: {m}",
    )
    want = dict(model.named_parameters(remove_duplicate=False))  # a tied one under each name
    unique = {n for n, _ in model.named_parameters()}
    assert unique <= got["params"].keys() <= want.keys(), what
    for k, g in got["params"].items():
        torch.testing.assert_close(
            g, want[k].detach(), rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f"{what} {k}: {m}"
        )


_RESULTS: dict = {}


def data_parallel_results(pool, name: str) -> tuple[list[dict], nn.Module, list[float]]:
    """Every DDP and FSDP implementation trained on 2 ranks in one pool call, and the same
    steps on one process; run once per model, checked case by case."""
    if name not in _RESULTS:
        results = pool(2).run(data_parallel_worker, name, timeout=280)
        _RESULTS[name] = (results, *single_process(name, 2))
    return _RESULTS[name]


def data_parallel_cases() -> list:
    cases = []
    for name in TINY:
        for strategy in ("ddp", "fsdp"):
            for impl in STRATEGIES[strategy].default_impls:
                # gpt2 and llama tie the head to the embedding: one parameter, two names
                marks = [] if name.startswith("resnet") else list(NEEDS_HF)
                cases.append(
                    pytest.param(name, strategy, impl, marks=marks, id=f"{name}-{strategy}-{impl}")
                )
    return cases


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name,strategy,impl", data_parallel_cases())
def test_ddp_and_fsdp_train_as_one_process(pool, name, strategy, impl):
    results, model, losses = data_parallel_results(pool, name)
    for rank, res in enumerate(results):
        assert_trains_as_one_process(
            res[(strategy, impl)], model, losses, f"{strategy} {impl} rank {rank}"
        )


def tp_worker(name: str, degree: int) -> dict:
    out = {}
    for impl in ("native", "reference"):
        model = STRATEGIES["tp"].apply(
            impl,
            build_model(name, seed=0),
            group=None,
            device=CPU,
            tp_degree=degree,
            dp_shard=False,
        )
        batches = rank_batches(name, model.dp_size, model.dp_rank)
        losses = mean_over_ranks(sgd_steps(name, model, batches))
        out[impl] = {"losses": losses, "params": model.full_state(), "dp": model.dp_size}
    return out


@pytest.mark.ranks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", zoo("llama:tiny", "bert:tiny"))
@pytest.mark.parametrize("world,degree", [(2, 2), (4, 4), (4, 2)])
def test_tensor_parallel_trains_as_one_process(pool, name, world, degree):
    results = pool(world).run(tp_worker, name, degree, timeout=280)
    model, losses = single_process(name, world // degree)
    for rank, res in enumerate(results):
        for impl, got in res.items():
            assert got["dp"] == world // degree
            assert_trains_as_one_process(got, model, losses, f"tp {impl} rank {rank}")


def zoo_harness_rows(root: str) -> list[dict]:
    from tests.test_harness import make_point, run_points

    points = [
        make_point(
            "sharding_strategy",
            "llama:tiny",
            "FULL_SHARD",
            "native",
            "fsdp",
            knobs={"sharding_strategy": "FULL_SHARD", "activation_checkpointing": "on"},
            batch_size=8,
        ),
        make_point(
            "mesh", "bert:tiny", "tp2", "reference", "tp", knobs={"tp_degree": 2}, batch_size=8
        ),
        make_point(
            "bucket_cap_mb",
            "resnet:tiny",
            1.0,
            "reference",
            "ddp",
            knobs={"bucket_cap_mb": 1.0},
            batch_size=8,
        ),
        make_point(
            "mesh", "gpt2:tiny", "tp2", "native", "tp", knobs={"tp_degree": 2}, batch_size=8
        ),
    ]
    return run_points(points, root)


@pytest.mark.ranks
@needs_hf
@pytest.mark.timeout(300)
def test_zoo_models_run_through_the_harness(pool, tmp_path):
    """Sweep points of zoo models: FSDP with activation checkpointing per decoder layer, TP,
    DDP of a CNN; each moves the bytes the strategy's arithmetic predicts and holds the state
    it predicts. GPT-2 has no TP plan: its TP point is an error row naming the missing fact."""
    *rows, gpt2_tp = pool(2).run(zoo_harness_rows, str(tmp_path), timeout=280)[0]
    for r in rows:
        assert r["status"] == "ok", (r["model"], r["error"])
        assert r["params"] == param_count(build_model(r["model"]))
        assert r["comm_bytes_per_step"] == pytest.approx(r["comm_bytes_expected"], rel=1e-3), r
        assert r["state_mb"] == pytest.approx(r["state_mb_expected"], rel=1e-3), r
        assert r["flops_per_step"] > 0 and torch.isfinite(torch.tensor(r["loss"]))
    assert gpt2_tp["status"] == "error" and "tp_plan" in gpt2_tp["error"], gpt2_tp
