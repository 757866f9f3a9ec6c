"""BERT (Devlin et al. 2019) from Hugging Face's ``BertConfig``: a post-norm encoder with
learned positions, trained here as a two-class sequence classifier
(``BertForSequenceClassification``).

A classifier rather than the masked-LM objective: one label per sample makes the mean loss over
ranks the loss of the whole batch (a masked LM's varies with how many tokens each rank masks),
so data parallelism trains exactly as one process does, and the synthetic batch is only tokens.

Tensor parallelism after Megatron: query, key, value and the intermediate (first MLP) layer
column-wise, the attention's output and the MLP's output layer row-wise. ``BertSelfAttention``
reads the number of heads from the tensors (``view(..., -1, head_size)``), so a rank's slice of
query, key and value is whole heads, which the TP degree must divide."""

from __future__ import annotations

from parallel_kernels.workload import COLWISE, ROWWISE, Workload
from parallel_kernels.zoo import ZOO, sized
from parallel_kernels.zoo.hf import HFClasses, classification_batch, config, hf_workload

_LAYER = "bert.encoder.layer.*."
TP_PLAN = {
    **{_LAYER + f"attention.self.{p}": COLWISE for p in ("query", "key", "value")},
    _LAYER + "attention.output.dense": ROWWISE,
    _LAYER + "intermediate.dense": COLWISE,
    _LAYER + "output.dense": ROWWISE,  # also matches attention.output.dense: row-wise too
}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
CLASSES = HFClasses(
    model="BertForSequenceClassification",
    family="bert",
    layer="BertLayer",
    batch=classification_batch,
)


def _bert(size: str, description: str, seq: int, **fields) -> Workload:
    # the problem type named, or the model would set it in the config at its first forward
    cfg = config(
        "BertConfig",
        num_labels=2,
        problem_type="single_label_classification",
        **NO_DROPOUT,
        **fields,
    )
    return hf_workload(f"bert:{size}", description, CLASSES, cfg, seq, tp_plan=TP_PLAN)


def tiny() -> Workload:
    return _bert(
        "tiny",
        "BERT at test size: 2 layers, dim 128, 4 heads, MLP 512, vocab 1024, seq 32",
        seq=32,
        vocab_size=1024,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=64,
    )


def base() -> Workload:
    # BERT-base of the paper (section 3: 12 layers, dim 768, 12 heads, 110M): Hugging Face's
    # BertConfig defaults (vocab 30522, MLP 3072), 109,483,778 parameters with the two-class
    # head; sequence 128, the length of the paper's pre-training for 90 % of its steps
    # (appendix A.2) and of common fine-tuning.
    return _bert(
        "base", "BERT-base: 12 layers, dim 768, 12 heads, MLP 3072, vocab 30522, seq 128", seq=128
    )


ZOO["bert"] = sized("bert", {"tiny": tiny, "base": base})
