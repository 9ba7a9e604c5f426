"""LoRA under gradient checkpointing: the worst moment of backward is inside the top layer's recompute (pure).

Under non-reentrant checkpointing (transformers 5.23 ``GradientCheckpointingLayer`` -> torch 2.13
``torch/utils/checkpoint.py``), the first backward node of a layer that unpacks a saved tensor re-runs the
layer's forward under ``_recomputation_hook``; the pack hook stores each re-made saved tensor and raises
``_StopRecomputationError`` as soon as the last one is packed (``early_stop``, the default). In a peft 0.21.2
LoRA layer the first such node is down_proj's ``lora_B`` (``tuners/lora/layer.py`` ``Linear.forward``:
``result = base_layer(x)``, ``x = _cast_input_dtype(x, lora_A.weight.dtype)``,
``result = result + lora_B(lora_A(dropout(x))) * scaling``, ``result.to(torch_result_dtype)``) and the last
tensor packed is down_proj's ``lora_A`` output, so at that instant the recomputed layer's Python locals are all
alive besides every saved tensor (fake-tensor traces of Llama-3.1-8B at 8 x 4096, per-op listings of the live
storages at the during-backward peak, ``benchmarks/lora_recompute_trace.py``):

- gradients in flight: the residual-stream gradient (r·h), its 16-bit cast where an add promoted a 16-bit
  input (``AddBackward``: down_proj's base output under an fp32 LoRA branch; the autocast layer output added to
  an fp32 residual stream; e·h each) and ``grad * scaling`` for ``lora_B`` (fp32 adapters: 4·h; 16-bit under
  autocast);
- the layer's locals: the post-attention residual (r·h; an fp32 model's norm saves it anyway), the
  post-attention norm output (r·h), the down_proj input ``act(gate) * up`` (e·I), down_proj's base output
  (e·h), peft's fp32 copy of a 16-bit down_proj input (4·I; saved by ``lora_A`` itself without dropout and
  autocast) and, under autocast with dropout, the fp32 dropout output that ``lora_A`` is reading (4·I);
- under autocast, the 16-bit casts of the layer's adapter weights (saved by their linears).

No LoRA gradient exists yet in that layer (``lora_B``'s weight gradient is computed by the node that triggered
the recompute). After the recompute the MLP backward frees down_proj's adapter tensors before the gated
product's two gradients exist, so its working set is r·h + 3·e·I less what that adapter saved.
"""

from __future__ import annotations

from fitcheck.core.activations.int8 import int8_dequantized_dtype_bytes, int8_formula_applies
from fitcheck.core.activations.layer_saved import (
    adapter_mlp_saved,
    down_adapter_saved,
    first_layer_unsaved,
    lora_reads_input_itself,
)
from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.qlora import (
    kbit_fp32_lora,
    lora_dropout_mask_bytes,
    lora_layer_params,
    matmul4bit_backward_weight,
)
from fitcheck.core.kernels import liger_applies, offload_applies
from fitcheck.spec import Dtype, LayerRecipe, MixedPrecision, NormKind, NormPlacement, TrainingSpec

_DOWN = "down_proj"
# Gemma's ``(1 + weight.float())`` RMSNorm (transformers 5.23 modeling_gemma.py ``GemmaRMSNorm``) saves what
# Llama's does (its fp32 input and rsqrt) plus the fp32 ``1 + weight`` vector, counted once per layer by
# ``backward._gemma_norms``; its GeGLU MLP (``gelu_pytorch_tanh`` on the gate) saves the gate output as SiLU does.
# So the same moments hold (benchmarks/envelope_ranges.py gemma/{lora,qlora,dora}/ckpt/sdpa: within 0.6 % at
# gemma-7b and gemma-2b, 512-8192 tokens, micro-batch 1 and 8; QLoRA bf16 was +28.9 % at 1 x 512 without them)
_NORMS = (NormKind.RMS, NormKind.RMS_ONE_PLUS)
# Gemma-2's post-attention / post-feedforward norms (modeling_gemma2.py ``Gemma2DecoderLayer``) are counted in
# the layer's saved tensors (``layer_saved``); the moments hold at short sequences (gemma-2-9b / 27b QLoRA and
# LoRA, 512-1024 tokens: within 1.4 %, +30.9 % before). From ~8k tokens its eager soft-capped softmax backward
# (tanh, softmax, their gradients: s² each) is larger and not modelled here (-20.6 % at 1 x 8192).
_PLACEMENTS = (NormPlacement.PRE, NormPlacement.PRE_AND_POST)
_MLP_IN = ("gate_proj", "up_proj")
# adapters are fp32: get_peft_model(autocast_adapter_dtype=True) (core/states/lora.py)
_ADAPTER_BYTES = 4


