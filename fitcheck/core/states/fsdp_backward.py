"""What one FSDP rank holds at each moment of backward beyond its sharded parameters, optimizer states and
activations: its gradients in the form FSDP2 or FSDP1 keeps them then and its gathered units; read by the backward
moments (``core/activations/backward.py``). Pure.

Which runs (``fsdp2_units.fsdp_backward_applies``): an untied full fine-tune (session 22,
``benchmarks/accumulation_engines_cpu.py``); since session 23 (``benchmarks/fsdp_kinds_cpu.py``, the real Trainer) a
LoRA run on an unquantized base (FSDP1 and FSDP2) or a 4-bit one (FSDP1), not checkpointed; a tied full fine-tune;
FSDP2 SHARD_GRAD_OP. The per-unit sizes (:class:`_Units`) carry the difference: what a unit gathers and what of it
trains (a frozen unit makes and reduces no gradient).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fitcheck.core.states.accumulation import accumulates_in_grad, gradients_held_from_start
from fitcheck.core.states.fsdp1_prefetch import fsdp1_prefetched_units
from fitcheck.core.states.fsdp2_units import fsdp_backward_applies, tail_params
from fitcheck.core.states.fsdp_qlora import gathered_layer_bytes
from fitcheck.core.states.layout import trainable_params
from fitcheck.core.states.model_states import model_state_components
from fitcheck.core.states.sharding import frozen_at_param_dtype, param_compute_bytes, partition
from fitcheck.report import Phase
from fitcheck.spec import Role, TrainingSpec


@dataclass(frozen=True)
class FsdpBackward:
    """Bytes one FSDP rank holds at backward's moments beyond its sharded parameters, optimizer states and
    activations: its gradients in every form they take (reduced fp32 shards, unsharded ``.grad``, the last
    ``reduce_scatter_input``) and its gathered parameters (:func:`fsdp_backward_held`).

    Attributes:
        head: At the LM head's backward (the head's own new gradient left to the moment).
        tail_reduce: At the tail unit's reduce-scatter (its ``post_backward``, once the final norm's gradient is
            made): its input, its ``reduce_output`` and fp32 shard, the layers' saved activations all alive; None
            under FSDP1 (the final norm and the head are the root's, reduced at the end).
        layer_reduce: At the top layer's reduction (FSDP1's ``_post_backward_hook``, the layers below it alive);
            None under FSDP2 (not the worst moment in its measured runs).
        top: At the top layer's MLP backward (its gradients made so far included).
        bottom: At the bottom layer's MLP backward (the same).
        embedding: At the input embedding's backward (its new gradient included).
        reduce_end: At the embedding's reduce-scatter in the root's final callback (FSDP1: the root's flat
            gradient made from its parameters' gradients, when the embedding's is made).
    """

    head: int
    tail_reduce: int | None
    layer_reduce: int | None
    top: int
    bottom: int
    embedding: int
    reduce_end: int


def fsdp_backward_held(spec: TrainingSpec, made_in_layer: int) -> FsdpBackward | None:
    """What one FSDP rank holds at each moment of backward beyond states and activations; None where
    ``fsdp2_units.fsdp_backward_applies`` does not. FSDP1: :func:`_fsdp1_held`; FSDP2 below.

    torch 2.13 ``distributed/fsdp/_fully_shard/_fsdp_param_group.py`` ``post_backward`` (a unit's gradients are
    reduced when its backward ends) and ``_fsdp_collectives.py`` ``foreach_reduce``: the unit's unsharded gradients
    (``param_dtype``) are copied into one ``reduce_scatter_input`` (``reduce_dtype``: accelerate 1.15's bf16 policy
    sets it to ``param_dtype``) and freed, ``reduce_output`` (the shard, ``reduce_dtype``) is cast to the sharded
    parameter's dtype (``_to_dtype_if_needed``: fp32 after accelerate's upcast) and becomes the sharded ``.grad``,
    the ``reduce_output`` freed; the ``reduce_scatter_input`` stays in ``comm_ctx.reduce_scatter_states`` until the
    next unit's ``post_backward`` (``reduce_scatter_max_input_buffers`` = 1) or the root's final callback. The
    input embedding's inputs need no gradient, so its ``post_backward`` runs in that final callback
    (``_fsdp_state.py`` ``_root_post_backward_final_callback``), after the previous unit's input was released:
    its input, its ``reduce_output`` and every fp32 shard then. A unit is gathered at its pre-backward and
    resharded at its post-backward; on more than one rank the unit before it is prefetched
    (``_backward_prefetch``); at one, ``unshard`` copies nothing ahead (``wait_for_unshard``'s
    ``world_size == 1`` branch). Three kinds of step:

    - no accumulation (and the first micro-step under ``sync_each_batch``): a unit's shards exist once reduced,
      the current unit's unsharded gradients as they are made (``made_in_layer`` elements at a layer's moment);
    - an accumulating window's last micro-step (``set_requires_gradient_sync(False)`` before it): every unsharded
      ``.grad`` is held from its start and freed when its unit is reduced;
    - ``sync_each_batch`` with accumulation: every fp32 shard from the start, the new unsharded gradients besides.

    Measured on the real Trainer (``benchmarks/accumulation_engines_cpu.py``, tiny Llama, 1 and 2 gloo ranks):
    the storages alive at each backward peak.

    Args:
        spec: The training spec.
        made_in_layer: Elements of gradient a layer's unit has made at its MLP backward moment (down_proj's).

    Returns:
        The bytes per moment, or None.
    """
    if not fsdp_backward_applies(spec):
        return None
    fs = spec.sharding.fsdp
    if fs is not None and fs.version == 1:
        return _fsdp1_held(spec, made_in_layer)
    u = _units(spec)
    n, c, emb = u.shards, u.compute_bytes, u.embedding
    reduced, grads, shards_held = _gradients(spec, n)
    tail, g_tail, g_layer, g_emb = tail_params(spec), u.trained_tail, u.trained_layer, u.trained_embedding
    layers = spec.model.shape.num_layers
    ahead = 2 if n > 1 else 1  # the unit in backward + the one prefetched
    unit = u.layer_bytes
    kept_emb = c * emb if n > 1 else 0  # the embedding's unit, prefetched by the bottom layer's pre-backward
    early = 0  # the embedding's unit gathered from the head's moment on
    at_head = unit if n > 1 else 0  # before any layer's backward: the top layer prefetched
    if fs is not None and not fs.reshard_after_forward:
        # SHARD_GRAD_OP: every layer and the embedding's unit kept gathered from forward to their own backward
        # (fsdp2_units.fsdp2_components), each resharded after it (reshard_after_backward)
        ahead, kept_emb, early = layers, c * emb, c * emb
        at_head = layers * unit + early
    if spec.model.shape.tied_embeddings:
        return _fsdp2_tied(spec, made_in_layer)
    # c * g_...: a unit's reduce_scatter_input, kept until the next unit's post_backward; a frozen unit makes none
    # (foreach_reduce runs over the gradients made), so a LoRA run's tail and embedding reduce nothing
    return FsdpBackward(
        head=grads(0, 0) + c * tail + at_head,
        # the tail resharded first (reshard_after_backward); sync_each_batch: the new shard beside the held one
        tail_reduce=grads(g_tail, 0) + c * tail + c * g_tail // n + (reduced(g_tail) if shards_held else 0)
        + at_head if g_tail else None,
        layer_reduce=None,
        top=grads(g_tail, made_in_layer) + c * g_tail + ahead * unit + early,
        bottom=grads(g_tail + (layers - 1) * g_layer, made_in_layer) + unit + c * g_layer + kept_emb,
        # a frozen embedding runs no backward: layer 0's input and the prefetched copy until the final callback
        embedding=grads(u.trainable - g_emb, 0) + c * emb + c * g_layer + c * g_emb if g_emb
        else grads(u.trainable, 0) + c * g_layer + (c * emb if n > 1 else 0),
        reduce_end=reduced(u.trainable) + (c * emb + c * emb // n + (reduced(emb) if shards_held else 0)
                                           if g_emb else 0),
    )


def _fsdp2_tied(spec: TrainingSpec, made_in_layer: int) -> FsdpBackward:
    """FSDP2 over a tied model (a full fine-tune): accelerate 1.15 ``fsdp2_prepare_model`` puts the shared weight in
    the tail unit ``[final norm, lm_head, embed_tokens]`` (``reshard_after_forward=False``), gathered from forward to
    the end of backward. The head's gradient of the shared unsharded parameter waits in its ``AccumulateGrad``
    input buffer until the embedding's is added (autograd sums a leaf's incoming gradients before accumulating), and
    the tail's ``post_backward`` runs in the root's final callback (torch 2.13 ``_fsdp_state.py``
    ``_root_post_backward_final_callback``): its ``reduce_scatter_input`` and ``reduce_output`` then, every layer
    reduced. Real Trainer, tiny Llama, 1 and 2 gloo ranks (``benchmarks/fsdp_kinds_cpu.py`` ``tied-fsdp2*``)."""
    u = _units(spec)
    n, c, unit = u.shards, u.compute_bytes, u.layer_bytes
    reduced, grads, shards_held = _gradients(spec, n)
    tail, layers, p = tail_params(spec), spec.model.shape.num_layers, u.trained_layer
    waiting = c * tail  # the shared weight's head gradient (and the final norm's .grad)
    ahead = 2 if n > 1 else 1
    return FsdpBackward(
        head=grads(0, 0) + c * tail + (unit if n > 1 else 0),
        tail_reduce=None,
        # the first reduce-scatter, the top layer's (its input, reduce_output and, sync_each_batch, the new fp32 shard
        # beside the held one: foreach_reduce as at the untied tail's), the layers below it alive
        layer_reduce=grads(p, 0) + c * p + c * p // n + (reduced(p) if shards_held else 0) + c * tail + waiting
        + (unit if n > 1 else 0),
        top=grads(0, made_in_layer) + c * tail + waiting + ahead * unit,
        bottom=grads((layers - 1) * p, made_in_layer) + c * tail + waiting + unit + c * p,
        # the embedding's new gradient and its sum with the waiting one, layer 0's reduce_scatter_input
        embedding=grads(layers * p, 0) + c * tail + c * p + waiting + 2 * c * u.embedding,
        reduce_end=reduced(u.trainable) + c * tail + c * tail // n + (reduced(tail) if shards_held else 0),
    )


@dataclass(frozen=True)
class _Units:
    """What one rank gathers and trains per FSDP unit (elements unless named bytes)."""

    shards: int
    compute_bytes: int
    trainable: int
    layer_bytes: int  # a gathered decoder-layer unit (with its adapters' copies)
    trained_layer: int  # a decoder layer's trainable elements (all of it in a full fine-tune, its adapters in LoRA)
    embedding: int  # the input embedding
    trained_embedding: int
    trained_tail: int  # the final norm's and LM head's trainable elements
    root_bytes: int  # FSDP1's gathered root (embedding, final norm, LM head)


def _units(spec: TrainingSpec) -> _Units:
    """The unit sizes of a full fine-tune or of a LoRA run (``fsdp2_units.fsdp_lora_moments``: adapters in the
    decoder layers only, in their layer's FSDP2 unit or, under FSDP1, in their own units gathered with it)."""
    per_layer = sum(p.numel_each for p in spec.model.params if p.per_layer)
    emb = sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING)
    root = sum(p.numel for p in spec.model.params if not p.per_layer)
    layers = max(1, spec.model.shape.num_layers)
    trainable = trainable_params(spec)
    c = param_compute_bytes(spec)
    # unsharded parameters and gradients, reduce_scatter_input (reduce_dtype: accelerate's policy, param_dtype)
    if spec.lora is None:
        return _Units(partition(spec).gradients, c, trainable, c * per_layer, per_layer, emb, emb,
                      tail_params(spec), c * root)
    adapters = trainable // layers
    # FSDP1 on one process over units frozen in param_dtype or a 4-bit base: nothing copied (sharding._fsdp)
    fs = spec.sharding.fsdp
    uncast = fs is not None and fs.version == 1 and partition(spec).weights == 1 and (
        frozen_at_param_dtype(spec) or spec.quant is not None)
    # a 4-bit base gathers its packed storage (fsdp_qlora.gathered_layer_bytes)
    layer = gathered_layer_bytes(spec, c) if spec.quant is not None else c * per_layer
    return _Units(partition(spec).gradients, c, trainable, 0 if uncast else layer + c * adapters, adapters,
                  emb, 0, 0, 0 if uncast else c * root)


