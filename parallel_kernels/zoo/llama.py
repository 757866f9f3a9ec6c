"""Llama (Touvron et al. 2023; Llama 3, Grattafiori et al. 2024) from Hugging Face's
``LlamaConfig``: a pre-norm decoder with RMSNorm, rotary positions, SwiGLU MLPs and
grouped-query attention (fewer key/value heads than query heads).

Tensor parallelism after Megatron: q, k, v and the MLP's gate and up projections column-wise,
the attention's output and the MLP's down projection row-wise. ``LlamaAttention`` reads the
number of heads from the tensors (``view(..., -1, head_dim)``) and groups each rank's query
heads with that rank's key/value heads (query head i uses key/value head i // (heads/kv heads),
so contiguous slices of both stay matched): a rank's slice of q, k and v is whole heads, which
the TP degree must divide, key/value heads included."""

from __future__ import annotations

import functools
import operator

from parallel_kernels.workload import COLWISE, ROWWISE, PipelineCut, Workload, in_order
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

_LAYER = "model.layers.*."
TP_PLAN = {
    **{_LAYER + f"self_attn.{p}_proj": COLWISE for p in "qkv"},
    _LAYER + "self_attn.o_proj": ROWWISE,
    _LAYER + "mlp.gate_proj": COLWISE,
    _LAYER + "mlp.up_proj": COLWISE,
    _LAYER + "mlp.down_proj": ROWWISE,
}
# A pipeline's stages: the token embedding first, the decoder layers (each stage makes the
# rotary position embeddings and the causal mask from its hidden state), the final norm and
# the LM head last. The head's weight is the embedding's where tie_word_embeddings is set: the
# first and the last stage then share it (pipeline_stages.StageSplit.shared).
PIPELINE = PipelineCut(
    blocks=operator.attrgetter("model.layers"),
    embed=in_order("model.embed_tokens"),
    head=in_order("model.norm", "lm_head"),
    block_inputs=functools.partial(DecoderInputs, rotary="model.rotary_emb"),
    split_batch=causal_lm_stage_batch,
    loss=causal_lm_loss,
)
CLASSES = HFClasses(
    model="LlamaForCausalLM",
    family="llama",
    layer="LlamaDecoderLayer",
    batch=causal_lm_batch,
    pipeline=PIPELINE,
)


def _llama(size: str, description: str, seq: int, **fields) -> Workload:
    cfg = config("LlamaConfig", max_position_embeddings=seq, attention_dropout=0.0, **fields)
    return hf_workload(f"llama:{size}", description, CLASSES, cfg, seq, tp_plan=TP_PLAN)


def tiny() -> Workload:
    # 8 query heads share 4 key/value heads (grouped-query, as the 1B's 32 share 8): TP degrees
    # 2 and 4 split both into whole heads
    return _llama(
        "tiny",
        "Llama at test size: 2 layers, dim 128, 8 heads (4 key/value), MLP 512, vocab 1024, seq 32",
        seq=32,
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )


def one_b() -> Workload:
    # Llama 3.2 1B's published config (meta-llama/Llama-3.2-1B's config.json: hidden 2048, 16
    # layers, 32 heads, 8 key/value heads, MLP 8192, RMSNorm epsilon 1e-5 where LlamaConfig's
    # default is 1e-6, RoPE theta 500000, LM head tied to the embedding; its long-context RoPE
    # scaling left out, which changes no parameter or FLOP) with Llama 2's 32000-token vocabulary in
    # place of Llama 3's 128256, so that the decoder, not the embedding, is most of the model:
    # 1,038,682,112 parameters. Sequence 2048, the context Llama 1 and TinyLlama trained at.
    return _llama(
        "1b",
        "Llama 1B (Llama 3.2 1B's shape, vocab 32000): 16 layers, dim 2048, "
        "32 heads (8 key/value), MLP 8192, seq 2048",
        seq=2048,
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )


def seventy_b() -> Workload:
    # Llama 2 70B's published config (meta-llama/Llama-2-70b-hf's config.json: hidden 8192, 80
    # layers, 64 heads, 8 key/value heads, MLP 28672, vocabulary 32000, RMSNorm epsilon 1e-5,
    # context 4096, LM head untied): 68,976,648,192 parameters. For planning (the planner builds
    # it on the meta device and steps it under fake tensors): a run here would allocate them.
    return _llama(
        "70b",
        "Llama 2 70B, for planning only (python -m bench.plan): 80 layers, dim 8192, "
        "64 heads (8 key/value), MLP 28672, vocab 32000, seq 4096",
        seq=4096,
        vocab_size=32000,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )


ZOO["llama"] = sized("llama", {"tiny": tiny, "1b": one_b, "70b": seventy_b})