def _targets(spec: TrainingSpec) -> frozenset[str]:
    return wrapped_linears(spec.lora, ("q_proj", "k_proj", "v_proj", "o_proj", *_MLP_IN, _DOWN))


def lora_recompute_applies(spec: TrainingSpec) -> bool:
    """Plain LoRA (no quantized base, no DoRA) on a Llama-style pre-norm RMSNorm decoder with a gated MLP whose
    down_proj is wrapped, every layer checkpointed: the layers this module's moments were traced on."""
    lora = spec.lora
    return (lora is not None and (spec.quant is None or _kbit_fp32(spec)) and not lora.use_dora
            and _recomputed_layer_traced(spec))


def dora_recompute_applies(spec: TrainingSpec) -> bool:
    """DoRA on a 16-bit or fp32 base, on the layer :func:`lora_recompute_applies` was traced on
    (``fitcheck.core.activations.dora.dora_recompute_moments``)."""
    lora = spec.lora
    return lora is not None and spec.quant is None and lora.use_dora and _recomputed_layer_traced(spec)


def _recomputed_layer_traced(spec: TrainingSpec) -> bool:
    """The Llama-style layer the moments were traced on (:func:`_layer_traced`), every layer checkpointed."""
    act = spec.activations
    return act.checkpointing and act.checkpoint_every_n_layers == 1 and _layer_traced(spec)


def _layer_traced(spec: TrainingSpec, down_wrapped: bool = True) -> bool:
    """The Llama-style LoRA layer the moments were traced on: pre-norm RMSNorm (Llama's or Gemma's, Gemma-2's post
    norms too), gated MLP with down_proj wrapped (``down_wrapped``; off: wrapped or not),
    separate or fused (Phi-3's qkv_proj / gate_up_proj: the same tensors saved, gate_up's output one storage)."""
    sh, lora = spec.model.shape, spec.lora
    t = sh.traits
    return (
        lora is not None and spec.freeze is None
        and t.recipe is LayerRecipe.DECODER and t.norm_kind in _NORMS and t.norm_placement in _PLACEMENTS
        and not sh.num_experts and t.vision is None and t.dropout.hidden == 0
        and sh.mlp_activation == "swiglu" and liger_applies(spec) is None and not offload_applies(spec)
        and (_DOWN in _targets(spec) or not down_wrapped)
        and not lora.modules_to_save
    )


def _kbit_fp32(spec: TrainingSpec) -> bool:
    """QLoRA after peft's k-bit preparation: an fp32 layer around frozen 4-bit matmuls (``MatMul4Bit`` saves no
    input; ``Linear4bit`` returns the input dtype: activations/qlora.py), with or without autocast.

    Any family whose recomputed layer is traced here, not only those with the QLoRA layer recipe
    (``kbit_pinned``): Phi-3's saved layer is the LoRA recipe in fp32 (``layer_saved``), its moments these
    (benchmarks/envelope_ranges.py phi3/qlora/ckpt/sdpa bf16 and fp32: within 1.2 % over 512-16384 tokens at
    Phi-3-mini and phi-4; +27.7 % / -44.9 % at 1 x 512 before). Under autocast the 4-bit backward and the
    recompute's stop are the same moments with the MLP in fp32 (:func:`_mlp_bytes`): before, the first
    recomputed layer's whole saved tensors plus 10·I per token were counted with no dequantized weight
    (Mistral-7B 1 x 512: +27.1 %, Qwen3-32B 1 x 4096: +6.8 %)."""
    return _kbit(spec)


