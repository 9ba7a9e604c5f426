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
"""

from __future__ import annotations

from fitcheck.spec import MixedPrecision, NormKind, NormPlacement, TrainingSpec

_AFTER_NORM = ("gate_proj", "up_proj", "gate_up_proj", "down_proj", "post_attention_layernorm")
_TEMPS = 5  # fp32 h-wide temporaries of the RMSNorm backward at its worst op (trace above)


def post_norm_applies(spec: TrainingSpec) -> bool:
    """A checkpointed 16-bit full fine-tune without autocast of a pre-norm RMSNorm decoder with a gated MLP."""
    sh, act = spec.model.shape, spec.activations
    t = sh.traits
    return (spec.lora is None and spec.quant is None and spec.freeze is None and act.checkpointing
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
    after = full_saved_after_attention(spec)
    h = spec.model.shape.hidden_size
    bs = spec.batch.micro_batch * spec.batch.seq_len
    r = spec.precision.load_dtype.nbytes
    tokens = (4 * h + _TEMPS * 4 * h + r * h - after) * bs  # its fp32 input, the temporaries, the residual gradient
    made = sum(p.numel_each for p in spec.model.params if p.per_layer and p.module in _AFTER_NORM) * r
    return tokens, made