def _reduced_shard_bytes(spec: TrainingSpec) -> int:
    """Bytes of every reduced gradient shard of a rank (the model states' gradients at the optimizer step)."""
    return sum(c.at(Phase.OPTIMIZER_STEP) for c in model_state_components(spec) if c.name == "gradients")


def _gradients(spec: TrainingSpec, n: int) -> tuple[Callable[[int], int], Callable[[int, int], int], bool]:
    """(the reduced fp32 shards of so many gradient elements; the gradients held once units of ``done`` elements
    are reduced and ``made`` of the next made; whether every shard is held from the start)."""
    trainable = trainable_params(spec)
    shard_bytes = _reduced_shard_bytes(spec)
    c = param_compute_bytes(spec)

    def reduced(numel: int) -> int:
        return shard_bytes * numel // trainable

    fs = spec.sharding.fsdp
    # no_sync before this micro-step: every unsharded .grad held (FSDP1 on one process has no no_sync: each
    # micro-step reduces into the fp32 .grad it holds, as sync_each_batch does)
    window_end = accumulates_in_grad(spec) and spec.batch.grad_accum > 1 and not (
        fs is not None and fs.version == 1 and n == 1)
    shards_held = gradients_held_from_start(spec) and not window_end

    def grads(done: int, made: int) -> int:
        if window_end:
            return c * (trainable - done) + reduced(done)
        return (reduced(trainable) if shards_held else reduced(done)) + c * made

    return reduced, grads, shards_held


