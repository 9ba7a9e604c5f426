"""A full fine-tune's post-attention RMSNorm backward: a layer moment after its MLP's gradients exist; pure.

In a checkpointed 16-bit full fine-tune, a layer's backward runs its MLP, then its post-attention norm
(transformers 5.23 ``LlamaRMSNorm.forward``: ``hidden_states.to(torch.float32)``, ``pow(2).mean(-1)``,
``hidden_states * torch.rsqrt(variance + eps)``, ``self.weight * hidden_states.to(input_dtype)``), then o_proj and
the attention. At the norm's backward the MLP's saved tensors are freed but its three weight gradients and the
norm weight's exist, and the fp32 chain rule of the norm holds five fp32 h-wide temporaries at once
(per-op listing of a fake-tensor trace, Llama-2-70B, bf16, checkpointing, 4 x 960, the bottom layer: ``mul``
(grad·rsqrt), ``div`` (the mean's backward), ``pow(x, 1)``, ``* 2`` and ``* grad``) beside its saved fp32 input,
the residual-stream gradient and everything the layer saved up to its attention. Over a small vocabulary with wide
layers (Llama-2-70B: I = 28672, V = 32000) this is the phase's peak: 4 x 960 was -27.1 % during backward without
it (``benchmarks/pinned_probes.py`` seed 114; a full 80-layer trace agrees). Traced for 16-bit weights without
autocast only; elsewhere the moment is not added.

The same fp32 chain rule is the last op of a trained layer's backward (its input norm): in a layer-granular partial
fine-tune without checkpointing, the frozen layers below still hold what they saved, and that moment is the
phase's peak (``frozen_input_norm_backward``).
"""

from __future__ import annotations

from fitcheck.spec import MixedPrecision, NormKind, NormPlacement, TrainingSpec

_AFTER_NORM = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", "post_attention_layernorm")
RMS_BACKWARD_TEMPS = 5  # fp32 h-wide temporaries of the RMSNorm backward at its worst op (trace above)
_TEMPS = RMS_BACKWARD_TEMPS


def post_norm_applies(spec: TrainingSpec) -> bool:
    """A checkpointed 16-bit full fine-tune without autocast of a pre-norm RMSNorm decoder with a gated MLP, or a
    layer-granular partial fine-tune of one without checkpointing (its trained layers: trace of Meta-Llama-3-70B
    narrowed to h 1024, I 3584, 4 layers, top one trained, bf16, 8 x 64: the phase's peak, -2.7 % without it;
    ``tests/test_freeze_backward_moments.py``)."""
    from fitcheck.core.activations.freeze import layer_granular

    sh, act = spec.model.shape, spec.activations
    t = sh.traits
    full = spec.lora is None and spec.quant is None and spec.freeze is None and act.checkpointing
    granular = layer_granular(spec) and not act.checkpointing and act.attn_implementation.value == "sdpa"
    return ((full or granular)
            and act.checkpoint_every_n_layers == 1 and spec.precision.load_dtype.is_half
            and spec.precision.mixed_precision is MixedPrecision.NO and t.norm_kind is NormKind.RMS
            and t.norm_placement is NormPlacement.PRE and sh.mlp_activation == "swiglu" and not sh.num_experts
            and t.vision is None)


def post_norm_backward(spec: TrainingSpec) -> tuple[int, int] | None:
    """(bytes alive beyond a layer's ``live`` set of ``backward.backward_moments``, gradient bytes that layer has
    made) at its post-attention norm's backward; None where :func:`post_norm_applies` does not hold.

    What the layer saves after its attention's output (the post norm and the MLP, ``layer_saved``) is freed by
    then, but for the norm's fp32 input.
    """
    from fitcheck.core.activations.layer_saved import full_saved_after_attention

    if not post_norm_applies(spec):
        return None
    r = spec.precision.load_dtype.nbytes
    made = sum(p.numel_each for p in spec.model.params if p.per_layer and p.module in _AFTER_NORM) * r
    return _norm_tokens(spec, full_saved_after_attention(spec)), made


def _norm_tokens(spec: TrainingSpec, after: int) -> int:
    """Bytes beyond the layer's saved set at the norm's backward: its fp32 input, the temporaries, the residual
    gradient, less what the layer saved after its attention (``after`` per token)."""
    h, r = spec.model.shape.hidden_size, spec.precision.load_dtype.nbytes
    return (4 * h + _TEMPS * 4 * h + r * h - after) * spec.batch.micro_batch * spec.batch.seq_len


