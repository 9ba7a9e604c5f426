"""Checkpointed LoRA on GPT-2 / Phi blocks under CUDA autocast: the top layer's worst backward moments (pure).

The Llama-style layer's moments are :mod:`.lora_recompute`'s; these are the same two instants for the LayerNorm
blocks whose MLP is ``fc -> gelu_new -> out`` (transformers 5.23 ``modeling_gpt2.py`` ``GPT2Block`` / ``GPT2MLP``,
``modeling_phi.py`` ``PhiDecoderLayer`` / ``PhiMLP``), read off per-op listings of the live storages at the
during-backward peak of fake-tensor traces (``fitcheck.torch_adapters.tracer`` with CUDA kernels; GPT-2 LoRA
all-linear, fp32 weights, bf16 autocast, 8 x 1024; Phi-2 LoRA all-linear, fp16 weights, bf16 autocast, 4 x 1024).
Under non-reentrant checkpointing the first backward node of the top layer that unpacks a saved tensor re-runs
the layer's forward (torch 2.13 ``torch/utils/checkpoint.py``); the out linear is a peft 0.21.2 ``lora.Linear``
(``tuners/lora/layer.py`` ``Linear.forward``: ``result = self.base_layer(x)``, then
``result + lora_B(lora_A(dropout(x))) * scaling``). Per token, h hidden, I intermediate:

- RECOMPUTE, at the out linear's ``lora_A`` inside the recompute (GPT-2's peak): the layer's saved tensors made so
  far (all but the MLP's residual-dropout mask, made after the out linear), plus the Python locals then alive: the
  LayerNorm output the MLP reads (fp32: CUDA autocast's ``layer_norm`` is on the fp32 list, 4·h), the attention
  branch's output (``attn_output`` / ``attn_outputs``, 16-bit, 2·h), the out linear's base output (16-bit, 2·h),
  the gelu output ``x`` (fp32: ``0.5 * input`` (16-bit) times ``1 + tanh`` (fp32), 4·I) and with LoRA dropout the
  fp32 dropout output ``lora_A`` is casting (4·I; without dropout the moment is ``lora_B(...) * scaling``: lora_B's
  output and its scaled copy, 2·h each);
- GELU BACKWARD, after the out linear's backward (Phi-2's peak): the out linear's saved tensors and weight cast
  freed, and its input gradient in flight as three fp32 (b, s, I) tensors: the base matmul's and ``lora_A``'s input
  gradients, each cast back from 16 bits by autocast's ``ToCopyBackward``, and their sum (12·I).

Both also hold the gradient of the layer output (fp32 residual stream: 4·h) and its 16-bit cast for the MLP
branch's add (2·h), the layer's weight casts and its adapters' casts. Applies where the residual stream is fp32
(fp32 weights, or 16-bit weights under the other 16-bit autocast dtype) and the out linear carries an adapter.
"""

from __future__ import annotations

from fitcheck.core.activations.activation_mode import activation_mode, adapter_input_bytes
from fitcheck.core.activations.backward_grads import layer_cast
from fitcheck.core.activations.layernorm_blocks import layernorm_recompute_applies
from fitcheck.core.activations.layernorm_outside import layernorm_ckpt_outside, layernorm_top_residual
from fitcheck.spec import LayerRecipe, TrainingSpec

_ADAPTER_BYTES = 4  # peft's adapters are fp32 (core/states/lora.py)


