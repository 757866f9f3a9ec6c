"""What the Hugging Face models of the zoo share: ``transformers``, imported only when a zoo
model is built (it is an optional extra: ``pip install '.[models]'``), and their synthetic
batches of token ids."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import nn

from parallel_kernels.float8 import quiet_torchao
from parallel_kernels.workload import PipelineCut, Workload


def transformers() -> ModuleType:
    """The ``transformers`` package, or one line saying how to install it."""
    try:
        with quiet_torchao():
            return importlib.import_module("transformers")
    except ImportError as e:
        raise ValueError(
            f"the zoo's language models need transformers>=5 ({e}): pip install '.[models]'"
        ) from None


def config(name: str, **fields) -> object:
    """The config class ``name`` with ``fields``, without the key/value cache (it serves
    generation only) and with PyTorch's fused attention (``sdpa``, on CPUs and GPUs alike).

    The zoo's configs also set every dropout to 0: each strategy must train exactly as one
    process does, and dropout would draw different masks on different ranks."""
    return getattr(transformers(), name)(use_cache=False, attn_implementation="sdpa", **fields)


def model_of(name: str, cfg: object, loss_type: str | None = None) -> torch.nn.Module:
    """The model class ``name`` built from ``cfg`` with fresh random weights (after the caller's
    ``torch.manual_seed``: the same on every rank). Hugging Face picks a model's loss by its
    class name; one whose name gives none (``GPT2LMHeadModel``) takes ``loss_type``, else it
    falls back to the same default loss with a warning on every rank."""
    model = getattr(transformers(), name)(cfg)
    if loss_type is not None:
        model.loss_type = loss_type
    return model


def builder(name: str, cfg: object, loss_type: str | None = None):
    """``Workload.build`` for the model class ``name`` (a partial: workloads stay picklable)."""
    return functools.partial(model_of, name, cfg, loss_type)


def layer_class(model: str, name: str) -> type[torch.nn.Module]:
    """A block class of a model family (``layer_class("llama", "LlamaDecoderLayer")``): the
    unit that FSDP shards and activation checkpointing recomputes."""
    transformers()
    with quiet_torchao():  # its modeling imports transformers' quantizers, and so torchao
        module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return getattr(module, name)


def _tokens(n: int, seed: int, vocab: int, seq: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, seq), generator=g)


def _causal_lm_batch(n: int, seed: int, *, vocab: int, seq: int) -> tuple[dict, None]:
    # Hugging Face causal LMs shift the labels themselves (token t predicts token t + 1), and
    # every sample counts seq - 1 tokens, so the mean loss over ranks is the whole batch's.
    ids = _tokens(n, seed, vocab, seq)
    return {"input_ids": ids, "labels": ids}, None


def causal_lm_batch(vocab: int, seq: int):
    """(batch size, seed) -> ({"input_ids", "labels"}, None): the model returns its own loss."""
    return functools.partial(_causal_lm_batch, vocab=vocab, seq=seq)


def _classification_batch(n: int, seed: int, *, vocab: int, seq: int) -> tuple[dict, None]:
    # The label is a fact of the sequence (is its first token after [CLS] in the upper half of
    # the vocabulary?), so the loss can fall by learning, not only by memorising the batch.
    ids = _tokens(n, seed, vocab, seq)
    return {"input_ids": ids, "labels": (ids[:, 1] >= vocab // 2).long()}, None


def classification_batch(vocab: int, seq: int):
    """(batch size, seed) -> ({"input_ids", "labels"}, None), two classes, one label a sample."""
    return functools.partial(_classification_batch, vocab=vocab, seq=seq)


def causal_lm_stage_batch(inputs: dict, targets: None) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal LM batch as a pipeline takes it: the token ids into the first stage, the labels
    to the last stage's loss (``PipelineCut.split_batch``)."""
    return inputs["input_ids"], inputs["labels"]


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss a Hugging Face causal LM computes on its logits (labels shifted by one token),
    by its own function: a pipeline's last stage gives the plain model's loss."""
    loss_utils = importlib.import_module("transformers.loss.loss_utils")
    return loss_utils.ForCausalLMLoss(logits, labels, vocab_size=logits.shape[-1])


class DecoderInputs(nn.Module):
    """What a Hugging Face decoder's block takes besides the hidden state, made as the model's
    forward makes them but from the hidden state alone, so that every pipeline stage makes its
    own: the positions 0..s-1, the causal mask (no padding mask: the synthetic batches have
    none), and the rotary position embeddings where the model has them (``rotary``: the path
    of its rotary module, e.g. ``"model.rotary_emb"``)."""

    def __init__(self, model: nn.Module, rotary: str | None = None) -> None:
        super().__init__()
        self.config = model.config
        self.rotary = model.get_submodule(rotary) if rotary else None

    def forward(self, hidden: torch.Tensor) -> dict:
        masking = importlib.import_module("transformers.masking_utils")
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = masking.create_causal_mask(
            config=self.config,
            inputs_embeds=hidden,
            attention_mask=None,
            cache=None,
            position_ids=positions,
        )
        extra = {"attention_mask": mask, "position_ids": positions}
        if self.rotary is not None:
            extra["position_embeddings"] = self.rotary(hidden, position_ids=positions)
        return extra


@dataclass(frozen=True)
class HFClasses:
    """What a zoo family takes from Hugging Face: its model class, the ``layer`` block class of
    ``transformers.models.<family>`` (the unit FSDP shards and checkpointing recomputes), its
    synthetic batch (``causal_lm_batch`` or ``classification_batch``), and the loss of a model
    class whose name gives none (``model_of``), and how a pipeline cuts the family's models
    (None: it cannot)."""

    model: str
    family: str
    layer: str
    batch: Callable[[int, int], Callable]
    loss_type: str | None = None
    pipeline: PipelineCut | None = None


def hf_workload(
    name: str, description: str, classes: HFClasses, cfg: object, seq: int, tp_plan=None
) -> Workload:
    """A zoo workload of ``classes``' model built from ``cfg``, at ``seq`` tokens a sample."""
    return Workload(
        name=name,
        description=description,
        build=builder(classes.model, cfg, classes.loss_type),
        batch=classes.batch(cfg.vocab_size, seq),
        tokens_per_sample=seq,
        fsdp_units=(layer_class(classes.family, classes.layer),),
        tp_plan=tp_plan,
        pipeline=classes.pipeline,
    )
