"""The worst point DURING backward (``Phase.BACKWARD``), beyond every gradient: pure, no torch.

``fitcheck.core.states.model_states`` counts every gradient in ``Phase.BACKWARD``; this module gives what else
is alive at the worst moment of backward, so that the sum equals the traced peak of the backward region
(``fitcheck.torch_adapters.tracer``: from the logits gradient to the end of ``loss.backward()``). The candidates,
read off per-op listings of fake-tensor traces of the transformers 5.23 models (``tests/test_backward_phase.py``
pins them), each written as (live bytes besides states) − (gradients not yet produced):

- HEAD: the LM head's backward. Everything saved by forward is alive, plus the logits gradient cast back to the
  logits dtype (e·b·s·V, the fp32 one just freed), the head's input gradient (e·b·s·h) and its weight gradient.
- LAYER i (no checkpointing): saved activations of layers 0..i, plus the working set of layer i's MLP backward:
  down_proj's input gradient, the gated product's two gradients (3·e·I, minus down_proj's freed input: +2·e·I
  per token), the residual-stream gradient (r·h) and down_proj's weight gradient; the layers above have
  produced their gradients. Under autocast the bf16 weight casts of layers 0..i are still held by saved tensors.
- LAYER i (checkpointing): the checkpointed inputs of layers 0..i, the recomputed layer i (its first norm reads
  the checkpoint input itself in an fp32 model: not counted twice; the recompute re-creates an int64 position
  row, 8·s) and the same working set.
  Both are linear in i, so the worst layer is the top (i = L−1) or the bottom (i = 0) one.
- LAYER i RECOMPUTE (checkpointed LoRA / k-bit QLoRA on the Llama layer): the instant the recompute stops, and
  for a 4-bit base down_proj's ``MatMul4Bit`` backward; none of layer i's adapter gradients exists yet
  (``fitcheck.core.activations.lora_recompute``).
- END: the embedding's backward: the gradient of the embedding output (r·b·s·h). On CUDA
  ``embedding_dense_backward`` also holds fp32 partial sums of (b·s/10 + min(b·s, V)) rows of h and four int64
  index arrays (``aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu``, two-pass path; not traceable on CPU).

With gradient accumulation (micro-step >= 2) every gradient the model states count already exists: nothing is
subtracted (``fitcheck.core.states.gradients_held_from_start``; ZeRO-2's carried partition is ``zero2_held_grads``');
where the later micro-steps add into the ``.grad`` they hold (``fitcheck.core.states.accumulates_in_grad``: not
DeepSpeed ZeRO-2/3, not FSDP with ``sync_each_batch``) the newly computed gradient of the head (and of the
embedding) is a temporary summed into ``.grad`` in place (``torch/csrc/autograd/functions/accumulate_grad.h``).

Gradient clipping (``TrainingArguments.max_grad_norm`` 1.0: ``Trainer._clip_grad_norm`` ->
``accelerate.Accelerator.clip_grad_norm_`` -> ``torch.nn.utils.clip_grad_norm_``) runs after backward, before
``optimizer.step()``: one 0-dim norm per gradient tensor + their ``stack`` + the total, then ``_foreach_mul_`` in
place. Traced: (2n + 1)·e bytes for n gradient tensors (86 B for a 21-tensor bf16 llama), all freed before the
step; on CUDA each 0-dim tensor takes a 512 B allocator block (~(n + 2)·512 B: 150 KB for Llama-3-8B's 291
tensors). That is below any optimizer step's own temporaries, so it adds no component here.

The gradients and weight casts these moments count are :mod:`.backward_grads`' (``grads_unmade`` and
``cuda_embedding_backward`` are re-exported here).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.activations.backward_accum import accumulated_down_proj, accumulated_head_cast
from fitcheck.core.activations.backward_fsdp import fsdp_counted, fsdp_embedding_moment, fsdp_reduce_moments
from fitcheck.core.activations.backward_grads import (
    adapter_casts_held,
    all_grads,
    down_proj_numel,
    full_cast,
    head_and_embedding,
    layer_bytes,
    layer_cast,
    layer_grad,
    param_bytes,
    partial_head_grad,
    tied_embedding_backward,
    trainable_full,
)
from fitcheck.core.activations.backward_grads import (
    cuda_embedding_backward as cuda_embedding_backward,
)
from fitcheck.core.activations.backward_grads import grads_unmade as grads_unmade
from fitcheck.core.activations.backward_zero2 import zero2_head_reduced, zero2_held_grads
from fitcheck.core.activations.bnb_kept_inputs import kept_first_layer_less, kept_layer_inputs, kept_through_checkpoint
from fitcheck.core.activations.freeze import autocast_head_numel, autocast_layer_cast, frozen_missing, layer_trained
from fitcheck.core.activations.fsdp1_reentrant import held_at_layer
from fitcheck.core.activations.int8 import int8_recompute_dequantizes_16bit
from fitcheck.core.activations.lora_recompute import int8_base_backward, layer_grads, unrecomputed_base_backward
from fitcheck.core.activations.moe_expert_loop import expert_loop_backward_work
from fitcheck.core.activations.norm_backward import (
    frozen_final_norm_backward,
    frozen_input_norm_backward,
    post_norm_backward,
)
from fitcheck.core.activations.param_wrapper import param_wrapper_backward
from fitcheck.core.states import (
    accumulates_in_grad,
    fsdp_backward_applies,
    gradients_held_from_start,
    offload_gradient_in_flight,
    zero3_gradient_in_flight,
)
from fitcheck.spec import AttentionKind, NormKind, TrainingSpec

# Saved-for-backward scalars of the loss (trace: ones_like grad seed + the loss, fp32).
_LOSS_SCALARS = 8


@dataclass(frozen=True)
class BackwardInputs:
    """Byte counts of one micro-batch that ``fitcheck.core.activations.decoder`` already derives.

    Attributes:
        layer: Saved bytes of one decoder layer (s² scores included).
        kept: Everything saved at the end of forward (layers + outside), as ``activations.saved``.
        ckpt_input: Bytes of one checkpointed layer input (0 without checkpointing).
        n_ckpt: Number of checkpointed layers.
        e: Element bytes of activations (2 under bf16/autocast, 4 in fp32).
        r: Element bytes of the residual stream.
        autocast: Whether fp32 weights are cast to 16 bits by autocast.
        half_model: Whether the model itself is 16-bit.
        end: What ``activations.saved`` keeps in ``Phase.BACKWARD`` (the embedding-output gradient).
        layers_saved: Saved bytes of all decoder layers together where they differ (partial training by
            layers, ``activations.freeze``); -1 when every layer saves ``layer``.
        offloaded: TRL activation offloading: layers below the one in backward stay in host memory
            (fitcheck/core/kernels/offloading.py), so only layer i's saved tensors are on the device.
        attention_moment: Where the top layer's attention backward is modelled (DeepSeek-V3's CPU math SDPA,
            ``fitcheck.core.activations.mla.mla_attention_backward``): bytes alive then, with the gradients
            produced so far; None elsewhere.
    """

    layer: int
    kept: int
    ckpt_input: int
    n_ckpt: int
    e: int
    r: int
    autocast: bool
    half_model: bool
    end: int
    layers_saved: int = -1
    offloaded: bool = False
    attention_moment: int | None = None  # i12moe: live bytes + produced gradients at an attention backward
    retained: int = 0  # per layer already through backward: what autograd attributes keep (8-bit ctx.A, int8.py)
    # eager attention (eager.eager_moments): bytes at a layer's softmax backward beyond its MLP moment, the
    # gradient bytes a layer made before it, the 4-D mask every checkpointed layer holds
    eager_backward: int | None = None
    eager_made: int = 0
    ckpt_mask: int = 0
    # a 16-bit embedding output below an fp32 residual (activation_mode.ActivationMode.embed16: 16-bit weights under
    # the other 16-bit autocast, or TRL's bf16 embedding over a k-bit prepared model): the rotary tables
    # are 16-bit, the bottom layer's first norm copies its 16-bit input to fp32 (LlamaRMSNorm.forward
    # ``hidden_states.to(torch.float32)``) and keeps its 16-bit normalised input for a trained weight
    # (``self.weight * hidden_states.to(input_dtype)``); first_less: what the bottom layer keeps less than the
    # layers above it (decoder.activation_components)
    promoted: bool = False
    first_less: int = 0
    first_norm_less: int = 0  # what the bottom layer's first norm keeps less for a trained weight (the same)




def backward_moments(spec: TrainingSpec, q: BackwardInputs, head_extra: int,
                     fsdp_moments: bool = True) -> dict[str, int]:
    """Bytes alive besides parameters, optimizer states and ALL gradients, at each candidate moment.

    Args:
        spec: The training spec.
        q: Quantities from ``fitcheck.core.activations.decoder``.
        head_extra: Logits-side bytes alive at the head's backward besides ``kept`` (logits gradient, casts).
        fsdp_moments: Whether an FSDP run's moments hold its gradients as FSDP keeps them
            (``backward_fsdp.fsdp_counted``); False: as the plain run's, which is what a trace of the plain step
            measures (``fsdp_traced.fsdp_traced_backward``).

    Returns:
        Moment name (``head``, ``top layer``, ``bottom layer``, ``embedding``) -> bytes (may be negative: a
        moment when many gradients do not exist yet).
    """
    sh = spec.model.shape
    b, s = spec.batch.micro_batch, spec.batch.seq_len
    bs, h, L = b * s, sh.hidden_size, sh.num_layers
    z2 = zero2_held_grads(spec)  # ZeRO-2: (gradients counted, held at the top layer, held from the bottom layer on)
    # a later micro-step adds into the .grad it holds (core/states/accumulation.py, the one rule): not under ZeRO-2
    # (its carried partition is z2's) or ZeRO-3, whose every backward is a first; ZeRO-1 with overlap_comm holds
    # every .grad and reduces during the boundary micro-step's backward (z2: zero_reduce.zero2_backward_grads)
    accum = accumulates_in_grad(spec)
    # every byte the gradients component counts exists from a later micro-step's start (the .grad, FSDP's reduced
    # shards under sync_each_batch, ZeRO-3's resident buffer): nothing is missing (ZeRO-2's carried partition: z2)
    held = gradients_held_from_start(spec) and (z2 is None or accum)
    if not fsdp_moments and fsdp_backward_applies(spec):  # as the trace of the plain step sees it: the
        # accumulating view (trace_result.accumulating_step) where it adds in place, else a first pass; FSDP1's
        # accumulation is never traced (torch_adapters/run_scope.py accumulation_not_traced): a first pass
        fs = spec.sharding.fsdp
        held = held and accum and not (fs is not None and fs.version == 1)
    g_layer = layer_grad(spec)
    g_head, g_emb = head_and_embedding(spec)
    g_down = down_proj_numel(spec) * param_bytes(spec) if trainable_full(spec) else 0
    g_down_frozen = down_proj_numel(spec) * param_bytes(spec)  # a trained layer's first gradient (partial)
    cast = layer_cast(spec) if q.autocast else 0
    from fitcheck.core.activations.qlora import four_bit_lora

    # the down_proj weight cast freed after its backward (a 4-bit base has no cast: layer_cast)
    cast_down = 2 * down_proj_numel(spec) if q.autocast and not four_bit_lora(spec) and cast == full_cast(spec) else 0
    # gated MLP: down_proj input gradient + the product's two gradients - down_proj's freed input (+2·e·I);
    # a plain MLP (GPT-2 traced: fc input gradient replaces the freed fc output) nets 0; + the residual gradient
    gated = sh.mlp_activation == "swiglu"
    # transformers 4.x's Mixtral loop: one expert's tokens at a time (moe_expert_loop.py)
    loop = expert_loop_backward_work(spec, q.e, q.r)
    work = (loop if loop is not None else 2 * q.e * sh.intermediate_size * bs if gated else 0) + q.r * h * bs
    static = _static_outside(spec, q)
    norms = _gemma_norms(spec)  # (1 + weight) fp32 copies of one layer's norms (Gemma)
    moments: dict[str, int] = {}
    # FSDP (a full fine-tune): every moment holds the rank's gradients in the form FSDP gives them then, not the
    # model states' count (fp32 shards of every unit) less the plain run's unmade gradients (backward_fsdp.py)
    fsdp = fsdp_counted(spec) if fsdp_moments else None
    # HEAD: everything forward kept + the logits-side tensors + the head's new weight gradient (under autocast
    # still the 16-bit one, before its cast to the fp32 parameter's dtype); missing: every other gradient
    head_grad = 2 * g_head // param_bytes(spec) if q.autocast else g_head
    # ZeRO-3: the head's new whole gradient on its way into the resident buffer is buffers.zero3_gathered_params'
    # (the largest tensor's gradient, core/states/sharding.py zero3_gradient_in_flight), ZeRO-1/2 + offload's
    # buffers.deepspeed_offload_gradient_in_flight (core/states/deepspeed_offload.py): not counted twice
    head_grad = max(0, head_grad - zero3_gradient_in_flight(spec) - offload_gradient_in_flight(spec))
    missing = 0 if held else all_grads(spec)
    if z2 is not None and not held:  # (ZeRO-1 with overlap_comm accumulating: every .grad held, counted)
        missing = z2[0]  # no grads_in_partition yet; the head's gradient is the moment's own (head_grad)
    if fsdp is not None:
        missing = fsdp[1] - fsdp[0].head
    casts = L * cast if q.n_ckpt == 0 else 0
    a_cast, a_first, a_down = adapter_casts_held(spec)  # LoRA's adapter casts under autocast (backward_grads)
    casts += L * a_cast - a_first if a_cast and not q.offloaded else 0
    head16 = 2 * autocast_head_numel(spec)  # partial training: the head's 16-bit, then fp32 gradient (freeze.py)
    head32 = 0 if held else 2 * head16  # made by the cast: no longer missing
    # accumulation: a partially trained head's new gradient (without autocast: head16 has its own moment) is a
    # temporary beside its .grad until AccumulateGrad adds it in place (without accumulation it is the .grad
    # all_grads left out of ``missing``). Probe Qwen3-14B freeze fp32 1 x 1344, accumulation 4: -51.7 % without
    # it. LoRA's modules_to_save head (fp32 copy) was not traced with accumulation: left as it was
    head_new = partial_head_grad(spec) if accum and not head16 and spec.freeze is not None else 0
    moments["head"] = q.kept + casts + head_extra + q.e * bs * h + head_grad + head16 + head_new - missing - head32
    if accum and q.autocast and head_grad and head_grad < g_head:  # fp32 weights: the fp32 cast (backward_accum)
        moments["head gradient cast"] = accumulated_head_cast(q.kept, casts, head_grad, g_head, q.r * bs * h)
    ds = spec.sharding.deepspeed
    if z2 is not None and z2[1] and ds is not None and zero2_head_reduced(spec, g_head):
        # ZeRO-2, the head above the bucket (extra_large_param_to_reduce): the final norm's gradient hook reduces
        # it and allocates the last rank's grads_in_partition, the head's own gradient still alive, the logits
        # gone (the real engine's backward peak at width 768, benchmarks/deepspeed_cpu.py)
        # ZeRO-1 + overlap_comm accumulating (its boundary micro-step): the head's new gradient was added into its
        # .grad, which z2[1] counts, and freed when its AccumulateGrad returned, before the next hook reduces it
        # (real engine, deepspeed_cpu.py CASES["zero1-overlap-8-ranks-accum2"], rank 7: this moment +0.43 %)
        new_head = 0 if accum else head_grad
        moments["head reduced"] = q.kept + casts + q.e * bs * h + new_head + z2[1] - z2[0] + _LOSS_SCALARS
    if head16:  # the cast to fp32: logits gradient and weight/input casts freed, the input gradient in fp32
        moments["head gradient cast"] = q.kept + casts + head16 + q.r * bs * h + (2 * head16 if accum else 0) - missing
    tied = tied_embedding_backward(spec)
    lora = _lora_recompute(spec, q)
    base_nockpt = None if q.n_ckpt or q.offloaded else unrecomputed_base_backward(spec, q.r)
    int8_base = None if q.offloaded or lora is not None else int8_base_backward(spec, q.r)  # down_proj's CB
    post = None if q.offloaded else post_norm_backward(spec)
    for name, i in (("top layer", L - 1), ("bottom layer", 0)):
        missing = 0 if held else (i + 1) * g_layer - g_down + g_emb
        below = 1 if q.offloaded else i + 1  # offloaded: only layer i's tensors are brought back
        if spec.freeze is not None and not held:
            missing = frozen_missing(spec, i == L - 1, all_grads(spec), layer_bytes(spec), g_down_frozen)
        elif spec.lora is not None and not held and q.n_ckpt == 0:
            missing = _lora_missing(spec, i)  # checkpointed adapters: lora_recompute / dora moments
        elif int8_base is not None and not held and not int8_recompute_dequantizes_16bit(spec):
            # checkpointed LLM.int8 LoRA: the layers above and down_proj's adapter made theirs (decoder.py: not
            # under CPU autocast)
            missing = max(0, all_grads(spec) - (L - 1 - i) * layer_grads(spec)[0] - layer_grads(spec)[1])
        if z2 is not None:  # ZeRO-2: the rank's grads_in_partition once allocated, whole, in place of the made ones;
            # a tied head's gradient waits in the shared weight's input buffer until the embedding (not in it)
            missing = z2[0] - (z2[1] if i == L - 1 else z2[2]) - (g_head if spec.model.shape.tied_embeddings else 0)
        if fsdp is not None:
            missing = fsdp[1] - (fsdp[0].top if i == L - 1 else fsdp[0].bottom)
            if i == L - 1:  # the tail's and the top layer's reductions (backward_fsdp.py)
                per_layer = q.ckpt_input if q.n_ckpt else q.layer + cast + norms
                moments.update(fsdp_reduce_moments(fsdp, static - q.first_less, per_layer, L, q.r * h * bs))
        if q.n_ckpt == 0:
            whole = q.layers_saved < 0 or i == 0 or q.offloaded
            saved = below * q.layer if whole else q.layers_saved
            live = static + saved + below * (cast + norms) - cast_down - q.first_less
            if a_cast and not q.offloaded:  # the adapters' bf16 casts saved by layers 0..i (backward_grads)
                live += below * a_cast - a_first - a_down
        else:
            # fp32 residual: the first norm saves its input itself (not the promoted bottom layer's 16-bit input)
            shared = 0 if q.half_model or (q.promoted and i == 0) else 4 * h * bs
            live = static + below * q.ckpt_input + q.layer + norms - shared + 8 * s + cast - cast_down + q.ckpt_mask
            live -= q.first_less
            if i == 0:  # its first norm's 16-bit normalised input (BackwardInputs.first_norm_less)
                live -= q.first_norm_less
            live += held_at_layer(spec, i, q.ckpt_input)  # FSDP1 + reentrant, transformers < 4.52 (fsdp1_reentrant)
        live += (L - below) * q.retained
        # accumulation, tied embeddings: the head's new gradient waits in the shared weight's AccumulateGrad input
        # buffer through every layer's backward (without accumulation it stands for the .grad, counted). Probe
        # granite-3.3-8b-instruct full bf16 ckpt 2 x 896, accumulation 2: -17.8 % without it
        live += tied // 2 if accum else 0
        if q.n_ckpt == 0:  # bitsandbytes <= 0.43.1: layer 0 made no q/k/v node (bnb_kept_inputs.py)
            live -= kept_first_layer_less(spec, all_kept=False) * spec.batch.micro_batch * spec.batch.seq_len
        # eager attention: the layer's softmax backward, after its o_proj / MLP / post norms made their gradients
        # (and, under autocast, freed their weight casts): eager.eager_working_set
        attn = None if q.eager_backward is None else live + q.eager_backward + _LOSS_SCALARS
        if attn is not None and cast_down and q.eager_made:
            attn -= 2 * q.eager_made // param_bytes(spec) - cast_down
        if lora is not None:  # LoRA + checkpointing: the layer's recompute and its MLP backward (lora_recompute.py)
            rec, lora_work, g_lora, g_lora_down, base = lora
            if i != L - 1:  # the fp32 checkpoints above are freed (layernorm_recompute.py; 0 elsewhere)
                from fitcheck.core.activations.layernorm_recompute import layernorm_bottom_layer_less

                live -= layernorm_bottom_layer_less(spec)
            unmade = 0 if held else all_grads(spec) - (L - 1 - i) * g_lora  # layer i made none yet
            moments[name + " recompute"] = live + cast_down + rec - unmade + _LOSS_SCALARS
            moments[name] = live + lora_work - (0 if held else unmade - g_lora_down) + _LOSS_SCALARS
            if base is not None:  # QLoRA: down_proj's MatMul4Bit backward (dequantized weight)
                moments[name + " 4-bit backward"] = live + base - (0 if held else unmade - g_lora_down) + _LOSS_SCALARS
            if attn is not None:  # every adapter gradient of layer i but q/k/v's (a few r-wide rows) made
                moments[name + " attention"] = attn - (0 if held else unmade - g_lora)
            continue
        moments[name] = live + work - missing + _LOSS_SCALARS
        if int8_base is not None:  # LLM.int8: down_proj's backward, its weight dequantized (lora_recompute.py)
            g_lora, g_lora_down = layer_grads(spec)  # made by then: the layers above and down_proj's adapter
            unmade = max(0, all_grads(spec) - (L - 1 - i) * g_lora - g_lora_down)
            moments[name + " 8-bit backward"] = live + int8_base - (0 if held else unmade) + _LOSS_SCALARS
        new_down = (g_down if spec.freeze is None else g_down_frozen * layer_trained(spec, i)) if accum else 0
        if new_down and gated:  # accumulation: down_proj's new weight gradient beside its .grad (backward_accum)
            moments[name + " down_proj weight gradient"] = accumulated_down_proj(
                spec, live, cast_down, q.e, q.r, q.autocast, new_down) + _LOSS_SCALARS - (
                missing if fsdp is not None else 0)
        if i == L - 1 and base_nockpt is not None:  # QLoRA without checkpointing: its 4-bit backward
            moments[name + " 4-bit backward"] = live + base_nockpt - missing + _LOSS_SCALARS
        if head16 and layer_trained(spec, i) and q.n_ckpt == 0 and i == L - 1:  # freeze.autocast_layer_cast
            from fitcheck.core.activations.layer_saved import full_mlp_saved

            moments[name + " gradient cast"] = autocast_layer_cast(spec, live + cast_down, q.r, missing,
                                                                   full_mlp_saved(spec))
        # a trained layer's post-attention norm backward (activations/norm_backward.py); partial training: the
        # layer's down_proj gradient is already out of ``missing`` (freeze.frozen_missing)
        down = g_down if spec.freeze is None else g_down_frozen
        if post is not None and (spec.freeze is None or layer_trained(spec, i)):
            moments[name + " post norm"] = live + post[0] - missing + (post[1] - down) * (not held) + _LOSS_SCALARS
        if attn is not None:
            made = q.eager_made - g_down if not held and spec.freeze is None else 0
            moments[name + " attention"] = attn - missing + made
    frozen_moment = _frozen_recompute(spec, q, static, norms, cast - cast_down)
    if frozen_moment is not None:
        top_frozen, moments["top frozen layer"] = frozen_moment
        if top_frozen == L - 1:
            del moments["top layer"]  # the trained-layer recipe does not describe a frozen top layer
        if not layer_trained(spec, 0):
            del moments["bottom layer"]  # a frozen bottom layer: the frozen moment with fewer checkpoints held
    trained_norm = frozen_input_norm_backward(spec, static, q.layer, all_grads(spec))  # norm_backward.py
    if trained_norm is not None:
        moments["top trained layer input norm"] = trained_norm + _LOSS_SCALARS
        final = frozen_final_norm_backward(spec, q.kept, all_grads(spec))
        moments["final norm"] = (final or 0) + _LOSS_SCALARS
    if q.attention_moment is not None:  # DeepSeek-V3's CPU math attention (activations/mla.py)
        moments["top layer attention"] = q.attention_moment - all_grads(spec) + _LOSS_SCALARS
    wrapped = param_wrapper_backward(spec, q.e, q.r)  # LoRA on fused experts (activations/param_wrapper.py)
    if wrapped:
        moments["top MoE layer"] = q.kept + wrapped - (0 if held else all_grads(spec)) + _LOSS_SCALARS
    # accumulation: the embedding's new gradient is a temporary until AccumulateGrad adds it in place; tied, the
    # head's buffered gradient is one too, and so is their sum (tied // 2 each: the sum is not the .grad). Probe
    # gemma-7b full ckpt bf16 3 x 1024, accumulation 2: -19.7 % without it
    temp_emb = g_emb + tied // 2 if accum else 0
    # tied: the embedding's own backward holds its output gradient and its new vocab x hidden gradient; the sum
    # with the head's buffered gradient comes after the node returned, its output gradient freed (engine.cpp
    # evaluate_function: the node's inputs are released before its outputs enter the next input buffer)
    during = q.end + cuda_embedding_backward(spec) + temp_emb + tied // 2
    emb = max(during, tied + temp_emb) + _LOSS_SCALARS
    # ZeRO-2: the ranks' grads_in_partition made by then (z2[3]) in place of the counted gradients, beside the
    # embedding's own new gradient (tied: the sum), not yet copied into it (its hook runs after)
    moments["embedding"] = emb if z2 is None else emb - z2[0] + z2[3] + max(g_head if tied else 0, g_emb)
    if fsdp is not None:  # its backward (its new gradient held by the moment), then its reduce in the final callback
        moments["embedding"] = fsdp_embedding_moment(fsdp, q.end + cuda_embedding_backward(spec))
    return moments


def _lora_recompute(spec: TrainingSpec, q: BackwardInputs) -> tuple[int, int, int, int, int | None] | None:
    """(recompute-stop bytes, MLP backward bytes, one layer's adapter gradients, its down_proj adapter's, QLoRA's
    down_proj 4-bit backward bytes) of a checkpointed LoRA layer (``fitcheck.core.activations.lora_recompute``);
    None where those moments do not apply."""
    from fitcheck.core.activations import lora_recompute as lr

    if q.n_ckpt == 0 or q.offloaded:
        return None
    bs = spec.batch.micro_batch * spec.batch.seq_len
    if q.n_ckpt:  # GPT-2 / Phi blocks under CUDA autocast (activations/layernorm_recompute.py)
        from fitcheck.core.activations.layernorm_recompute import layernorm_recompute_moments

        shared = 0 if q.half_model else 4 * spec.model.shape.hidden_size
        ln = layernorm_recompute_moments(spec, shared)
        if ln is not None:
            return (*ln, None)
    if not lr.lora_recompute_applies(spec):
        return None
    casts = lr.adapter_casts(spec)
    up = lr.recompute_up_tokens(spec, q.e, q.r, q.half_model)
    rec = max(lr.recompute_tokens(spec, q.e, q.r, q.half_model), up if up is not None else 0) * bs + casts
    if kept_through_checkpoint(spec):  # bitsandbytes <= 0.43.1: the recomputation's own MatMul4Bit nodes keep the
        rec += kept_layer_inputs(spec) * bs  # layer's inputs until it stops (trace; bnb_kept_inputs.py)
    base = lr.base_backward(spec, q.r)
    return (rec, lr.mlp_work_tokens(spec, q.e, q.r) * bs + casts, *lr.layer_grads(spec), base)


def _lora_missing(spec: TrainingSpec, i: int) -> int:
    """Adapter gradients not made yet at layer i's MLP backward: those of layers 0..i, less down_proj's (its
    LoRA branch runs its backward before the base linear's: peft 0.21.2 tuners/lora/layer.py ``Linear.forward``
    adds the branch last). The model states count every gradient in ``Phase.BACKWARD``; without this the top
    layer's moment held all of them (trace Llama-3.1-70B LoRA bf16, no checkpointing, 1 x 512: +2.24 %, the
    79 lower layers' adapter gradients, 0.8 GiB; benchmarks/envelope_ranges.py llama/lora/nockpt/sdpa/bf16)."""
    from fitcheck.core.activations.lora_recompute import layer_grads

    g_lora, g_lora_down = layer_grads(spec)
    return max(0, min(all_grads(spec), (i + 1) * g_lora - g_lora_down))


