"""Pipeline stages cut from a plain model by its workload's ``PipelineCut``, in one process:
run in sequence, one tensor handed from stage to stage (detached, as between ranks), they give
the plain model's loss and every parameter its gradient, exactly; every parameter sits on one
stage, but a tied embedding and head, which the split names; a model that does not say where
its blocks are, and more stages than blocks, are one clear error each."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

from parallel_kernels.models import MODELS, Transformer, build_model, workload
from parallel_kernels.pipeline_stages import block_ranges, split_stages
from parallel_kernels.workload import in_order, stamp

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
CUSTOM = f"{REPO}/examples/custom_model.py:workload"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
NEEDS_HF = [
    pytest.mark.ci_needs("transformers"),
    pytest.mark.skipif(not HAS_TRANSFORMERS, reason="no transformers (pip install '.[models]')"),
]
TIED = {"llama:tiny": "model.embed_tokens.weight", "gpt2:tiny": "transformer.wte.weight"}
CASES = [
    pytest.param("transformer", 2, (2, 2), id="transformer-2"),
    pytest.param("transformer", 3, (2, 1, 1), id="transformer-3-uneven"),
    pytest.param(CUSTOM, 3, (2, 1, 1), id="custom-3-uneven"),
    pytest.param("llama:tiny", 2, (1, 1), marks=NEEDS_HF, id="llama-2"),
    pytest.param("gpt2:tiny", 2, (1, 1), marks=NEEDS_HF, id="gpt2-2"),
    pytest.param("gpt2:tiny", 1, (2,), marks=NEEDS_HF, id="gpt2-1"),
]


def plain_loss(name: str, batch) -> tuple[torch.nn.Module, torch.Tensor]:
    """The plain model's loss on the batch, backward done."""
    wl, model = workload(name), build_model(name, seed=0)
    loss = wl.compute_loss(wl.forward(model, batch[0]), batch[1])
    loss.backward()
    return model, loss


def staged_loss(split, batch) -> torch.Tensor:
    """The stages run in sequence, each stage's output detached into the next as a rank would
    receive it; backward from the last stage's loss, each input gradient handed back."""
    x, targets = split.stage_batch(*batch)
    received, sent = [], []
    for stage in split.stages:
        received.append(x)
        y = stage(x)
        assert torch.is_tensor(y)
        sent.append(y)
        x = y.detach().requires_grad_()
    loss = split.loss(sent[-1], targets)
    loss.backward()
    for i in reversed(range(len(sent) - 1)):
        sent[i].backward(received[i + 1].grad)
    return loss


@pytest.mark.parametrize(("name", "stages", "per_stage"), CASES)
def test_stages_give_the_plain_models_loss_and_gradients(name, stages, per_stage):
    batch = workload(name).batch(4, 1)
    plain, expected = plain_loss(name, batch)
    model = build_model(name, seed=0)
    split = split_stages(model, stages)
    assert split.blocks_per_stage == per_stage
    assert split.uneven == (len(set(per_stage)) > 1)
    assert torch.equal(staged_loss(split, batch), expected)
    grads = {n: p.grad for n, p in plain.named_parameters()}
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, grads[n]), n


@pytest.mark.parametrize(("name", "stages", "per_stage"), CASES)
def test_every_parameter_sits_on_one_stage_but_a_tied_one_which_is_named(name, stages, per_stage):
    model = build_model(name, seed=0)
    split = split_stages(model, stages)
    held: dict[str, list[int]] = {}
    for s, (stage, names) in enumerate(zip(split.stages, split.param_names, strict=True)):
        assert names.keys() == dict(stage.named_parameters()).keys()
        for local, plain in names.items():
            assert stage.get_parameter(local) is model.get_parameter(plain)  # shared, not copied
            held.setdefault(plain, []).append(s)
    assert held.keys() == dict(model.named_parameters()).keys()
    shared = {p.name: p.stages for p in split.shared}
    assert shared == {n: tuple(s) for n, s in held.items() if len(s) > 1}
    tied = TIED.get(name)
    assert shared == ({tied: (0, stages - 1)} if tied and stages > 1 else {})


def test_blocks_split_as_evenly_as_they_go_the_earlier_stages_longer():
    assert block_ranges(4, 2) == ((0, 1), (2, 3))
    assert block_ranges(5, 3) == ((0, 1), (2, 3), (4,))
    assert block_ranges(2, 2) == ((0,), (1,))


@pytest.mark.parametrize("name", ["mlp", "wide_mlp"])
def test_a_model_that_names_no_blocks_is_one_line(name):
    with pytest.raises(ValueError) as e:
        split_stages(build_model(name), 2)
    assert str(e.value) == (
        f"workload {name} does not say where its repeated blocks are (Workload.pipeline)"
    )


@pytest.mark.parametrize(
    ("name", "stages", "message"),
    [
        pytest.param(
            "llama:tiny",
            3,
            "workload llama:tiny: cannot split 2 blocks into 3 stages",
            marks=NEEDS_HF,
        ),
        ("transformer", 5, "workload transformer: cannot split 4 blocks into 5 stages"),
        ("transformer", 0, "workload transformer: a pipeline needs at least 1 stage, got 0"),
    ],
)
def test_more_stages_than_blocks_is_one_line(name, stages, message):
    with pytest.raises(ValueError, match=message) as e:
        split_stages(build_model(name), stages)
    assert "\n" not in str(e.value)


def test_a_model_built_without_its_workload_is_refused():
    with pytest.raises(ValueError, match="carries no workload"):
        split_stages(Transformer(), 2)


def test_a_cut_that_leaves_a_parameter_on_no_stage_is_refused():
    wl = MODELS["transformer"]
    cut = dataclasses.replace(wl.pipeline, head=in_order("head"))  # the final norm left out
    model = stamp(wl.build(), dataclasses.replace(wl, pipeline=cut))
    with pytest.raises(ValueError, match=r"puts parameters on no stage \(ln_f.weight, ln_f.bias\)"):
        split_stages(model, 2)