def _amp(spec: TrainingSpec) -> bool:
    return spec.precision.mixed_precision is not MixedPrecision.NO


def recompute_tokens(spec: TrainingSpec, e: int, r: int, half: bool) -> int:
    """Bytes per token alive at the top recomputed layer's stop besides its saved tensors and checkpoints.

    Args:
        spec: A spec for which :func:`lora_recompute_applies`.
        e: Element bytes of matmul outputs (2 under a 16-bit model or autocast).
        r: Element bytes of the residual stream.
        half: 16-bit model weights.
    """
    inter = spec.model.shape.intermediate_size
    lora = spec.lora
    amp = _amp(spec)
    drop = lora is not None and lora.dropout > 0
    f = _mlp_bytes(spec, e)
    down_in = 0 if lora_reads_input_itself(spec) else f * inter
    cast = _ADAPTER_BYTES * inter if f == 2 and (drop or amp) else 0  # lora_A saves it only without both
    dropped = _ADAPTER_BYTES * inter if drop and amp else 0  # autocast saves lora_A's 16-bit cast instead
    return _in_flight(spec, e, r, half) + down_in + e * spec.model.shape.hidden_size + cast + dropped


def _mlp_bytes(spec: TrainingSpec, e: int) -> int:
    """Element bytes of the MLP's gate/up outputs, their product and its gradients: fp32 over a k-bit-prepared
    4-bit base even under autocast (``Linear4bit.forward`` casts its output back to the fp32 input's dtype,
    bitsandbytes 0.50.2 nn/modules.py; activations/qlora.py), else ``e``. Under autocast the fp32 product is
    down_proj's input, so peft makes no fp32 copy of it (trace Mistral-7B QLoRA autocast, 1 x 4095, at the
    recompute's stop: act·up and the dropout output fp32, 8·I per token; +2.7 % with 16-bit ones)."""
    return 4 if _kbit(spec) else e


def _kbit(spec: TrainingSpec) -> bool:
    return kbit_fp32_lora(spec)


def _in_flight(spec: TrainingSpec, e: int, r: int, half: bool) -> int:
    """Per token: the gradients in flight into the recomputed layer's MLP and the MLP input's locals."""
    h = spec.model.shape.hidden_size
    amp = _amp(spec)
    # type promotion in an add casts the gradient for its lower-precision input: down_proj's ``result +`` fp32
    # LoRA branch on a 16-bit base; the residual add of an fp32 stream and the layer's 16-bit (autocast) output
    promoted = (e * h if e == 2 and not amp else 0) + (e * h if r != e else 0)
    grads = r * h + promoted + (2 if amp else _ADAPTER_BYTES) * h
    residual = r * h if half else 0  # a 16-bit model's norm saves its fp32 cast, not the residual
    norm_out = 0 if lora_reads_input_itself(spec) and _targets(spec) & set(_MLP_IN) else r * h
    return grads + residual + norm_out


def recompute_up_tokens(spec: TrainingSpec, e: int, r: int, half: bool) -> int | None:
    """Bytes per token alive inside up_proj's LoRA branch during the recompute, relative to the whole layer's
    saved tensors (down_proj's adapter tensors and the up output are not made yet); None when up_proj is not
    wrapped.

    At ``lora_B(...) * scaling`` the base output (e·I), ``lora_B``'s output and its scaled copy (fp32 adapters:
    4·I each; 16-bit under autocast) are alive, and with dropout or autocast peft's fp32 copy of a 16-bit input
    (4·h). Without dropout this is the recompute's peak of a 16-bit model: ``lora_A`` of down_proj saves the
    fp32 copy of its input, so nothing larger is alive at the stop (trace Llama-3.1-8B bf16, dropout 0).
    """
    if "up_proj" not in _targets(spec):
        return None
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    lora = spec.lora
    amp = _amp(spec)
    drop = lora is not None and lora.dropout > 0
    c = 2 if amp else _ADAPTER_BYTES  # lora_B's output dtype
    cast = _ADAPTER_BYTES * h if _mlp_bytes(spec, e) == 2 and (drop or amp) else 0
    return _in_flight(spec, e, r, half) + cast + 2 * c * inter - down_adapter_saved(spec)