def frozen_input_norm_backward(spec: TrainingSpec, static: int, trained_layer: int, all_grads: int) -> int | None:
    """Bytes beyond every gradient at the input norm's backward of the top trained layer of a layer-granular
    partial fine-tune (16-bit weights, no autocast, no checkpointing); None elsewhere.

    It is the last op of that layer's backward: its saved tensors are freed but for the norm's fp32 input, every
    weight gradient of it (and of the trained layers above, and the head's) is made, and the norm's fp32 chain rule
    holds the five h-wide temporaries of ``post_norm_backward`` beside the residual gradient, while every layer
    below a gradient flows through still holds what it saved (a frozen one: what its input gradient needs,
    ``freeze.py``). Trace (fake tensors, Meta-Llama-3-70B widths, 4 layers, top one trained, bf16, no
    checkpointing, 2 x 1280): the phase's peak is this op (``mul``, 5 x 80 MiB fp32 alive), 528.6 MiB beyond the
    model states; the frozen layer's MLP backward moment below it gave 468.5 MiB (-11.35 %,
    ``benchmarks/pinned_probes.py``'s recorded miss of llama/freeze/nockpt/sdpa/bf16); this sum gives 528.6.

    Args:
        spec: The run.
        static: Saved bytes outside the layers that outlive the final norm's backward (``backward._static_outside``).
        trained_layer: Saved bytes of one trained layer (``backward.BackwardInputs.layer``).
        all_grads: Gradient bytes the model states count that the layers and the embedding make
            (``backward_grads.all_grads``).
    """
    from fitcheck.core.activations.freeze import frozen_layers
    from fitcheck.core.activations.layer_saved import layer_saved_per_token
    from fitcheck.core.states import gradients_held_from_start

    sh, t, fz = spec.model.shape, spec.model.shape.traits, spec.freeze
    frozen = frozen_layers(spec)
    if (frozen is None or fz is None or fz.trainable_layers is None or spec.activations.checkpointing
            or not spec.precision.load_dtype.is_half or spec.precision.mixed_precision is not MixedPrecision.NO
            or t.norm_kind is not NormKind.RMS or t.norm_placement is not NormPlacement.PRE
            or sh.mlp_activation != "swiglu" or sh.num_experts or t.vision is not None
            or spec.activations.attn_implementation.value != "sdpa" or gradients_held_from_start(spec)):
        return None
    trained = {i for i in fz.trainable_layers if 0 <= i < sh.num_layers}
    if not trained:
        return None
    top = max(trained)
    below = range(frozen.no_grad, top)
    n_trained = sum(1 for i in below if i in trained)
    bs = spec.batch.micro_batch * spec.batch.seq_len
    per_token, s2 = layer_saved_per_token(spec, trainable=False)
    frozen_layer = per_token * bs + s2 * bs * spec.batch.seq_len
    live = static + (len(below) - n_trained) * frozen_layer + n_trained * trained_layer
    own = sum(p.numel_each for p in spec.model.params if p.per_layer) * spec.precision.load_dtype.nbytes
    made = own * sum(1 for i in trained if i >= top)
    return live + _norm_tokens(spec, 0) - max(all_grads - made, 0)


def frozen_final_norm_backward(spec: TrainingSpec, kept: int, all_grads: int) -> int | None:
    """Bytes beyond every gradient at the final RMSNorm's backward of a layer-granular partial fine-tune (the
    moment's conditions as ``frozen_input_norm_backward``); None elsewhere.

    Only the head's weight gradient exists; everything forward saved is alive but two 16-bit h-wide tensors the
    backward has released by then (the norm's output, the head's input, and its normalised 16-bit input, which
    ``weight * hidden_states.to(input_dtype)`` saved for the weight gradient, made by now), and the norm's fp32 chain
    rule holds its five h-wide temporaries (its fp32 input is saved already). Trace (fake
    tensors, Meta-Llama-3-70B narrowed to h 1024, I 3584, a 4000-token vocabulary, 4 layers, top one trained, bf16,
    3 x 640): the phase's peak, 291.7 MiB beyond the model states; the top layer's MLP moment gave 283.7 (-2.7 %).

    Args:
        spec: The run.
        kept: Everything saved at the end of forward (``backward.BackwardInputs.kept``).
        all_grads: Gradient bytes the layers and the embedding make (``backward_grads.all_grads``: the head's excluded).
    """
    if frozen_input_norm_backward(spec, 0, 0, 0) is None:
        return None
    h, e = spec.model.shape.hidden_size, spec.precision.load_dtype.nbytes
    bs = spec.batch.micro_batch * spec.batch.seq_len
    return kept - 2 * e * h * bs + _TEMPS * 4 * h * bs - all_grads
