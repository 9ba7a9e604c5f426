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

Those rows are peft's fp32 adapters on a fake CPU trace, where peft 0.21.2 ``tuners/lora/bnb.py``
``Linear4bit.forward`` sets ``requires_conversion = not torch.is_autocast_enabled()``: the argument-less call
reports CUDA's autocast only (torch 2.13), so under the trace's CPU autocast peft casts the LoRA input to the fp32
adapter dtype and the branch, with its input gradients, runs in fp32. TRL 1.16 runs no fp32 branch: after
``get_peft_model`` it casts every trainable parameter of a bitsandbytes-quantized model to bf16
(``trl/trainer/sft_trainer.py`` ``SFTTrainer.__init__``, ``param.data = param.data.to(torch.bfloat16)``;
``core.states.trl_bf16_trainables``), so ``_cast_input_dtype`` has nothing to cast and the branch is bf16. Its
working set (:func:`sixteen_bit_branch`), measured the same way on CUDA-emulating fake traces of TRL's SFT step
(``tracer_trl``: the bf16 cast, fused head; dropout 0.05, bf16 autocast over a bf16 load; (h, I) = (256, 688),
(256, 1376), (512, 1376) at 512 tokens, ``benchmarks/sft_qlora_branch.py``):

==========================  ============
LoRA on the MLP             2·I + 6·h     (the row above less the two fp32 I-wide input gradients: 8·I)
q / v only (MLP bare)       6·I − 2·h     (no branch in the MLP: its 4-bit backward alone)
==========================  ============

The q / v row holds for peft's fp32 adapters too, a plain ``Trainer`` on a CPU or a CUDA spec: the moment is in the
bare MLP, where no branch runs (same shapes, fp32 adapters, plain activation trace: formula − trace +168 .. +312
B/token with it, +4968 .. +9912 with the all-linear row above, which peft's default targets q_proj / v_proj were
given before). The same traces with peft's fp32 adapters and CUDA's autocast reported to peft (what a GPU run of a
plain ``Trainer`` does) hold the same tensors at that moment (Qwen2.5-0.5B width, 2 layers, 4 x 1024: 676.9 vs 674.7 MB
live); the tracer does not report it (``torch.is_autocast_enabled()`` stays False on CPU), so plain-Trainer rows
stay the fp32 ones.
"""

from __future__ import annotations

from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.qlora import kbit_upcast
from fitcheck.spec import DeviceType, MixedPrecision, QkNorm, TrainingSpec

_MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj")  # Phi-3 fuses gate and up


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
    if drop and spec.precision.mixed_precision is MixedPrecision.BF16 and not wrapped_linears(lora, _MLP):
        return 6 * inter - 2 * h  # q / v only: the bare MLP's backward (table below the first)
    if sixteen_bit_branch(spec):
        return 2 * inter + 6 * h
    if spec.precision.mixed_precision is MixedPrecision.NO:
        return 6 * inter + 8 * h if drop else 4 * inter + 6 * h
    return (10 if drop else 6) * inter + 6 * h


def sixteen_bit_branch(spec: TrainingSpec) -> bool:
    """TRL's bf16 adapters (module docstring) in the measured setting: CUDA, bf16 autocast, LoRA dropout > 0 (the
    bf16 branch's own row; elsewhere the fp32 rows stay: not measured with TRL's cast)."""
    from fitcheck.core.states import trl_bf16_trainables  # states import activations: not at module level

    lora = spec.lora
    return (trl_bf16_trainables(spec) and lora is not None and lora.dropout > 0
            and spec.hardware.device_type is DeviceType.CUDA
            and spec.precision.mixed_precision is MixedPrecision.BF16)