def _frozen_recompute(spec: TrainingSpec, q: BackwardInputs, static: int, norms: int,
                      cast: int) -> tuple[int, int] | None:
    """(index, bytes) of the MLP backward moment of the top-most frozen layer a gradient flows through, for a
    layer-granular partial fine-tune with a gated MLP, every layer checkpointed or none; None otherwise.

    A frozen layer saves only what its input gradient needs (``layer_saved_per_token(trainable=False)``: no
    linear inputs, ``freeze.py``), so its down_proj input is never saved and its MLP backward adds the
    down_proj input gradient and the product's two gradients (3·e·I per token) + the residual gradient. Held
    besides: with checkpointing the inputs of it and every layer below a gradient flows through, and its
    recomputed tensors; without, the saved tensors of it and every layer below; and every gradient but those of
    the trainable layers not reached yet (and the embedding's). Traces (``benchmarks/envelope_ranges.py``, 4
    layers, top one trained, bf16): Llama-3.1-8B checkpointed at 8 x 512, 1008.8 MiB beyond the 1418 MiB of
    gradients then made, the same as this sum (the trained-layer recompute counted before: +64 MiB, +121 % of
    the phase); Mistral-7B without checkpointing at 1 x 1024, 262.9 MiB beyond every gradient (a small
    vocabulary: this moment, not the head's, is the phase's peak; not modelled before: -56 %).
    """
    from fitcheck.core.activations.freeze import frozen_layers
    from fitcheck.core.activations.layer_saved import layer_saved_per_token

    frozen = frozen_layers(spec)
    fz = spec.freeze
    sh = spec.model.shape
    if (frozen is None or fz is None or fz.trainable_layers is None or q.n_ckpt not in (0, sh.num_layers)
            or q.offloaded or frozen.frozen_grad == 0 or sh.mlp_activation != "swiglu"
            or gradients_held_from_start(spec)):
        return None
    L, bs = sh.num_layers, spec.batch.micro_batch * spec.batch.seq_len
    trained = {i for i in fz.trainable_layers if 0 <= i < L}
    top = max(i for i in range(frozen.no_grad, L) if i not in trained)
    per_token, s2 = layer_saved_per_token(spec, trainable=False)
    layer = per_token * bs + s2 * bs * spec.batch.seq_len
    work = 3 * q.e * sh.intermediate_size * bs + q.r * sh.hidden_size * bs
    reached = top + 1 - frozen.no_grad  # layers at or below it that a gradient flows through
    if q.n_ckpt:
        shared = 0 if q.half_model else 4 * sh.hidden_size * bs
        live = static + reached * q.ckpt_input + layer + norms - shared + 8 * spec.batch.seq_len + cast
    else:
        below_trained = sum(1 for i in trained if i < top)
        live = static + (reached - below_trained) * layer + below_trained * q.layer + reached * norms + cast
    made = layer_bytes(spec) * sum(1 for i in trained if i > top)  # the trainable layers above it are done
    return top, live + work - max(all_grads(spec) - made, 0) + _LOSS_SCALARS