def base_backward(spec: TrainingSpec, r: int) -> int | None:
    """QLoRA: bytes at down_proj's ``MatMul4Bit`` backward beyond the layer's saved tensors; None for a 16-bit base.

    bitsandbytes 0.50.2 ``autograd/_functions.py`` ``MatMul4Bit.backward``: ``grad_output @
    dequantize_4bit(B, ctx.state).to(grad_output.dtype).t()``: the whole weight dequantized in the dtype it was
    loaded in (``quant_state.dtype``), then its cast to the compute dtype (the dequantized copy freed before the
    matmul's output exists) and the input gradient in the compute dtype, while the residual-stream gradient, the
    LoRA branch's fp32 gradient of the down_proj input (4·I) and ``Linear4bit``'s compute-dtype cast of the
    output gradient are alive and down_proj's adapter tensors are freed. At short sequences this is the worst
    moment (trace Llama-3.1-8B QLoRA 1 x 512: the weight's 112-336 MiB against 60 MiB of per-token locals).
    """
    quant = spec.quant
    if quant is None or not _kbit_fp32(spec):
        return None
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    bs = spec.batch.micro_batch * spec.batch.seq_len
    comp, weight, copy = matmul4bit_backward_weight(spec, inter, h)
    tokens = (r * h + _ADAPTER_BYTES * inter + (comp * h if comp != r else 0) - down_adapter_saved(spec)) * bs
    dequantized = copy + weight if copy else 0  # before the cast's source is freed
    down = tokens + max(dequantized, weight + comp * inter * bs)
    if not sh.traits.fused_projections:
        return down
    # Phi-3's fused gate_up_proj (transformers 5.23 modeling_phi3.py ``Phi3MLP``: ``gate_up_proj`` then
    # ``chunk(2)``) is a 2I x h 4-bit weight, dequantized the same way in its own MatMul4Bit backward, twice
    # down_proj's. By then the MLP's saved tensors are freed; alive besides the rest of the layer: the
    # residual-stream gradient (r·h), the LoRA branch's fp32 gradient of the input waiting for the base one (4·h)
    # and Linear4bit's compute-dtype cast of the 2I-wide output gradient (trace phi-4 QLoRA, fp32 load,
    # 1 x 512: 700 MiB fp32 dequantized + 350 MiB bf16 cast + 35 MiB output gradient cast; -29.4 % without it)
    wide = 2 * inter
    gu_tokens = (r * h + _ADAPTER_BYTES * h + comp * wide - adapter_mlp_saved(spec)) * bs
    _, gu_weight, gu_copy = matmul4bit_backward_weight(spec, wide, h)
    gu_deq = gu_copy + gu_weight if gu_copy else 0
    return max(down, gu_tokens + max(gu_deq, gu_weight + comp * h * bs))


