"""What the LayerNorm blocks (GPT-2, BERT, Phi, Falcon, BLOOM) keep outside their layers (pure: no torch): the
embedding side, the final LayerNorm and the LM / MLM head's input, the checkpointed last layer's output, the fp32
residual width past layer 0, the logits of the loss and the recipe-gap text.

Split out of :mod:`.layernorm_blocks` (which keeps the per-layer recipes and their context) unchanged; the same
traces and tests (``tests/test_activations_families.py``, ``tests/test_layernorm_lora_recompute.py``).
"""

from __future__ import annotations

from fitcheck.core.activations.layernorm_blocks import (
    FIRST_READERS,
    BlockCtx,
    R,
    block_ctx,
    fused_math,
    linear_reads,
)
from fitcheck.spec import TrainingSpec


def layernorm_outside_saved(spec: TrainingSpec) -> int:
    """Bytes kept outside the layers per micro-batch: embeddings side, final LayerNorm, MLM head, rotary tables.

    The layer-0 input is counted here (the layer formulas count each layer's own output); under checkpointing
    ``fitcheck.core.activations.decoder`` counts every checkpointed layer's input instead.
    """
    c = block_ctx(spec)
    sh = spec.model.shape
    fam = sh.traits.recipe
    b, s, h = spec.batch.micro_batch, spec.batch.seq_len, sh.hidden_size
    e = c.e
    ckpt = spec.activations.checkpointing
    # without checkpointing: the layer-0 input, kept by its first op when a gradient flows into it (trained
    # embeddings); with it, every checkpointed layer's input is counted by fitcheck.core.activations.decoder and the
    # last layer's output (the final LayerNorm input, trace) is what is left to count here
    first = c.res * h if ckpt else (e * h if c.full else 0)  # the last layer output: fp32 residual (BlockCtx.res)
    per_token, fixed = 0, 0
    if fam is R.GPT2_BLOCK:
        per_token = first + (c.dm * h if c.drop.embedding > 0 and c.full else 0)  # embedding dropout mask
        per_token += c.ln + _head_input(c, h)  # ln_f statistics and output (the tied LM head input)
        fixed = 8 * s if c.full else 0  # position_ids arange (s,) int64, kept by the trained wpe
        if ckpt and not c.full:
            per_token += _gpt2_peft_embedding(c, h)
            fixed = 8 * s
    elif fam is R.BERT_BLOCK:
        if c.full or ckpt:
            # word + position + token-type sum (embedding LayerNorm input) and its statistics; dropout mask
            # (LoRA + checkpointing: enable_input_require_grads makes the embeddings require a gradient)
            per_token = e * h + c.ln + (c.dm * h if c.drop.hidden > 0 else 0)
            fixed = 8 * s if c.full else 0  # token_type_ids gathered from the (1, s) buffer (int64)
        per_token += 0 if ckpt else first
        if sh.task not in ("seq-cls", "token-cls"):  # a classifier has no MLM head (core/heads/classifier.py)
            # MLM head (BertLMPredictionHead): transform dense output, GELU output, LayerNorm stats and output
            per_token += 2 * e * h + c.ln + _head_input(c, h)
            if not c.full:
                per_token += linear_reads(c, h, ("dense",))  # an adapter on the head's transform dense ("all-linear")
        if ckpt:
            per_token += e * h  # the last layer output, read by the head's transform dense
    elif fam is R.PHI_PARALLEL:
        per_token = first + (c.dm * h if c.drop.embedding > 0 and c.full else 0)
        per_token += c.ln + _head_input(c, h)  # final_layernorm statistics and output
        rot = int(sh.head_dim * sh.partial_rotary_factor)  # PhiAttention.rotary_ndims
        fixed = 2 * s * rot * e  # cos and sin (1, s, rot) in the model dtype
    elif fam is R.FALCON_PARALLEL:
        per_token = first + c.ln + _head_input(c, h)  # embedding output; ln_f statistics and output
        fixed = 2 * s * sh.head_dim * e
    elif fam is R.BLOOM_ALIBI:
        if c.full or ckpt:  # LoRA + checkpointing: enable_input_require_grads (as for BERT)
            per_token = e * h + c.ln  # embedding output (word_embeddings_layernorm input) and statistics
        per_token += first + c.ln + _head_input(c, h)  # layer-0 input; ln_f statistics and output
    if ckpt:
        fixed += _checkpoint_args(spec, c)
    elif not c.full:
        per_token -= _layer0_without_grad(spec, c)
    return per_token * b * s + fixed


def _gpt2_peft_embedding(c: BlockCtx, h: int) -> int:
    """GPT-2, peft + checkpointing: transformers' enable_input_require_grads makes the wte output require a
    gradient, so the embedding dropout keeps its mask and the wte output stays alive (trace) until the embedding's
    backward: bytes per token."""
    return c.e * h + (c.dm * h if c.drop.embedding > 0 else 0)


def layernorm_ckpt_outside(spec: TrainingSpec) -> int:
    """Bytes per token outside the layers and their checkpoints that a checkpointed LoRA run of a LayerNorm block
    holds until the embedding's backward (GPT-2's wte output and embedding-dropout mask; 0 for the others: Phi's
    embedding output is layer 0's checkpoint itself)."""
    c = block_ctx(spec)
    if spec.model.shape.traits.recipe is not R.GPT2_BLOCK or c.full or not spec.activations.checkpointing:
        return 0
    return _gpt2_peft_embedding(c, spec.model.shape.hidden_size)


