"""The inputs bitsandbytes <= 0.43.1 keeps in every 4-bit linear of a LoRA step (pure).

bitsandbytes 0.41.0-0.43.1 ``autograd/_functions.py`` ``MatMul4Bit.forward`` ends ``if
any(ctx.needs_input_grad[:2]): ctx.tensors = (A, B)``; its backward never reads A. PR #1270 ("fix QLoRA mem bug:
delete useless buffered activation", merged 2024-07-16, first released in 0.43.2) made it ``(None, B)``, as the
modelled 0.50.2 has it. ``A`` is ``Linear4bit.forward``'s ``x.to(self.compute_dtype)``: the layer input itself when
it already has the compute dtype, else a fresh copy per linear (q, k and v each make their own; so do gate and up).

When each kept tensor lives (torch 2.13 autograd; measured on the real 0.50.2 ``MatMul4Bit`` with that line put
back, ``tests/test_bnb_kept_inputs.py``, ``benchmarks/old_bnb_kept_inputs.py``):

* A ctx attribute is no saved tensor: backward does not release it, so it lives as long as the graph, until the
  loss is dropped (``Trainer.training_step`` returns ``loss.detach()``): at the end of forward, through the whole
  backward, gone before the optimizer step. After a layer's backward its saved tensors go, its kept inputs stay
  (``BackwardInputs.retained``).
* So the forward holds per layer only the kept inputs nothing else holds: a tensor the layer saves anyway costs
  nothing until that layer's backward. Already saved: the attention output SDPA saves (``o_proj`` reads that very
  tensor: transformers 5.23 ``sdpa_attention_forward``'s ``transpose(1, 2).contiguous()`` is a view of the
  kernel's (b, s, heads, d) output), and an input an adapter saves itself (no dropout, and the adapter's input is
  the tensor: peft 0.21.2 ``tuners/lora/bnb.py`` ``Linear4bit.forward`` casts ``x`` to the fp32 adapter weight's
  dtype without autocast; autocast keeps a 16-bit tensor as it is).
* Without checkpointing the first layer's q/k/v input needs no gradient (frozen embeddings, no input-gradient
  hook): no node, nothing kept (0.43.1 ``matmul_4bit`` applies ``MatMul4Bit`` anyway, but ``needs_input_grad`` is
  all False). With checkpointing, transformers 5.23 ``modeling_utils.py`` ``_activation_checkpointing_enable``
  calls ``enable_input_require_grads()`` for every model whose ``main_input_name`` is ``input_ids`` ("PEFT +
  gradient checkpointing + Trainer"), so the first layer keeps them too (trace: the same bytes as every other layer).
* Which checkpointing: transformers 5.23 ``_activation_checkpointing_enable`` defaults to ``{"use_reentrant":
  False}`` (the Trainer passes ``gradient_checkpointing_kwargs``, None by default). peft 0.21.2
  ``prepare_model_for_kbit_training`` alone passes ``gradient_checkpointing_kwargs={}``, and torch 2.13
  ``utils/checkpoint.py`` ``checkpoint`` then warns and runs ``use_reentrant=True``. The spec's ``use_reentrant``
  says which one runs.
* Non-reentrant checkpointing drops only what passes through ``save_for_backward`` (torch/utils/checkpoint.py
  ``_checkpoint_hook``): every kept input of a checkpointed layer stays until the graph is freed; the recomputed
  nodes die at once. Reentrant checkpointing runs forward under ``no_grad`` (no node): only the layer being
  recomputed keeps its inputs, during its own backward.

The same holds for an LLM.int8 base under DeepSpeed's 16-bit module cast (:func:`int8_keeps_inputs`): bitsandbytes
0.50.2 ``MatMul8bitFp.forward`` sets ``ctx.A = A`` and ``MatMul8bitLt.forward`` ``ctx.tensors = (None, subA, A)``,
the input itself (no compute-dtype copy), an attribute that lives until the graph is freed
(``activations/int8.py``). ``int8.py`` models that layer after peft's k-bit preparation (fp32); DeepSpeed undoes the
preparation (``core/kernels/module_cast.py``), so these runs take the 16-bit LoRA recipe plus the kept inputs here.
Real engine (``benchmarks/deepspeed_cpu.py`` ``CASES["int8-lora"]`` / ``["int8-lora-ckpt"]``): the 16-bit recipe
alone was -3.08 % / -5.72 % in backward; the missing bytes were 772.5 / 1286.5 B per token and layer, the kept
inputs 2·(h + I) / 2·(2h + q + I) = 768 / 1280 at h 128, I 256, q 128.
"""

from __future__ import annotations

from fitcheck.core.activations.lora_targets import wrapped_linears
from fitcheck.core.activations.qlora import kbit_upcast
from fitcheck.spec import AttnImpl, LayerRecipe, MixedPrecision, TrainingSpec

_BNB_INPUT_RELEASED = (0, 43, 2)  # bitsandbytes PR #1270: MatMul4Bit no longer keeps its input (module docstring)
_GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
# a linear -> the first linear reading the same tensor (q/k/v, gate/up): the warning's bound counts that input once
SHARED_INPUT = {name: group[0] for group in _GROUPS if len(group) > 1 for name in group}
SOURCE = "bitsandbytes <= 0.43.1 autograd/_functions.py MatMul4Bit.forward: ctx.tensors = (A, B) (PR #1270)"