def int8_base_backward(spec: TrainingSpec, r: int) -> int | None:
    """LLM.int8 LoRA: bytes at a layer's down_proj ``MatMul8bitFp`` / ``MatMul8bitLt`` backward beyond the layer's
    saved tensors; None where the 8-bit formula does not apply.

    bitsandbytes 0.50.2 ``autograd/_functions.py``: both backwards compute ``grad_A = grad_output.to(dtype_A) @
    CB`` with ``CB = state.CB.to(ctx.dtype_A, copy=True).mul_(SCB.unsqueeze(1) / 127)``, the whole weight
    dequantized in the input's dtype (fp32 after k-bit preparation; bf16 on CPU under autocast, whose F.linear
    made the MLP product 16-bit: ``int8._cpu_autocast``). peft 0.21.2 ``tuners/lora/bnb.py``
    ``Linear8bitLt.forward`` adds the LoRA branch last, so its backward ran first: down_proj's adapter tensors are
    freed and its gradient of the input (fp32, 4·I) waits for the base one. Alive then besides the saved tensors:
    the residual-stream gradient (r·h), that branch gradient, the dequantized weight and ``grad_A`` (the
    output-gradient ``.to`` is no copy: it is already ``dtype_A``). Trace Qwen2.5-32B int8 LoRA bf16, checkpointed,
    1 x 960 (``benchmarks/pinned_probes.py`` seed 2201, accumulation 4): the 566 MiB fp32 weight made this the
    backward peak, -2.52 % without it (-14.2 % on a 4-layer copy); the forward's own dequantized weight is
    ``int8.int8_forward_temporary``.
    """
    if not int8_formula_applies(spec):
        return None
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    e_a = int8_dequantized_dtype_bytes(spec)
    branch = _ADAPTER_BYTES * inter if _DOWN in _targets(spec) else 0
    tokens = r * h + branch - down_adapter_saved(spec) + e_a * inter
    return tokens * spec.batch.micro_batch * spec.batch.seq_len + e_a * inter * h


def unrecomputed_base_backward(spec: TrainingSpec, r: int) -> int | None:
    """QLoRA without checkpointing: :func:`base_backward`'s bytes at the top layer's down_proj (and Phi-3's
    gate_up_proj) ``MatMul4Bit`` backward beyond every layer's saved tensors; None where it does not apply.

    ``MatMul4Bit.backward`` (bitsandbytes 0.50.2 ``autograd/_functions.py``) is plain Python over
    ``F.dequantize_4bit``, whose CUDA kernel (``backends/cuda/ops.py`` ``bitsandbytes::dequantize_4bit``:
    ``torch.empty(shape, dtype=dtype)``) and CPU kernel (``backends/cpu/ops.py``) both return a whole
    ``quant_state.dtype`` weight, so the moment is the same on both devices. Without checkpointing no layer is
    recomputed, but the top layer's down_proj backward runs in the same order (peft's LoRA branch first, its
    adapter tensors freed; then the base's dequantized weight and its cast) with every layer's saved tensors
    alive. It is the backward peak at short sequences on a wide layer (trace
    Llama-3.1-70B QLoRA fp32 load, 3 layers, 1 x 512: fp32 ``dequantize_4bit (8192, 28672)`` 896 MiB + its bf16
    cast 448 MiB; ``benchmarks/envelope_ranges.py`` llama/qlora/nockpt/eager/fp32 -2.07 % without it).
    """
    # under autocast it is left out: on the narrow layer of tests/test_qlora_unrecomputed_base.py the moment is
    # 1888 B per token over the trace at 1 x 64 (not resolved), and the autocast rows are within without it
    # (benchmarks/envelope_ranges.py llama/qwen2/mistral qlora/nockpt autocast: -0.02 .. +0.29 %)
    traced = _layer_traced(spec) and not spec.activations.checkpointing and not _amp(spec)
    base = base_backward(spec, r) if traced else None
    if base is None:
        return None
    # every layer's saved tensors are held, the bottom layer's fewer (layer_saved.first_layer_unsaved: 16·h + 4 B
    # per token on CPU; the narrow layer of tests/test_qlora_unrecomputed_base.py: exact with it, that much over)
    return base - first_layer_unsaved(spec) * spec.batch.micro_batch * spec.batch.seq_len


def mlp_work_tokens(spec: TrainingSpec, e: int, r: int) -> int:
    """Bytes per token of the MLP backward after the recompute: r·h + 3·e·I less down_proj's adapter tensors."""
    inter = spec.model.shape.intermediate_size
    return r * spec.model.shape.hidden_size + 3 * _mlp_bytes(spec, e) * inter - down_adapter_saved(spec)


def adapter_casts(spec: TrainingSpec) -> int:
    """Autocast's 16-bit casts of one layer's adapter weights (saved by their linears), 0 without autocast."""
    if not _amp(spec):
        return 0
    return 2 * lora_layer_params(spec) // max(1, spec.model.shape.num_layers)


