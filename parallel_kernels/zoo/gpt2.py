"""GPT-2 (Radford et al. 2019) from Hugging Face's ``GPT2Config``: a pre-norm decoder with
learned positions, GELU MLPs and the LM head tied to the token embedding.

No tensor-parallel plan: its attention computes q, k and v in one fused ``Conv1D`` (``c_attn``)
whose output is split in three, so a column split of it would not split the heads."""

from __future__ import annotations

import operator

import torch
from torch import nn

from parallel_kernels.workload import PipelineCut, Workload, in_order
from parallel_kernels.zoo import ZOO, sized
from parallel_kernels.zoo.hf import (
    DecoderInputs,
    HFClasses,
    causal_lm_batch,
    causal_lm_loss,
    causal_lm_stage_batch,
    config,
    hf_workload,
)


class TokensAndPositions(nn.Module):
    """GPT-2's embedding as one module (token ids -> the hidden state), as ``GPT2Model``'s
    forward makes it: token plus learned position embeddings, then its dropout (0 here)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        body = model.transformer
        self.wte, self.wpe, self.drop = body.wte, body.wpe, body.drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.drop(self.wte(ids) + self.wpe(positions))


NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
# A pipeline's stages: the embeddings first, the blocks (each stage makes the causal mask from
# its hidden state), the final norm and the LM head last; the head's weight is the token
# embedding's, which the first and the last stage then share (pipeline_stages.StageSplit.shared).
PIPELINE = PipelineCut(
    blocks=operator.attrgetter("transformer.h"),
    embed=TokensAndPositions,
    head=in_order("transformer.ln_f", "lm_head"),
    block_inputs=DecoderInputs,
    split_batch=causal_lm_stage_batch,
    loss=causal_lm_loss,
)
CLASSES = HFClasses(
    model="GPT2LMHeadModel",
    family="gpt2",
    layer="GPT2Block",
    batch=causal_lm_batch,
    loss_type="ForCausalLM",
    pipeline=PIPELINE,
)


def _gpt2(size: str, description: str, seq: int, **fields) -> Workload:
    cfg = config("GPT2Config", n_positions=seq, **NO_DROPOUT, **fields)
    return hf_workload(f"gpt2:{size}", description, CLASSES, cfg, seq)


def tiny() -> Workload:
    # GPT-2's end-of-text token is the last of its vocabulary: so here too
    return _gpt2(
        "tiny",
        "GPT-2 at test size: 2 blocks, dim 128, 4 heads, vocab 1024, seq 32",
        seq=32,
        vocab_size=1024,
        n_embd=128,
        n_layer=2,
        n_head=4,
        bos_token_id=1023,
        eos_token_id=1023,
    )


def small() -> Workload:
    # The smallest GPT-2 of the paper's Table 2 (listed there as 117M; 124,439,808 parameters
    # counted, the LM head tied to the token embedding): Hugging Face's GPT2Config defaults
    # (vocab 50257, 12 layers, dim 768, 12 heads) at the paper's full context of 1024 tokens.
    return _gpt2(
        "small", "GPT-2 124M: 12 blocks, dim 768, 12 heads, vocab 50257, seq 1024", seq=1024
    )


ZOO["gpt2"] = sized("gpt2", {"tiny": tiny, "small": small})