def _fsdp1_held(spec: TrainingSpec, made_in_layer: int) -> FsdpBackward:
    """FSDP1's moments (accelerate 1.15 units: each decoder layer and the root, the embedding, final norm and LM
    head in one flat parameter; transformers 5.23's default ``backward_prefetch=NO_PREFETCH``, or the unit
    :func:`fsdp1_prefetched_units` gathers ahead).

    torch 2.13 ``distributed/fsdp/_runtime_utils.py``: the root stays gathered from its forward to its
    post-backward, at the end; a layer is gathered at its pre-backward, resharded at its post-backward
    (``_post_backward_hook``), which reduces its flat gradient (``_reduce_grad``; ``_reduce_grad_no_shard`` on one
    process) and casts it to the fp32 parameter's dtype. A unit's flat gradient is made from its parameters'
    gradients when the last one is made (autograd's ``split_with_sizes`` backward over ``_flat_param.py``
    ``_get_unflat_views``), so the LM head's gradient waits until the embedding's: then the root's parameters'
    gradients, its flat gradient and its gathered parameters are alive together. Measured on the real Trainer
    (``benchmarks/accumulation_engines_cpu.py``, 1 and 2 gloo ranks): the storages alive at each backward peak.
    """
    u = _units(spec)
    n, c = u.shards, u.compute_bytes
    reduced, grads, shards_held = _gradients(spec, n)
    layers = spec.model.shape.num_layers
    g_layer = u.trained_layer
    trained_root = u.trainable - layers * g_layer
    held_root = u.root_bytes  # the root gathered through backward
    # the head's and final norm's gradients, until the root's flat gradient is made; tied, the head's gradient of the
    # shared weight waits in its input buffer until the embedding's is added (autograd sums a leaf's gradients
    # before its AccumulateGrad / the flat parameter's split_with_sizes backward runs)
    tied = spec.model.shape.tied_embeddings
    waiting = c * (trained_root if tied else trained_root - u.trained_embedding)
    pre, post = fsdp1_prefetched_units(spec)
    unit = u.layer_bytes
    return FsdpBackward(
        head=grads(0, 0) + held_root + pre * unit,
        tail_reduce=None,
        # the layer's new flat gradient (and, sharded, its new_sharded_grad in reduce_dtype) beside its fp32 cast;
        # one process reducing into a held fp32 .grad casts that to reduce_dtype and back first (the measured peak
        # of the accumulating 1-rank run)
        layer_reduce=grads(g_layer, 0) + c * g_layer + (c * g_layer // n if n > 1 else 0)
        + (c * g_layer + reduced(g_layer) if shards_held and n == 1 else 0) + held_root + waiting
        + max(pre, post) * unit,
        top=grads(0, made_in_layer) + held_root + waiting + unit + pre * unit,
        bottom=grads((layers - 1) * g_layer, made_in_layer) + held_root + waiting + unit,
        # tied: the sum of the waiting head gradient and the new one, made beside both
        embedding=grads(layers * g_layer, 0) + held_root + waiting + c * u.trained_embedding * (2 if tied else 1),
        # the parameters' gradients and the flat one made from them, beside the gathered root
        reduce_end=grads(layers * g_layer, 0) + held_root + 2 * c * trained_root,
    )
