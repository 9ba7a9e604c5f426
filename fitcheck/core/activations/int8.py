"""Saved activations and temporaries of an LLM.int8 LoRA step (bitsandbytes 8-bit base + LoRA, k-bit prepared); pure.

What bitsandbytes 0.50.2 runs (``nn/modules.py::Linear8bitLt.forward`` -> ``autograd/_functions.py::matmul``;
``has_fp16_weights=False``, ``llm_int8_threshold`` 6.0, weights frozen so ``needs_input_grad[1]`` is False):

* CPU/XPU in training mode: ``MatMul8bitFp``. Forward: ``CB = state.CB.to(A.dtype).mul_(SCB.unsqueeze(1)/127)``
  (the whole weight dequantized into a temporary in the input's dtype), ``F.linear(A, CB, bias)``; autocast is
  on inside the Function (no ``custom_fwd``), so under bf16 autocast F.linear casts A and CB to bf16 and the
  output is bf16. It keeps ``ctx.A = A`` (the input itself, an attribute: not ``save_for_backward``, so
  saved-tensor hooks, hence non-reentrant checkpointing, never drop it) whenever a graph node exists (the input
  requires grad). Backward: ``CB`` dequantized again in ``dtype_A`` and ``grad_output.to(dtype_A) @ CB``.
* CUDA: ``MatMul8bitLt``. Forward: ``A.to(float16)``, ``int8_vectorwise_quant`` (``CA`` int8, ``SCA`` fp32 per
  row, outlier columns |x| > threshold), ``int8_mixed_scaled_mm`` (``backends/default/ops.py``: int8 GEMM,
  output in ``A.dtype`` whatever autocast says, plus ``subA = A[:, outlier_cols]`` for the outlier columns).
  It keeps ``ctx.tensors = (None, subA, A)``: the input itself again, and the outlier columns (data-dependent
  width; not in the estimate, bounded by :mod:`.int8_outliers`). Backward: the same dequantized ``CB`` in
  ``dtype_A`` as on CPU. No dequantized weight in forward. The CUDA side is from source, not traced (the
  bitsandbytes CUDA kernels do not run here).

How the CUDA answer is derived (bitsandbytes 0.50.2, peft 0.21.2, torch aten; checked against an H200, below):

* ``MatMul8bitLt.forward`` with frozen int8 weights takes the fast path (``needs_input_grad[1]`` False):
  ``int8_vectorwise_quant(A.to(float16))`` (``backends/cuda/ops.py``: int8 ``CA`` and fp32 row scales; with
  ``threshold`` 6.0 the columns holding an element ``|x| >= 6`` are outlier columns), then
  ``int8_mixed_scaled_mm`` (``backends/default/ops.py``, no CUDA override): ``int8_linear_matmul`` (int32) and
  ``int8_mm_dequant`` (fp16, then ``.to(A.dtype)``). All of it is transient except the output (``A.dtype``:
  fp32 for the fp32 norm outputs and MLP product after k-bit preparation, 16-bit for the autocast attention
  output, autocast or not: custom ops are no autocast ops) and ``ctx.tensors = (None, subA, A)``.
* So each 8-bit layer keeps the same ``A`` tensors as on CPU (:func:`int8_layer_extra`) and the same outputs as the
  traced 4-bit layer (``Linear4bit`` casts back to the input dtype). ``MatMul8bitLt.backward`` dequantizes
  ``CB`` in ``dtype_A`` for ``grad_A`` exactly as ``MatMul8bitFp.backward`` does.
* What differs from the CPU trace: peft's LoRA dropout (``nn.Dropout``, p = 0.05) runs ``native_dropout`` on
  CUDA (bool mask, 1 B/element; CPU keeps fp32 noise), counted by the QLoRA layer it shares
  (:func:`fitcheck.core.activations.qlora.lora_dropout_mask_bytes`). ``subA``, a copy of
  the outlier columns in ``A.dtype``, depends on the values and is not counted (a trained model has a few
  outlier features; the random weights of ``benchmarks/gpu_truth.py`` put one in almost every down_proj input
  column, ``benchmarks/int8_cuda_outliers.py``; :mod:`.int8_outliers` gives its bytes for given columns and
  the bound, every column, reported in the ``cuda-not-traced`` finding). Layer 0 without checkpointing records no
  q/k/v node (:func:`int8_first_layer_unsaved`), on both devices.
* H200, ``benchmarks/data/gpu_truth_nvidia_h200.json`` (max_allocated): Llama-3.2-1B 4 x 1024 -1.39 %, Llama-2-7B
  8 layers 1 x 4096 -7.62 % (checkpointed -17.54 %); with the outlier columns counted on the rows' own random
  models +0.03 %, +0.16 % (-2.89 %: the checkpointed row peaks in the top layer's recomputation, where the
  outlier weight columns are dequantized too: +3.06 % with that ``subB`` transient added).

So an 8-bit layer saves what the traced QLoRA layer saves (:func:`qlora_layer_saved_per_token`: peft's 8-bit
LoRA wrapper keeps the same adapter tensors as its 4-bit one) plus the input of every 8-bit linear that no
adapter keeps itself, and, on CPU under autocast, a bf16 MLP where 4-bit returns fp32. Traces of the real
Llama-2-7B layer (2-layer minus 1-layer, ``tests/test_activations_int8.py``, ``benchmarks/formula_vs_trace.py``)
are reproduced to the byte.
"""