def layer_grads(spec: TrainingSpec) -> tuple[int, int]:
    """(adapter gradient bytes of one decoder layer, of its down_proj adapter alone)."""
    from fitcheck.core.states import plan_lora

    layers = max(1, spec.model.shape.num_layers)
    per_layer = [t for t in plan_lora(spec).targets if t.entry.per_layer]
    total = sum(t.params for t in per_layer) // layers
    down = sum(t.params for t in per_layer if t.entry.module == _DOWN) // layers
    return _ADAPTER_BYTES * total, _ADAPTER_BYTES * down


def top_layer_forward_tokens(spec: TrainingSpec) -> int:
    """Bytes per token alive inside the top checkpointed layer's no-grad forward besides every checkpoint, at
    up_proj's LoRA sum, for fp32 activations (fp32 model, or k-bit-prepared QLoRA without autocast) with LoRA
    dropout; 0 elsewhere (not traced).

    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (transformers 5.23 ``LlamaMLP``) under ``no_grad``: act(gate)
    is alive while up_proj's peft ``Linear.forward`` adds ``lora_B(lora_A(dropout(x))) * scaling`` to its base
    result, so act(gate), the base result, the scaled branch and their sum (4·I each) and the norm output x (4·h)
    are alive. It is the end-of-forward peak where it exceeds the logits: a wide layer over a small vocabulary
    (trace: Llama-2-70B, LoRA and QLoRA, fp32, checkpointing, 4 x 960 and 6 x 960: 16·I + 4·h per token above the
    checkpoints, -6.44 % at end of forward without it, ``benchmarks/pinned_probes.py`` seed 1).
    """
    lora = spec.lora
    if lora is None or _amp(spec) or lora.use_dora or (spec.quant is not None and not _kbit_fp32(spec)):
        return 0
    fp32 = spec.precision.load_dtype is Dtype.FLOAT32 or _kbit_fp32(spec)
    sh = spec.model.shape
    if not _targets(spec) & {*_MLP_IN, _DOWN}:
        # no adapter in the MLP (peft's default q/v targets): at ``act(gate) * up``, act(gate), up's output and
        # the product (4·I each) and x (4·h); separate gate/up linears only (the traced layer). Probe Llama-2-70b
        # QLoRA +qv bf16 (k-bit prepared: fp32), 3 x 2304 (seed 2202): -2.90 % at end of forward without it
        traced = _layer_traced(spec, down_wrapped=False) and not sh.traits.fused_projections
        every = spec.activations.checkpointing and spec.activations.checkpoint_every_n_layers == 1
        return 12 * sh.intermediate_size + 4 * sh.hidden_size if fp32 and traced and every else 0
    if not lora_recompute_applies(spec) or lora.dropout == 0:
        return 0
    if not fp32 and spec.quant is None and spec.precision.load_dtype.nbytes == 2:
        # a 16-bit model, fp32 adapters: down_proj's peft ``Linear.forward`` casts its 16-bit input (the product,
        # 2·I, alive) to fp32 for lora_A (4·I, ``_cast_input_dtype``) and drops it out (the mask:
        # ``lora_dropout_mask_bytes``, and the output, 4·I), its bf16 base output made (2·h): per token above the
        # checkpoints, read off the trace's listing at that ``mul`` (Llama-2-70b LoRA bf16 ckpt, 1 x 3776 and
        # 2 x 2048: 12 B/token under it). Probe Llama-2-70b r32 1 x 3776 (seed 2205): -4.62 % at end of forward
        # without it (a wide MLP over a 32000 vocabulary; a 128k vocabulary's logits stay above it)
        return (10 + lora_dropout_mask_bytes(spec)) * sh.intermediate_size + 2 * sh.hidden_size
    if "up_proj" not in _targets(spec):
        return 0
    return 16 * sh.intermediate_size + 4 * sh.hidden_size if fp32 else 0