def layernorm_top_residual(spec: TrainingSpec) -> int:
    """Element bytes of the residual stream past layer 0 of a LayerNorm block (``BlockCtx.res``)."""
    return block_ctx(spec).res


def _head_input(c: BlockCtx, h: int) -> int:
    """Bytes per token of the LM head's input (the final LayerNorm's output; BERT's MLM transform LayerNorm's), kept
    by the head when its weight is trained (full fine-tune); a frozen head (LoRA) keeps none."""
    return c.e * h if c.full else 0


def layernorm_head_input(spec: TrainingSpec) -> int:
    """Bytes per token :func:`layernorm_outside_saved` counts for the LM head's input (a causal LM's or BERT's MLM
    head; a classifier's head has its own recipe: ``heads.py``)."""
    sh = spec.model.shape
    if sh.traits.recipe is R.BERT_BLOCK and sh.task in ("seq-cls", "token-cls"):
        return 0
    return _head_input(block_ctx(spec), sh.hidden_size)


def _checkpoint_args(spec: TrainingSpec, c: BlockCtx) -> int:
    """Tensors a non-reentrant checkpoint keeps alive because every layer receives them (trace)."""
    sh = spec.model.shape
    b, s = spec.batch.micro_batch, spec.batch.seq_len
    if sh.traits.recipe in (R.PHI_PARALLEL, R.FALCON_PARALLEL):
        extra = 8 * s  # position_ids (s,) int64
        if sh.traits.recipe is R.FALCON_PARALLEL:
            extra += s * s * (c.e if c.eager else 1)  # materialised causal mask (1, 1, s, s): float / bool
        return extra
    if sh.traits.recipe is R.BLOOM_ALIBI:
        return b * s * s * c.e + b * sh.num_heads * s * c.e  # float causal mask (b, 1, s, s), ALiBi (b·a, 1, s)
    return 0


def _layer0_without_grad(spec: TrainingSpec, c: BlockCtx) -> int:
    """Bytes per token layer 0 does not keep under LoRA: its input needs no gradient (frozen embeddings).

    The first LayerNorm keeps no statistics, a branch reaching an adapter only through frozen linears keeps
    nothing (Phi/Falcon parallel MLP), and attention keeps q (k) only when k (q) needs a gradient (trace).
    """
    sh = spec.model.shape
    fam = sh.traits.recipe
    q, kv, inter = sh.num_heads * sh.head_dim, sh.num_kv_heads * sh.head_dim, sh.intermediate_size
    out = 0 if fam is R.BERT_BLOCK else c.ln
    if c.lora_dropout > 0:
        # adapters reading the layer input (through its LayerNorm) keep no dropout mask there
        first_readers = FIRST_READERS[fam]
        out += c.dm32 * sh.hidden_size * sum(1 for n in first_readers if n in c.targets)
    if fam is R.PHI_PARALLEL and "fc1" not in c.targets:
        out += 4 * c.e * inter  # fc1 output and gelu_new intermediates
    if fam is R.FALCON_PARALLEL and "dense_h_to_4h" not in c.targets:
        out += c.e * inter  # dense_h_to_4h output
    if fam in (R.BERT_BLOCK, R.PHI_PARALLEL):
        qn, kn = ("query", "key") if fam is R.BERT_BLOCK else ("q_proj", "k_proj")
        p = c.drop.attention
        fused = not c.eager and not fused_math(c, p, sh.num_kv_heads == sh.num_heads, False)
        if not fused:
            width = c.e if c.eager else 4
            out += (width * q if kn not in c.targets else 0) + (width * kv if qn not in c.targets else 0)
    return out


def layernorm_logits(spec: TrainingSpec) -> tuple[int, int]:
    """(forward peak, start-of-backward) bytes of the vocab-sized tensors and the labels.

    Causal LMs (transformers ``loss_utils.ForCausalLMLoss``): logits in the model dtype, the fp32 upcast
    (a no-op in fp32) and the fp32 log-softmax; labels padded by one. BERT's ``BertForMaskedLM`` calls
    ``CrossEntropyLoss`` on the logits in the model dtype: log-softmax, its gradient and the logits gradient all
    in the model dtype, labels not copied.
    """
    c = block_ctx(spec)
    sh = spec.model.shape
    b, s, v, h = spec.batch.micro_batch, spec.batch.seq_len, sh.vocab_size, sh.hidden_size
    bsv = b * s * v
    e = c.e
    held = 0 if c.full else e * b * s * h  # the head input, alive during the loss though not saved (frozen head)
    if sh.traits.recipe is R.BERT_BLOCK:
        return 2 * e * bsv + 2 * e + held, 3 * e * bsv + 2 * e
    labels = b * (s + 1) * 8 + 8
    fwd = (e + 4 + (4 if e == 2 else 0)) * bsv + labels + held
    return fwd, 12 * bsv + 8


def layernorm_findings_text(spec: TrainingSpec) -> str | None:
    """Why a LayerNorm-family formula is not pinned for this spec, or None when it is."""
    if spec.precision.mixed_precision.value != "no" and not spec.precision.load_dtype.is_half:
        return "autocast over fp32 weights is not pinned for this family (16-bit casts per linear are not counted)"
    return spec.model.shape.traits.gaps.config
