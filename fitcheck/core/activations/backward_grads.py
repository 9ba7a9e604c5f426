"""The gradients and weight casts the moments of backward count (``fitcheck.core.activations.backward``): one
layer's gradient and weight casts, the head's and the embedding's gradients, every gradient a backward makes, and the
temporaries of a trained embedding's backward (CUDA ``embedding_dense_backward``, a tied embedding's second and
third gradient-sized tensors). Pure, no torch; split out of ``backward.py`` unchanged.
"""

from __future__ import annotations

import math

from fitcheck.report import Phase
from fitcheck.spec import DeviceType, Kind, ParamEntry, Role, TrainingSpec


def text_layer(p: ParamEntry) -> bool:
    """A per-layer parameter of the language model (a vision-language model's vision blocks are per-layer too)."""
    return p.per_layer and "visual" not in p.name and "vision" not in p.name


def trainable_full(spec: TrainingSpec) -> bool:
    """A full fine-tune: no adapters, no quantized base, nothing frozen."""
    return spec.lora is None and spec.quant is None and spec.freeze is None


def param_bytes(spec: TrainingSpec) -> int:
    """Bytes of an element of the parameters as loaded (their gradients in a full fine-tune)."""
    return spec.precision.load_dtype.nbytes


def layer_bytes(spec: TrainingSpec) -> int:
    """Bytes of one decoder layer's parameters in the load dtype (its gradients when it trains)."""
    return sum(p.numel_each for p in spec.model.params if text_layer(p)) * param_bytes(spec)


def layer_grad(spec: TrainingSpec) -> int:
    """Gradient bytes of one decoder layer in a full fine-tune, 0 otherwise."""
    if not trainable_full(spec):
        return 0
    return layer_bytes(spec)


def down_proj_numel(spec: TrainingSpec) -> int:
    """Elements of one layer's MLP output projection (the first weight gradient of a layer's backward)."""
    sh = spec.model.shape
    return sh.intermediate_size * sh.hidden_size


def head_and_embedding(spec: TrainingSpec) -> tuple[int, int]:
    """(LM head weight gradient bytes, untied embedding gradient bytes) of a full fine-tune."""
    if not trainable_full(spec):
        return 0, 0
    nbytes = param_bytes(spec)
    emb = sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING) * nbytes
    head = sum(p.numel for p in spec.model.params if p.role is Role.LM_HEAD) * nbytes
    if spec.model.shape.tied_embeddings:
        return emb, 0  # the head's backward produces the shared tensor's gradient
    return head, emb


def full_cast(spec: TrainingSpec) -> int:
    """bf16 casts of one layer's linear weights, every one of them."""
    kinds = (Kind.LINEAR, Kind.FUSED_EXPERTS)
    return 2 * sum(p.numel_each for p in spec.model.params if p.per_layer and p.kind in kinds)


def casts_after_attention(spec: TrainingSpec) -> int:
    """16-bit casts of one layer's linears that run after its attention softmax, o_proj and the MLP (+2 B/param):
    not made yet at the top layer's eager softmax (``decoder``'s end-of-forward moment)."""
    later = ("o_proj", "gate_proj", "up_proj", "gate_up_proj", "down_proj")
    return 2 * sum(p.numel_each for p in spec.model.params if text_layer(p) and p.kind is Kind.LINEAR
                   and p.module in later)


def layer_cast(spec: TrainingSpec) -> int:
    """bf16 casts autocast makes of one layer's linear weights (+2 B/param, fitcheck.core.activations.decoder).

    A 4-bit base makes none: ``bnb.nn.Linear4bit`` runs ``MatMul4Bit`` (no autocast op), which dequantizes
    into a temporary and saves only the packed weight (bitsandbytes 0.50.2 autograd/_functions.py
    ``MatMul4Bit.forward``: ``ctx.tensors = (None, B)``); only the LoRA weights' casts are held.
    """
    from fitcheck.core.activations.qlora import four_bit_lora, lora_layer_params

    quant = spec.quant
    int8 = quant is not None and quant.bits == 8 and quant.method == "bitsandbytes" and spec.lora is not None
    if four_bit_lora(spec) or int8:  # 8-bit: F.linear casts the dequantized temporary, never cached (int8.py)
        from fitcheck.core.kernels import fsdp_adapters_16bit

        if fsdp_adapters_16bit(spec):  # the adapters compute from FSDP's 16-bit copies: nothing cast
            return 0
        return 2 * lora_layer_params(spec) // max(1, spec.model.shape.num_layers)
    kinds = (Kind.LINEAR, Kind.FUSED_EXPERTS)
    return 2 * sum(p.numel_each for p in spec.model.params if text_layer(p) and p.kind in kinds)