from __future__ import annotations

from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.qlora import kbit_upcast, qlora_layer_saved_per_token
from fitcheck.spec import DeviceType, MixedPrecision, QkNorm, TrainingSpec

_QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")
_ALL = (*_QKV, "o_proj", *_GATE_UP, "down_proj")
SOURCE = "bitsandbytes 0.50.2 autograd/_functions.py MatMul8bitFp (CPU) / MatMul8bitLt (CUDA): ctx keeps the input"


def int8_formula_applies(spec: TrainingSpec) -> bool:
    """An 8-bit bitsandbytes base with LoRA, prepared for k-bit training, on a family whose layer was traced."""
    quant = spec.quant
    return (
        quant is not None
        and quant.bits == 8
        and quant.method == "bitsandbytes"
        and kbit_upcast(spec)
        and spec.lora is not None
        and not spec.lora.use_dora
        and spec.model.shape.traits.kbit_pinned
        and spec.model.shape.traits.qk_norm is QkNorm.NONE  # Qwen3's q/k norms: traced with 4-bit + k-bit prep only
    )


def int8_ctx_through_checkpoint(spec: TrainingSpec) -> bool:
    """Whether checkpointed 8-bit layers keep their ``ctx.A`` inputs: non-reentrant checkpointing only. Reentrant
    checkpointing runs the forward under ``no_grad`` (no Function node, no ctx; trace: one layer adds only its
    fp32 input), and its recomputed graph dies with the layer's backward."""
    return int8_formula_applies(spec) and spec.activations.checkpointing and not spec.activations.use_reentrant


def _targets(spec: TrainingSpec) -> frozenset[str]:
    return wrapped_linears(spec.lora, _ALL)


def _cpu_autocast(spec: TrainingSpec) -> bool:
    """bf16/fp16 autocast on CPU: MatMul8bitFp's F.linear returns 16-bit outputs (CUDA's int8 GEMM returns A.dtype)."""
    return spec.precision.mixed_precision is not MixedPrecision.NO and spec.hardware.device_type is DeviceType.CPU


def int8_layer_saved_per_token(spec: TrainingSpec, eager: bool) -> tuple[int, int]:
    """(bytes per token, s² coefficient) one 8-bit LoRA decoder layer saves (no checkpointing).

    The QLoRA layer plus the 8-bit linears' own inputs (``ctx.A``): the fp32 norm outputs read by q/k/v and by
    gate/up, the down_proj input and (eager) the o_proj input copy, unless an adapter without dropout or
    autocast already keeps that very tensor. On CPU under autocast the gate/up outputs, act(gate) and their
    product are bf16 (4-bit: fp32), the product being the down_proj input ``ctx.A`` keeps (trace: 8I vs 12I).

    Args:
        spec: A spec for which :func:`int8_formula_applies`.
        eager: Eager attention (else SDPA).

    Returns:
        The per-token bytes and the eager-attention s² coefficient.
    """
    per_token, s2 = qlora_layer_saved_per_token(spec, eager)
    return per_token + int8_layer_extra(spec, eager, ctx_only=False), s2


def int8_layer_extra(spec: TrainingSpec, eager: bool, *, ctx_only: bool) -> int:
    """Bytes per token an 8-bit layer saves beyond the QLoRA layer (``ctx_only``: only the tensors nothing but
    ``ctx.A`` keeps, which a non-reentrant recomputation does not keep: its pack hook stores detached tensors,
    torch/utils/checkpoint.py ``_checkpoint_hook``, so the recomputed Function nodes die at once)."""
    lora = spec.lora
    if lora is None:
        return 0
    sh = spec.model.shape
    h, inter, q = sh.hidden_size, sh.intermediate_size, sh.num_heads * sh.head_dim
    t = _targets(spec)
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    plain = lora.dropout == 0 and not amp  # the fp32 adapter saves its input tensor itself

    def kept_by_adapter(names: tuple[str, ...]) -> bool:
        return plain and any(n in t for n in names)

    extra = 0
    for names, width in ((_QKV, h), (_GATE_UP, h)):
        extra += 0 if kept_by_adapter(names) else 4 * width  # the fp32 norm output
    if _cpu_autocast(spec):
        # bf16 gate, up, act(gate) and product (2I each) where 4-bit keeps 12I; the product is the down_proj
        # input kept by ctx.A (peft casts it to fp32 for the adapter, which saves its own cast)
        extra -= 0 if ctx_only else 4 * inter
    elif not kept_by_adapter(("down_proj",)):
        extra += 4 * inter  # the fp32 product act(gate) * up
    if eager:
        # the transpose(1, 2).contiguous() copy read by o_proj (SDPA: o_proj reads SDPA's saved output itself);
        # the QLoRA layer counts it already when a plain fp32 o_proj adapter saves it
        extra += (2 if amp else 0 if kept_by_adapter(("o_proj",)) else 4) * q
    return extra