def layernorm_recompute_moments(spec: TrainingSpec, shared: int) -> tuple[int, int, int, int] | None:
    """(recompute bytes, gelu-backward bytes, one layer's adapter gradient bytes, its out linear's) in the shape of
    ``backward._lora_recompute``: each moment's bytes beyond ``backward_moments``' ``live`` (checkpoints, the
    recomputed layer's saved tensors less ``shared`` per token, the layer's weight casts less the out linear's).

    Args:
        spec: The step's spec.
        shared: Bytes per token ``live`` already took off the layer's saved tensors (the checkpoint input an fp32
            model's first norm saves itself).

    Returns:
        The four byte counts, or None where :func:`layernorm_recompute_applies` is false.
    """
    if not layernorm_recompute_applies(spec):
        return None
    lora = spec.lora
    assert lora is not None
    sh = spec.model.shape
    h, inter, bs = sh.hidden_size, sh.intermediate_size, spec.batch.micro_batch * spec.batch.seq_len
    res = layernorm_top_residual(spec)
    layers = max(1, sh.num_layers)
    dm = 1  # CUDA native_dropout's bool mask
    drop = lora.dropout > 0
    # the recipe counts one residual-stream tensor per layer that the recomputed layer does not add: GPT-2's own
    # input (the checkpoint; its ln_1 saves that storage), Phi's output (the next layer's input)
    own = res * h - shared
    not_yet = dm * h if sh.traits.dropout.hidden > 0 else 0  # the MLP's residual-dropout mask
    in_flight = res * h + 2 * h  # the layer output's gradient and its 16-bit cast (AddBackward)
    adapter_casts = 2 * _layer_adapter_params(spec) // layers if spec.precision.mixed_precision.value != "no" else 0
    promoted = layernorm_promoted_checkpoints(spec) // bs
    # the adapter's own moment: with dropout at lora_A, the fp32 dropout output it casts (4·I); without, at
    # ``lora_B(...) * scaling``, lora_B's 16-bit output and its scaled copy (2·h each; trace gpt2-medium 1 x 512)
    locals_ = 4 * h + 2 * h + 2 * h + 4 * inter + max(4 * inter if drop else 0, 4 * h)
    outside = layernorm_ckpt_outside(spec) + promoted
    # 16-bit weights under the other autocast dtype: ``backward_moments`` counts weight casts only over fp32
    # weights (``ActivationMode.autocast``), but autocast casts fp16 weights to bf16 too (trace: the layer's
    # ``_to_copy`` (out, in) bf16 casts alive at both moments, the out linear's freed at the second)
    weights = layer_cast(spec) if not activation_mode(spec).autocast else 0
    out_weight = 2 * inter * h if weights else 0
    recompute = (locals_ + in_flight - not_yet - own + outside) * bs + adapter_casts + weights
    mode_bytes = adapter_input_bytes(activation_mode(spec), lora, inter)  # the out linear's saved input, freed by then
    # at the gelu backward GPT-2's sequential block has consumed the MLP branch's 16-bit gradient (its out linear's
    # backward read it); Phi's parallel block keeps it for the attention branch, not run yet
    kept_cast = 2 * h if sh.traits.recipe is LayerRecipe.PHI_PARALLEL else 0
    out_casts = 2 * lora.r * (inter + h) if adapter_casts else 0  # the out linear's adapter casts, freed
    gelu_back = (12 * inter + res * h + kept_cast - not_yet - own - mode_bytes + outside) * bs
    gelu_back += adapter_casts - out_casts + weights - out_weight
    g_out = _ADAPTER_BYTES * lora.r * (inter + h)  # lora_A (r, I) and lora_B (h, r)
    return recompute, gelu_back, _ADAPTER_BYTES * _layer_adapter_params(spec) // layers, g_out


def _layer_adapter_params(spec: TrainingSpec) -> int:
    from fitcheck.core.states import plan_lora

    return sum(t.params for t in plan_lora(spec).targets if t.entry.per_layer)



def layernorm_promoted_checkpoints(spec: TrainingSpec) -> int:
    """Bytes the checkpoints above layer 0 hold beyond ``BackwardInputs.ckpt_input`` each: in an fp32 residual
    stream where the formula's residual bytes are 16-bit (Phi-2's fp16 weights under bf16 autocast). Alive at the
    top layer's moments, freed by the bottom layer's (``backward_moments`` takes them off there)."""
    return _promoted(spec)


def layernorm_bottom_layer_less(spec: TrainingSpec) -> int:
    """What the bottom layer's moments hold less than the top layer's beyond the checkpoints ``backward_moments``
    counts: the fp32 checkpoints above (:func:`layernorm_promoted_checkpoints`), less the layer-0 output gradient's
    cast to the 16-bit residual (the fp16 embedding output: AddBackward's ``_to_copy``, 2·h; trace of a 3-layer Phi,
    fp16 weights, bf16 autocast)."""
    promoted = _promoted(spec)
    if not promoted:
        return 0
    return promoted - 2 * spec.model.shape.hidden_size * spec.batch.micro_batch * spec.batch.seq_len


def _promoted(spec: TrainingSpec) -> int:
    if not layernorm_recompute_applies(spec):
        return 0
    sh = spec.model.shape
    extra = layernorm_top_residual(spec) - activation_mode(spec).r
    return max(0, sh.num_layers - 1) * extra * sh.hidden_size * spec.batch.micro_batch * spec.batch.seq_len