def adapter_casts_held(spec: TrainingSpec) -> tuple[int, int, int]:
    """LoRA on a 16-bit or fp32 base under autocast, no checkpointing: the bf16 casts of the fp32 adapters that
    saved tensors hold into backward, (one layer's, layer 0's q/k/v ``lora_A`` casts that nothing saves, one
    layer's down_proj adapter casts); (0, 0, 0) elsewhere.

    Autocast caches the 16-bit cast of each fp32 leaf needing a gradient (torch 2.13 ``autocast_mode.cpp``
    ``cached_cast``); leaving the autocast context clears the cache, but each adapter's ``F.linear`` saved its
    weight's cast for its backward, so a layer's casts live until that layer's backward (the start-of-backward
    component, ``decoder._autocast_cache_phases``, counts them; layer 0's q/k/v input needs no gradient, so its
    ``lora_A`` casts are not saved). The top layer's MLP backward comes after its down_proj's, whose casts are
    freed. A 4-bit / 8-bit base counts them in :func:`layer_cast`; DoRA's magnitude is never cast; under FSDP mixed
    precision the adapters compute from FSDP's 16-bit copies (``kernels.fsdp_adapters_16bit``): none. Probe
    (``benchmarks/pinned_probes.py`` seed 2202) Phi-4-mini LoRA r32 bf16 under bf16 autocast, 1 x 576: -2.27 %
    during backward without them (Llama-3.1-8B r64: -5.0 %).
    """
    from fitcheck.core.kernels import fsdp_adapters_16bit
    from fitcheck.core.states import plan_lora
    from fitcheck.spec import MixedPrecision

    lora = spec.lora
    if (lora is None or spec.quant is not None or spec.activations.checkpointing
            or spec.precision.mixed_precision is MixedPrecision.NO or fsdp_adapters_16bit(spec)):
        return 0, 0, 0
    per_layer = [t for t in plan_lora(spec).targets if t.entry.per_layer and not t.via_param_wrapper]
    layers = max(1, spec.model.shape.num_layers)
    each = {t.entry.module: (math.prod(t.lora_a_shape), math.prod(t.lora_b_shape), t.layers) for t in per_layer}
    one = 2 * sum((a + b) * n for a, b, n in each.values()) // layers
    first = 2 * sum(a for m, (a, _, _) in each.items() if m in ("q_proj", "k_proj", "v_proj", "qkv_proj"))
    down = 2 * sum((a + b) * n for m, (a, b, n) in each.items() if m == "down_proj") // layers
    return one, first, down


def cuda_embedding_backward(spec: TrainingSpec) -> int:
    """Temporaries of CUDA ``embedding_dense_backward`` (two-pass path) for a trained input embedding."""
    if spec.hardware.device_type is DeviceType.CPU or not trainable_full(spec):
        return 0
    sh = spec.model.shape
    n = spec.batch.micro_batch * spec.batch.seq_len
    segments = min(n, sh.vocab_size)
    partial = n // 10 + segments  # NROWS_PER_THREAD = 10 (EmbeddingBackwardKernel.cu: max_partial_segment)
    # fp32 (opmath) partial sums + sorted/orig indices, segment_offsets, partials_per_segment(+offset),
    # partial_segment_offset (int64): Embedding.cu + EmbeddingBackwardKernel.cu
    return 4 * partial * sh.hidden_size + 8 * (3 * n + 2 * segments + partial)


