"""GPT-2 (Radford et al. 2019) from Hugging Face's ``GPT2Config``: a pre-norm decoder with
learned positions, GELU MLPs and the LM head tied to the token embedding.

No tensor-parallel plan: its attention computes q, k and v in one fused ``Conv1D`` (``c_attn``)
whose output is split in three, so a column split of it would not split the heads."""

from __future__ import annotations

from parallel_kernels.workload import Workload
from parallel_kernels.zoo import ZOO, sized
from parallel_kernels.zoo.hf import HFClasses, causal_lm_batch, config, hf_workload

NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
CLASSES = HFClasses(
    model="GPT2LMHeadModel",
    family="gpt2",
    layer="GPT2Block",
    batch=causal_lm_batch,
    loss_type="ForCausalLM",
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
