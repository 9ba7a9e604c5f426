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

Those rows are peft's fp32 adapters where the branch runs in fp32: peft 0.21.2 ``tuners/lora/bnb.py``
``Linear4bit.forward`` sets ``requires_conversion = not torch.is_autocast_enabled()``, and the argument-less call
reports CUDA's autocast only (torch 2.13 ``torch/csrc/autograd/init.cpp``), so under a CPU step's autocast peft casts
the LoRA input to the fp32 adapter dtype and the branch, with its input gradients, runs in fp32. They hold for a
CPU step (a real CPU run takes that branch too) and for 16-bit steps without autocast.

On a GPU under ``torch.autocast("cuda")`` the call answers True: no cast, the branch runs on the bf16 input
(autocast casts the fp32 adapter weights), the two fp32 I-wide input gradients are gone. The CUDA-emulating trace
answers the call the same way (``torch_adapters/cuda_emulation.py`` item 5; before it, CUDA specs were traced, and
these rows fitted, with the fp32 branch). TRL 1.16 runs no fp32 branch on either device: after ``get_peft_model``
it casts every trainable parameter of a bitsandbytes-quantized model to bf16 (``trl/trainer/sft_trainer.py``
``SFTTrainer.__init__``, ``param.data = param.data.to(torch.bfloat16)``; ``core.states.trl_bf16_trainables``), so
``_cast_input_dtype`` has nothing to cast. On a CUDA spec under bf16 autocast (:func:`sixteen_bit_branch`, either
trainer) the working set, measured the same way on CUDA-emulating fake traces:

==========================  ==============  ===================================================================
LoRA on the MLP, dropout    2·I + 6·h       (the fp32 row less the two fp32 I-wide input gradients: 8·I)
LoRA on the MLP, no dropout 4·I − 10·h      (the fp32 row less 2·I + 16·h)
q / v only (MLP bare)       6·I − 2·h       (no branch in the MLP: its 4-bit backward alone; any device)
q / v only, no dropout      6·I − 4·h
==========================  ==============  ===================================================================

The dropout row: TRL's SFT step (``tracer_trl``: the bf16 cast, fused head; dropout 0.05; (h, I) = (256, 688), (256,
1376), (512, 1376) at 512 tokens, ``benchmarks/sft_qlora_branch.py``) and the plain Trainer's step with peft's fp32
adapters (Llama-3.1 and Qwen2.5 layers, 2 layers, (h, I) = (1024, 4096), (1024, 8192), (2048, 4096), slope over 1024
/ 2048 / 4096 tokens: 1.999·I + 6·h, within 4 B/token; ``benchmarks/qlora16_cuda_branch.py``). The no-dropout row:
the plain Trainer's step, slope over 4096 / 8192 tokens at (1024, 4096), (2048, 8192), (2048, 4096), (1024, 2816),
within 36 B/token (Llama-3.1; Qwen2.5 the same at the first and third; TRL's SFT step the same at the first and
third, slope +36 B/token). The q / v no-dropout row: the plain Trainer's step at (1024, 4096), (2048, 4096), slope
over 2048 / 4096 tokens, within 4 B/token (the 16-bit all-linear row was 2·I + 6·h under it). The same moment in the
fp32-branch trace was the table above to 4 B/token at those shapes (10·I + 6·h, 6·I + 6·h). fp16 autocast is not
measured on CUDA (the fp32 rows stay; the CUDA trace is 18.4k .. 20.5k B/token above them at two shapes).

The q / v row holds for peft's fp32 adapters too, a plain ``Trainer`` on a CPU or a CUDA spec: the moment is in the
bare MLP, where no branch runs (same shapes, fp32 adapters, plain activation trace: formula − trace +168 .. +312
B/token with it, +4968 .. +9912 with the all-linear row above, which peft's default targets q_proj / v_proj were
given before).
"""

from __future__ import annotations

from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.promoted import kbit_upcast, promoted_residual
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
        and not promoted_residual(spec)  # fp32 above layer 0: the k-bit path (qlora.qlora_formula_applies)
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
        if not wrapped_linears(lora, _MLP):
            return 6 * inter - 4 * h  # q / v only, no dropout (the dropout case returned above)
        return 2 * inter + 6 * h if drop else 4 * inter - 10 * h
    if spec.precision.mixed_precision is MixedPrecision.NO:
        return 6 * inter + 8 * h if drop else 4 * inter + 6 * h
    return (10 if drop else 6) * inter + 6 * h


def sixteen_bit_branch(spec: TrainingSpec) -> bool:
    """The LoRA branch runs on the 16-bit input (module docstring) in the measured setting: a CUDA spec under bf16
    autocast, where peft's argument-less ``torch.is_autocast_enabled()`` is True, with peft's fp32 adapters or TRL's
    bf16 ones (elsewhere the fp32 rows stay: a CPU step converts; fp16 autocast is not measured)."""
    return (spec.lora is not None and spec.hardware.device_type is DeviceType.CUDA
            and spec.precision.mixed_precision is MixedPrecision.BF16)
