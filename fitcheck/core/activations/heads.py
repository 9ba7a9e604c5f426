"""Logits and loss tensors of sequence / token classification heads (no vocabulary-sized tensor).

transformers 5.23:

* decoders, seq-cls (``modeling_layers.py GenericForSequenceClassification.forward``): ``logits = score(h)`` on
  every token ``[b, s, n]``; the last non-pad token is found with int32 ``[b, s]`` masks and pooled
  ``[b, n]``; ``loss_utils.ForSequenceClassificationLoss`` -> ``fixed_cross_entropy`` on the pooled logits in the
  model dtype (no fp32 upcast).
* decoders, token-cls (``GenericForTokenClassification.forward``): dropout then ``score`` on every token; the
  loss (``loss_utils.ForTokenClassification``) upcasts the ``[b·s, n]`` logits to fp32.
* BERT-like encoders: seq-cls pools the first token (``BertPooler``: dense + tanh), dropout, ``classifier``;
  token-cls: dropout on every token then ``classifier``.

Every term is ``O(b·s·n)`` or ``O(b·h)`` except the classifier's saved input (``b·s·h`` when the head reads
every token and is trained: always, in full fine-tuning, or as a ``modules_to_save`` copy under LoRA), so
against the causal head a seq-cls step loses ``~12·b·s·V`` bytes at the start of backward.
"""

from __future__ import annotations

import dataclasses

from fitcheck.spec import TrainingSpec

CLASSIFIER_TASKS = frozenset({"seq-cls", "token-cls"})
# The family a classifier's layer formulas name when it runs another family's layer (``traits.classifier_layer``:
# RoBERTa-likes run BERT's, fitcheck/families/bert.py)
_CLASSIFIER_LAYER_FAMILY = "bert"


def bert_layer_alias(spec: TrainingSpec) -> TrainingSpec:
    """The spec with a RoBERTa-like classifier read as BERT (its ``classifier_layer`` traits) for the formulas."""
    sh = spec.model.shape
    alias = sh.traits.classifier_layer
    if alias is None or sh.task not in CLASSIFIER_TASKS:
        return spec
    shape = dataclasses.replace(sh, family=_CLASSIFIER_LAYER_FAMILY, traits=alias)
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, shape=shape))


def classifier_logits(spec: TrainingSpec, e: int, full: bool) -> tuple[int, int]:
    """(end-of-forward, start-of-backward) bytes of the classifier head's logits, loss and labels.

    Args:
        spec: A spec whose ``model.shape.task`` is seq-cls or token-cls.
        e: Bytes per element of the head's output (the model dtype, 2 under autocast).
        full: Full fine-tune (the head input is then already counted as the final norm's saved output).

    Returns:
        Bytes alive at the loss and when the backward starts.
    """
    sh = spec.model.shape
    b, s, h, n = spec.batch.micro_batch, spec.batch.seq_len, sh.hidden_size, max(sh.num_labels, 1)
    token = sh.task == "token-cls"
    encoder = sh.traits.encoder
    fwd = bwd = 0
    if not full:
        # the trained head (modules_to_save copy) saves its input: the final hidden states, every token
        fwd += e * b * s * h if (token or not encoder) else e * b * h
    norm = 0
    if sh.norm == "rmsnorm":
        # With no vocabulary-sized logits the forward peaks earlier, inside the final RMSNorm (modeling_llama.py
        # LlamaRMSNorm.forward): the fp32 upcast of its input and the fp32 normalised product are both alive
        # (the upcast is a no-op in an fp32 model). Trace "llama-512 seq-cls full" (benchmarks/task_heads.py):
        # 8·h bytes per token at the end of forward besides the saved activations.
        norm = (8 if e == 2 else 4) * b * s * h
    if token:
        labels = 8 * b * s
        logits = e * b * s * n
        upcast = 4 * b * s * n  # ForTokenClassification: logits.float(); log_softmax fp32
        head = logits + 2 * upcast + labels
        bwd += 2 * upcast + labels
        if sh.traits.classifier_dropout > 0:  # GenericForTokenClassification: 0.1 when the config names none
            head += e * b * s * h  # dropout output (+ mask), kept as the head's input
            bwd += e * b * s * h
        return fwd + max(head, norm), bwd
    labels = 8 * b
    if encoder:
        fwd += 4 * e * b * h + 2 * e * b * n + labels
        bwd += 3 * e * b * h + 2 * e * b * n + labels
        return fwd, bwd
    # decoder: logits on every token, int32 non-pad mask and token indices, pooled logits + log-softmax
    head = e * b * s * n + 8 * b * s + 4 * s + 2 * e * b * n + 16 * b + labels
    bwd += 2 * e * b * n + 16 * b + labels
    return fwd + max(head, norm), bwd


def classifier_head_backward(spec: TrainingSpec, e: int) -> int:
    """Bytes of the head's output gradient when its backward runs (``[b, s, n]`` for both tasks)."""
    sh = spec.model.shape
    return e * spec.batch.micro_batch * spec.batch.seq_len * max(sh.num_labels, 1)
