"""QLoRA whose MLP has no adapters (peft's default targets, q and v): its backward in the recomputed layer; pure.

With ``LoraConfig()``'s default targets (peft 0.21.2 ``utils/constants.py``
``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``: ``["q_proj", "v_proj"]`` for llama, mistral, qwen2, ...)
the MLP's three linears are bare ``bnb.nn.Linear4bit`` layers. None of them saves a tensor for backward
(``Linear4bit.forward``: ``x.to(compute_dtype)``, ``matmul_4bit``, ``.to(inp_dtype)``; ``MatMul4Bit.forward``:
``ctx.tensors = (None, B)``, an attribute, not ``save_for_backward``; bitsandbytes 0.50.2 ``nn/modules.py`` and
``autograd/_functions.py``), so under non-reentrant checkpointing (torch 2.13 ``torch/utils/checkpoint.py``:
the recompute runs at the first unpack of a saved tensor) down_proj's backward runs before the layer is
recomputed, and the first unpack is the gated product's (``act_fn(gate) * up``, transformers 5.23
``LlamaMLP.forward``). After that product's backward has freed ``act(gate)`` and ``up``, up_proj's
``MatMul4Bit.backward`` runs ``torch.matmul(grad_output, F.dequantize_4bit(B, ctx.state).to(grad_output.dtype))``
on the recomputed layer: the whole I x h weight dequantized in the dtype it was loaded in (``quant_state.dtype``)
and its cast to the compute dtype are alive together, with the recomputed layer's saved tensors, the gate output
``silu`` still needs (f·I), the gradient of ``act(gate)`` waiting (f·I), the compute-dtype cast of up's output
gradient (c·I) and the residual-stream gradient (r·h), every checkpoint held.

At short sequences that weight (fp32 load: 6·I·h bytes, 336 MiB at Llama-3.1-8B) is the phase's peak, which the
per-token working set (``qlora.qlora_backward_working_set``) missed: fake-tensor trace of Llama-3.1-8B, fp32,
checkpointing, q/v adapters, 1 x 512, peak during backward at up_proj's ``_to_copy`` of the
``dequantize_4bit`` (14336, 4096) fp32 temporary (224 + 112 MiB), -29.5 % before this term.
"""

from __future__ import annotations

from fitcheck.core.activations.backward_grads import grads_unmade
from fitcheck.core.activations.qlora import matmul4bit_backward_weight, qlora_formula_applies
from fitcheck.spec import TrainingSpec

_MLP = ("gate_proj", "up_proj", "down_proj")


def bare_mlp(spec: TrainingSpec) -> bool:
    """k-bit-prepared QLoRA (``qlora.qlora_formula_applies``) with no adapter on the gated MLP's linears."""
    lora = spec.lora
    return (lora is not None and qlora_formula_applies(spec) and spec.model.shape.mlp_activation == "swiglu"
            and "all-linear" not in lora.target_modules and not set(_MLP) & set(lora.target_modules))


def bare_mlp_backward(spec: TrainingSpec) -> int | None:
    """Bytes alive at the worst moment of the top recomputed layer's MLP backward beyond its saved tensors and
    every checkpoint, less the gradients not made yet (the top layer's MLP runs before any adapter's backward:
    ``backward.grads_unmade``); None where :func:`bare_mlp` does not hold.

    Two moments, per token against the saved layer (whose MLP part is gate, ``act(gate)`` and up, f·I each; f = r
    = 4: fp32 activations after k-bit preparation, Linear4bit casts its output back to the fp32 input's dtype),
    both with the residual-stream gradient (+r·h), the top layer's checkpoint counted once (its first norm saves
    it as its fp32 input: -4·h) and the final norm's saved fp32 input and rsqrt freed (-(4·h + 4)):

    - the gated product's backward (``MulBackward0``): its input gradient, Linear4bit's fp32 cast back of down's
      ``MatMul4Bit`` output (f·I), and its two outputs, the gradients of ``act(gate)`` and up (2·f·I), with gate,
      ``act(gate)`` and up still saved (trace Llama-3.1-70B, q/v adapters, fp32, 1 x 4096: six (4096, 28672)
      fp32 tensors at the peak; -2.2 % at 70B width from 4k tokens with the all-linear working set's 8·I);
    - up_proj's ``MatMul4Bit`` backward: ``act(gate)`` and up freed (-2·f·I), the gradient of ``act(gate)``
      (+f·I), the compute-dtype cast of up's output gradient (+c·I), and the dequantized weight:
      ``dequantize_4bit`` in the load dtype and its cast (l·I·h + c·I·h; once the load-dtype copy is freed the
      matmul's h-wide output is made: c·I·h + c·h per token, the larger of the two). With l == c the cast is a
      no-op (``Tensor.to`` returns self).
    """
    quant = spec.quant
    if quant is None or not bare_mlp(spec):
        return None
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    bs = spec.batch.micro_batch * spec.batch.seq_len
    f = r = 4
    comp, weight, copy = matmul4bit_backward_weight(spec, inter, h)
    shared = 4 * h  # the first norm saves its fp32 input, the top layer's checkpoint: counted in both
    final_norm = 4 * h + 4  # its fp32 input and rsqrt, freed by its backward before the top layer's
    common = (r * h - shared - final_norm) * bs - grads_unmade(spec)
    product = 3 * f * inter * bs
    dequantized = copy + weight
    up = (comp - f) * inter * bs + max(dequantized, weight + comp * h * bs)
    return common + max(product, up)