def old_bnb_4bit(spec: TrainingSpec) -> bool:
    """The stack's bitsandbytes (installed or ``--stack``) is older than 0.43.2 and trains LoRA over its 4-bit base."""
    release = spec.stack.release("bitsandbytes")
    quant = spec.quant
    return (release is not None and release < _BNB_INPUT_RELEASED and quant is not None and quant.bits == 4
            and quant.method == "bitsandbytes" and spec.lora is not None)


def int8_keeps_inputs(spec: TrainingSpec) -> bool:
    """An LLM.int8 base with LoRA under DeepSpeed's 16-bit module cast (``PrecisionSpec.module_cast``, set by the
    view the activations are computed on): its 8-bit linears keep their inputs on the 16-bit LoRA recipe."""
    quant = spec.quant
    return (spec.precision.module_cast and quant is not None and quant.bits == 8 and quant.method == "bitsandbytes"
            and spec.lora is not None)


def kept_inputs_modelled(spec: TrainingSpec) -> bool:
    """:func:`old_bnb_4bit` on the Llama-style decoder layer (q/k/v/o, gate/up/down), LoRA without DoRA."""
    return old_bnb_4bit(spec) and _llama_style(spec)


def inputs_kept(spec: TrainingSpec) -> bool:
    """The bitsandbytes linears of this run keep their inputs on the LoRA recipe: :func:`kept_inputs_modelled`, or
    :func:`int8_keeps_inputs` on the Llama-style layer."""
    return kept_inputs_modelled(spec) or (int8_keeps_inputs(spec) and _llama_style(spec))


def _llama_style(spec: TrainingSpec) -> bool:
    sh = spec.model.shape
    lora = spec.lora
    return (lora is not None and not lora.use_dora and not sh.traits.recipe.layernorm_block
            and sh.traits.recipe is not LayerRecipe.LATENT_MOE and not sh.traits.fused_projections
            and not sh.num_experts)


def _groups(spec: TrainingSpec) -> list[tuple[int, int, bool]]:
    """Per group of linears reading one tensor: (kept bytes per token, bytes nothing else saves, first layer's)."""
    quant, lora, sh = spec.quant, spec.lora, spec.model.shape
    assert quant is not None and lora is not None
    c = quant.compute_dtype.nbytes if quant.compute_dtype is not None else 4  # BitsAndBytesConfig: None -> fp32
    r = 4 if kbit_upcast(spec) else spec.precision.load_dtype.nbytes  # residual stream, norm outputs, MLP product
    if quant.bits == 8:  # MatMul8bitFp / MatMul8bitLt keep the input itself, in its own dtype
        c = r
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    attn_out = 2 if amp else r  # SDPA / eager output in q's dtype (autocast casts q, k, v)
    sdpa = spec.activations.attn_implementation is not AttnImpl.EAGER
    targets = wrapped_linears(lora, tuple(n for g in _GROUPS for n in g))
    out = []
    for names, width, e in ((_GROUPS[0], sh.hidden_size, r), (_GROUPS[1], sh.num_heads * sh.head_dim, attn_out),
                            (_GROUPS[2], sh.hidden_size, r), (_GROUPS[3], sh.intermediate_size, r)):
        if e != c:  # x.to(compute_dtype) copies it once per linear; nothing else holds the copies
            kept = len(names) * c * width
            out.append((kept, kept, names is _GROUPS[0]))
            continue
        # the adapter saves this very tensor: fp32 without autocast (peft casts to its fp32 weight), 16-bit under it;
        # 16-bit adapters (DeepSpeed's module cast) on a 16-bit input cast nothing
        itself = lora.dropout == 0 and any(n in targets for n in names) and (
            (e == 2) == amp or (spec.precision.module_cast and e == spec.precision.load_dtype.nbytes))
        saved = itself or (names is _GROUPS[1] and sdpa)
        out.append((c * width, 0 if saved else c * width, names is _GROUPS[0]))
    return out


def kept_layer_extra(spec: TrainingSpec) -> int:
    """Bytes per token per layer the forward holds beyond 0.43.2 (the kept inputs nothing else saves)."""
    return sum(g[1] for g in _groups(spec)) if inputs_kept(spec) else 0


def kept_layer_inputs(spec: TrainingSpec) -> int:
    """Bytes per token of every kept input of a layer: what a layer keeps after its backward, and what a
    non-reentrant checkpointed layer keeps besides its input."""
    return sum(g[0] for g in _groups(spec)) if inputs_kept(spec) else 0


def kept_first_layer_less(spec: TrainingSpec, *, all_kept: bool) -> int:
    """Bytes per token the first layer keeps less without checkpointing: no node for its q/k/v (their input needs
    no gradient); with checkpointing the embeddings' output requires grad (``enable_input_require_grads``)."""
    if not inputs_kept(spec) or spec.activations.checkpointing:
        return 0
    return sum(g[0 if all_kept else 1] for g in _groups(spec) if g[2])


def kept_through_checkpoint(spec: TrainingSpec) -> bool:
    """Checkpointed layers keep their inputs until the graph is freed: non-reentrant checkpointing only."""
    return inputs_kept(spec) and spec.activations.checkpointing and not spec.activations.use_reentrant