def _static_outside(spec: TrainingSpec, q: BackwardInputs) -> int:
    """Saved bytes outside the layers that outlive the final norm's backward (rotary tables, Gemma norms, the
    leaf of a scaled frozen embedding)."""
    from fitcheck.core.activations.attention_variants import rotary_tables
    from fitcheck.core.activations.embedding import scaled_embedding_leaf

    # cos/sin (1, s, rot) in the model dtype (trace); OLMo-2 fp32, gpt-oss rot = head_dim / 2 (attention_variants.py)
    half = q.half_model or q.promoted
    return rotary_tables(spec.model.shape, spec.batch.seq_len, half) + scaled_embedding_leaf(spec, q.r)



def _gemma_norms(spec: TrainingSpec) -> int:
    """Gemma's per-layer (1 + weight) fp32 copies, saved by each norm (trace: add (h,) fp32)."""
    traits = spec.model.shape.traits
    if traits.norm_kind is not NormKind.RMS_ONE_PLUS:
        return 0
    # 4 copies where the Gemma-2 trace set them; Gemma-3 text (also four norms per layer) keeps the 2 it had
    # before the traits, not re-checked against a trace
    return 4 * spec.model.shape.hidden_size * (4 if traits.attention is AttentionKind.SOFTCAPPED else 2)


def backward_transient(spec: TrainingSpec, q: BackwardInputs, head_extra: int,
                       fsdp_moments: bool = True) -> tuple[int, str]:
    """Bytes the worst moment of backward holds beyond ``q.end`` and every gradient, and which moment it is.

    Args:
        spec: The training spec.
        q: Quantities from ``fitcheck.core.activations.decoder``.
        head_extra: Logits-side bytes alive at the head's backward besides ``q.kept``.
        fsdp_moments: ``backward_moments``' flag.

    Returns:
        (bytes >= 0, moment name).
    """
    moments = backward_moments(spec, q, head_extra, fsdp_moments)
    name = max(moments, key=lambda k: moments[k])
    return max(0, moments[name] - q.end), name
