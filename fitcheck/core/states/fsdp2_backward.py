"""What one FSDP2 rank holds at each moment of backward beyond its sharded parameters, optimizer states and
activations: its gradients in the form FSDP2 keeps them then and its gathered units; read by the backward moments
(``core/activations/backward.py``). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.states.accumulation import accumulates_in_grad, gradients_held_from_start
from fitcheck.core.states.fsdp2_units import fsdp2_backward_applies, tail_params
from fitcheck.core.states.layout import trainable_params
from fitcheck.core.states.model_states import model_state_components
from fitcheck.core.states.sharding import param_compute_bytes, partition
from fitcheck.report import Phase
from fitcheck.spec import Role, TrainingSpec


@dataclass(frozen=True)
class Fsdp2Backward:
    """Bytes one FSDP2 rank holds at backward's moments beyond its sharded parameters, optimizer states and
    activations: its gradients in every form they take (reduced fp32 shards, unsharded ``.grad``, the last
    ``reduce_scatter_input``) and its gathered parameters (:func:`fsdp2_backward_held`).

    Attributes:
        head: At the LM head's backward (the head's own new gradient left to the moment).
        tail_reduce: At the tail unit's reduce-scatter (its ``post_backward``, once the final norm's gradient is
            made): its input, its ``reduce_output`` and fp32 shard, the layers' saved activations all alive.
        top: At the top layer's MLP backward (its gradients made so far included).
        bottom: At the bottom layer's MLP backward (the same).
        embedding: At the input embedding's backward (its new gradient included).
        reduce_end: At the embedding's reduce-scatter in the root's final callback.
    """

    head: int
    tail_reduce: int
    top: int
    bottom: int
    embedding: int
    reduce_end: int


def fsdp2_backward_held(spec: TrainingSpec, made_in_layer: int) -> Fsdp2Backward | None:
    """What one FSDP2 rank holds at each moment of backward beyond states and activations; None where
    ``fsdp2_units.fsdp2_backward_applies`` does not.

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
    if not fsdp2_backward_applies(spec):
        return None
    n = partition(spec).gradients
    c = param_compute_bytes(spec)  # unsharded parameters and gradients, reduce_scatter_input (reduce_dtype)
    trainable = trainable_params(spec)
    shard_bytes = _reduced_shard_bytes(spec)

    def reduced(numel: int) -> int:  # the fp32 shards of numel gradient elements
        return shard_bytes * numel // trainable

    sh = spec.model.shape
    per_layer = sum(p.numel_each for p in spec.model.params if p.per_layer)
    tail = tail_params(spec)
    emb = sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING)
    layers = sh.num_layers
    window_end = accumulates_in_grad(spec) and spec.batch.grad_accum > 1  # no_sync before this micro-step
    shards_held = gradients_held_from_start(spec) and not window_end  # sync_each_batch, accumulating

    def grads(done: int, made: int) -> int:
        """Gradients held once the units of ``done`` elements are reduced, ``made`` of the next made."""
        if window_end:
            return c * (trainable - done) + reduced(done)
        return (reduced(trainable) if shards_held else reduced(done)) + c * made

    ahead = 2 if n > 1 else 1  # the unit in backward + the one prefetched
    above = tail + (layers - 1) * per_layer
    return Fsdp2Backward(
        head=grads(0, 0) + c * tail + (c * per_layer if n > 1 else 0),
        # the tail resharded first (reshard_after_backward); sync_each_batch: the new shard beside the held one
        tail_reduce=grads(tail, 0) + c * tail + c * tail // n + (reduced(tail) if shards_held else 0)
        + (c * per_layer if n > 1 else 0),
        top=grads(tail, made_in_layer) + c * tail + ahead * c * per_layer,
        bottom=grads(above, made_in_layer) + c * per_layer + c * per_layer + (c * emb if n > 1 else 0),
        embedding=grads(trainable - emb, 0) + c * emb + c * per_layer + c * emb,
        reduce_end=reduced(trainable) + c * emb + c * emb // n + (reduced(emb) if shards_held else 0),
    )


def _reduced_shard_bytes(spec: TrainingSpec) -> int:
    """Bytes of every reduced gradient shard of a rank (the model states' gradients at the optimizer step)."""
    return sum(c.at(Phase.OPTIMIZER_STEP) for c in model_state_components(spec) if c.name == "gradients")