def tied_embedding_backward(spec: TrainingSpec) -> int:
    """Two more gradient-sized tensors at a trained tied embedding's backward (full fine-tune), 0 otherwise.

    The LM head's weight gradient waits in the autograd engine's input buffer of the shared weight's
    AccumulateGrad node (counted as that weight's gradient); the embedding's backward makes a second
    ``vocab x hidden`` gradient and the buffer adds the two into a third (fake-tensor traces: Llama-3.2-1B,
    gemma-7b and granite-3.3-8b-instruct, 2 x the embedding's gradient bytes above the formula before this term,
    at the end of backward). The embedding output's gradient is freed by then: ``backward_moments`` takes the
    larger of the embedding's backward (that gradient + one new tensor) and the sum (two tensors; traces:
    Phi-4-mini 3 x 3712 and Qwen3-1.7B 6 x 1280, b·s·h below the old sum of the three); so does a partial fine-tune
    training the shared tensor (trace Phi-4-mini freeze fp32 ckpt 2 x 640: -99.7 % without)."""
    if not spec.model.shape.tied_embeddings:
        return 0
    g_head, _ = head_and_embedding(spec)  # tied: the shared tensor's gradient bytes (0 unless a full fine-tune)
    from fitcheck.core.activations.freeze import frozen_layers

    if (frozen := frozen_layers(spec)) is not None and frozen.embedding_trained:  # partial training of it
        g_head = sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING) * param_bytes(spec)
    return 2 * g_head


def grads_unmade(spec: TrainingSpec) -> int:
    """Gradient bytes not made yet before the top layer's first gradient (every one; 0 in a later micro-step, whose
    gradients exist from its start: ``core/states/accumulation.py``): what a top-layer recompute moment subtracts
    from ``model_states``' gradients."""
    from fitcheck.core.states import gradients_held_from_start

    return 0 if gradients_held_from_start(spec) else all_grads(spec)


def partial_head_grad(spec: TrainingSpec) -> int:
    """Gradient bytes of a trained LM head in LoRA (``modules_to_save``) or partial training, 0 otherwise: made at
    the head's backward, before the moments that subtract :func:`all_grads`."""
    from fitcheck.core.activations.freeze import frozen_layers

    if spec.lora is None and spec.freeze is None:
        return 0
    frozen = frozen_layers(spec)
    head_trained = spec.lora is not None and "lm_head" in spec.lora.modules_to_save
    if frozen is not None:
        head_trained = frozen.head_trained
    if not head_trained:
        return 0
    nbytes = 4 if spec.lora is not None else param_bytes(spec)  # modules_to_save copies are fp32 (peft)
    # tied: the shared tensor, listed as the embedding (trace Phi-4-mini freeze bf16 6 x 2112: -22.1 % without)
    role = Role.EMBEDDING if spec.model.shape.tied_embeddings and frozen is not None else Role.LM_HEAD
    return nbytes * sum(p.numel for p in spec.model.params if p.role is role)


def all_grads(spec: TrainingSpec) -> int:
    """Gradient bytes the layers, the head and the embedding make in one backward (LoRA / partial training:
    the model states' gradients less a trained head's, made before the moments that subtract this)."""
    g_head, g_emb = head_and_embedding(spec)
    if spec.lora is not None or spec.freeze is not None:
        # LoRA / partial training: at the head's backward no gradient but the head's exists yet (trace "llama
        # qlora": the backward peak at the head holds no gradient); the model states count them all in BACKWARD
        from fitcheck.core.states import model_state_components

        grads = sum(c.at(Phase.BACKWARD) for c in model_state_components(spec) if c.name == "gradients")
        return max(grads - partial_head_grad(spec), 0)
    if not trainable_full(spec):
        return 0
    heads = (Role.EMBEDDING, Role.LM_HEAD)
    other = sum(p.numel for p in spec.model.params if not text_layer(p) and p.role not in heads)
    return spec.model.shape.num_layers * layer_grad(spec) + g_head + g_emb + other * param_bytes(spec)