def int8_first_layer_unsaved(spec: TrainingSpec) -> int:
    """Bytes per token the first layer's q/k/v ``ctx.A`` does not keep without checkpointing.

    Its input is the frozen embedding's output, and k-bit preparation adds no input-gradient hook without
    gradient checkpointing (peft 0.21.2 ``utils/other.py`` ``prepare_model_for_kbit_training`` calls
    ``enable_input_require_grads`` only when ``use_gradient_checkpointing``). So the input norm's output needs no
    gradient, no q/k/v ``MatMul8bitLt`` / ``MatMul8bitFp`` node is recorded (torch ``autograd.Function.apply``
    records none when no input requires grad: bitsandbytes 0.50.2 ``autograd/_functions.py``) and no ``ctx`` keeps
    that fp32 tensor. An adapter that reads it itself (fp32, no dropout) still keeps it.
    """
    if not int8_formula_applies(spec) or spec.activations.checkpointing:
        return 0
    lora = spec.lora
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    kept_by_adapter = lora is not None and lora.dropout == 0 and not amp and bool(_targets(spec) & set(_QKV))
    return 0 if kept_by_adapter else 4 * spec.model.shape.hidden_size


def int8_checkpointed_inputs(spec: TrainingSpec) -> int:
    """Bytes per token a checkpointed 8-bit layer keeps besides its input: every 8-bit linear's ``ctx.A``.

    Non-reentrant checkpointing (the transformers 5 / TRL default) runs forward with grad enabled and drops only
    what passes through ``save_for_backward``; ``ctx.A`` is an attribute, so the inputs of q/k/v (norm output),
    o_proj (attention output), gate/up (norm output) and down_proj (the product) stay until backward (trace
    ``llama int8 ckpt``: 4·(3h + q + I) per token in fp32; bf16 attention output and product under CPU autocast).
    """
    sh = spec.model.shape
    h, inter, q = sh.hidden_size, sh.intermediate_size, sh.num_heads * sh.head_dim
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    attn_out = 2 if amp else 4  # SDPA/eager output dtype (autocast casts q, k, v to bf16)
    product = 2 if _cpu_autocast(spec) else 4
    return 4 * h + attn_out * q + 4 * h + product * inter


def int8_dequantized_dtype_bytes(spec: TrainingSpec) -> int:
    """Element bytes of down_proj's input (``ctx.dtype_A``), the dtype ``MatMul8bitFp`` / ``MatMul8bitLt`` backward
    dequantizes its weight in: the fp32 product of a k-bit-prepared MLP, bf16 on CPU under autocast
    (:func:`int8_checkpointed_inputs`' ``product``)."""
    return 2 if _cpu_autocast(spec) else 4


def int8_recompute_dequantizes_16bit(spec: TrainingSpec) -> bool:
    """Checkpointed LLM.int8 LoRA on CPU under autocast: the top layer's recompute runs ``MatMul8bitFp.forward``
    again, each MLP weight dequantized in fp32 and cast to bf16 by F.linear (:func:`int8_forward_temporary`'s
    6 B per element) beside the recomputed layer, a moment of backward not modelled (trace Llama-2-7b 1 x 576:
    the backward peak, at up_proj's recompute)."""
    return int8_formula_applies(spec) and _cpu_autocast(spec) and spec.activations.checkpointing


def int8_forward_temporary(spec: TrainingSpec) -> int:
    """Bytes of the largest 8-bit weight dequantized by ``MatMul8bitFp.forward`` (CPU only; CUDA's int8 GEMM makes
    none): ``state.CB.to(A.dtype)`` in fp32 (4 B per element after k-bit preparation), plus F.linear's bf16 cast
    of it under autocast (2 B). It is alive inside the forward of the layer's largest linear, before the logits
    exist: the forward peak when it exceeds the logits (trace: Mistral-7B, 1 x 256, -171.5 MiB without it)."""
    if spec.hardware.device_type is not DeviceType.CPU:
        return 0
    sh = spec.model.shape
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    return (6 if amp else 4) * sh.hidden_size * max(sh.intermediate_size, sh.hidden_size)
