"""QLoRA without peft's k-bit preparation: a 4-bit base whose other parameters stay 16-bit; pure.

TRL 1.16's trainers never call ``prepare_model_for_kbit_training`` (``trl/trainer/sft_trainer.py`` builds the
PEFT model with ``get_peft_model`` only), and a plain ``Trainer`` script may skip it. Then the embeddings,
norms and LM head keep the load dtype (bf16): the residual stream and ``bnb.nn.Linear4bit``'s outputs (cast back
to the input dtype) are bf16, and only the LoRA branches compute in fp32 (peft casts their input to the fp32
adapter weights' dtype, ``peft/tuners/lora/bnb.py`` ``_cast_input_dtype``) unless autocast casts it to bf16.

Without checkpointing the saved activations are those of a bf16 LoRA model whose base matmuls save nothing
(``MatMul4Bit``): the LoRA recipe of :mod:`fitcheck.core.activations.decoder` gives the trace to the byte
(Llama-3-8B width, every attention × precision cell, ``benchmarks/formula_vs_trace.py qlora_noprep``).

With checkpointing the peak of backward is in the first recomputed layer, every checkpoint still held, as with
the preparation (:func:`fitcheck.core.activations.qlora.qlora_backward_working_set`), but with a 16-bit working
set. Measured on fake-tensor traces of the real step (Llama layer, 2 layers, vocabulary 2048 so that the head is
not the peak; working set = backward peak − checkpoints − one recomputed layer's saved tensors, fitted over
b·s = 1024 and 2048 tokens and (h, I) = (1024, 4096), (1024, 8192), (2048, 4096), within 0.3 %):

=================  ============  ============
precision          dropout 0     dropout > 0
=================  ============  ============
bf16 (no autocast) 4·I + 6·h     6·I + 8·h
bf16 autocast      6·I + 6·h     10·I + 6·h
=================  ============  ============

(the MatMul4Bit input gradient and its sum with the LoRA branch's gradient in the MLP, plus the fp32 dropout
mask/output and the cast gradients of the LoRA inputs, which peft computes in fp32 without autocast).
"""

from __future__ import annotations

from fitcheck.core.activations.qlora import kbit_upcast
from fitcheck.spec import MixedPrecision, QkNorm, TrainingSpec


def qlora16_applies(spec: TrainingSpec) -> bool:
    """A bitsandbytes 4-bit base + LoRA (no DoRA) without k-bit preparation, 16-bit load, traced family."""
    quant, lora = spec.quant, spec.lora
    return (
        quant is not None
        and quant.bits == 4
        and not quant.pre_quantized
        and not kbit_upcast(spec)
        and spec.precision.load_dtype.is_half
        and lora is not None
        and not lora.use_dora
        and spec.model.shape.traits.kbit_pinned
        and spec.model.shape.traits.qk_norm is QkNorm.NONE  # Qwen3's q/k norms: traced with 4-bit + k-bit prep only
    )


def qlora16_backward_working_set(spec: TrainingSpec) -> int:
    """Bytes per token in flight in the first recomputed layer's backward besides its saved tensors (table
    above)."""
    sh = spec.model.shape
    lora = spec.lora
    drop = lora is not None and lora.dropout > 0
    h, inter = sh.hidden_size, sh.intermediate_size
    if spec.precision.mixed_precision is MixedPrecision.NO:
        return 6 * inter + 8 * h if drop else 4 * inter + 6 * h
    return (10 if drop else 6) * inter + 6 * h
