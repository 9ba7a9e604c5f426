"""DeepSpeed ZeRO-2's gradient partition during a full fine-tune's backward, for the backward moments
(:mod:`.backward`) and for traced activations (:func:`zero2_traced_component`, the default path); pure.

Moved out of ``backward.py`` (session 20) with no change of number.
"""

from __future__ import annotations

from fitcheck.core.activations.backward_grads import head_and_embedding, param_bytes, trainable_full
from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import Role, TrainingSpec


def zero2_held_grads(spec: TrainingSpec) -> tuple[int, int, int, int] | None:
    """Under DeepSpeed ZeRO-2 (a full fine-tune; every micro-step, the previous ones' partition carried: see
    ``zero2_backward_grads``): (the gradient bytes the model states count in
    ``Phase.BACKWARD``, a rank's gradient bytes at the top layer's backward, at the bottom layer's, at the
    embedding's); None
    otherwise. The model states count the rank's share of the gradients (G/n); ZeRO-2 holds none but the bucket
    until the rank's first parameter is reduced, then its whole ``grads_in_partition``
    (:func:`fitcheck.core.states.zero2_backward_grads`): the moments subtract the counted bytes and add what is
    held, never gradients not yet made at full size (which on n ranks put backward below the resident states)."""
    if not trainable_full(spec):
        return None
    from fitcheck.core.states import model_state_components, zero2_backward_grads

    held = zero2_backward_grads(spec)
    if held is None:
        return None
    counted = sum(c.at(Phase.BACKWARD) for c in model_state_components(spec) if c.name == "gradients")
    return counted, *held


def embedding_numel(spec: TrainingSpec) -> int:
    """Elements of the input embedding."""
    return sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING)


def zero2_head_reduced(spec: TrainingSpec, g_head: int) -> bool:
    """Whether ZeRO-2 reduces the LM head's gradient alone at the final norm's hook: an untied head above
    ``reduce_bucket_size`` (``extra_large_param_to_reduce``). A tied head's gradient waits in the shared weight's
    ``AccumulateGrad`` input buffer until the embedding's backward: its hook runs last (real engine, tied tiny
    Llama: the peak at the embedding, event 729 of 737)."""
    ds = spec.sharding.deepspeed
    tied = spec.model.shape.tied_embeddings
    return ds is not None and not tied and g_head // param_bytes(spec) > ds.reduce_bucket_size


def zero2_traced_component(spec: TrainingSpec, traced: tuple[Component, ...]) -> Component | None:
    """ZeRO-2's first reduction for traced activations (the default path), as a ``Phase.BACKWARD`` component.

    A trace of the plain step subtracts every gradient not yet made from the model states' ``gradients`` at its
    backward peak; under ZeRO-2 a rank holds its whole ``grads_in_partition`` from its first reduced bucket on
    (:func:`zero2_held_grads`). At that first reduction (the final norm's hook when the head is above the bucket,
    else in the top layer) forward's saved activations are still alive: the trace's activations at the start of
    backward (its ``Category.ACTIVATIONS``, the logits left out), beside the head's extra-large gradient and the
    last rank's partition. The component is what that moment holds above the trace's own backward moment (0 when below).

    Args:
        spec: The step's spec.
        traced: The traced activation components.

    Returns:
        The component, or None when not a full-size ZeRO-2 first micro-step or below the traced moment.
    """
    z2 = zero2_held_grads(spec)
    ds = spec.sharding.deepspeed
    if z2 is None or ds is None:
        return None
    device = [c for c in traced if c.location is Location.DEVICE]
    saved = sum(c.at(Phase.BACKWARD_START) for c in device if c.category is Category.ACTIVATIONS)
    from fitcheck.core.states import backward_moment_component, param_compute_bytes

    numel = head_and_embedding(spec)[0] // param_bytes(spec)  # its gradient in the dtype DeepSpeed computes in
    tied = spec.model.shape.tied_embeddings
    # the head's gradient: extra-large (its own storage), or tied (waiting in the shared weight's input buffer)
    head = numel * param_compute_bytes(spec) if tied or zero2_head_reduced(spec, numel * param_bytes(spec)) else 0
    first = saved + head + z2[1] - z2[0] if z2[1] else 0
    # the embedding's backward: the ranks' partitions made by then, the embedding's new gradient (tied: the
    # head's, the embedding's and their sum; backward_moments' "embedding")
    emb = (3 if tied else 1) * embedding_numel(spec) * param_compute_bytes(spec)
    extra = max(first, z2[3] - z2[0] + emb) - sum(c.at(Phase.BACKWARD) for c in device)
    if extra <= 0:
        return None
    return backward_moment_component(
        "activations.zero2_first_reduction",
        Category.ACTIVATIONS,
        extra,
        "deepspeed 0.19.8 runtime/zero/stage_1_and_2.py: reduce_ipg_grads -> copy_grads_in_partition allocates the "
        "rank's grads_in_partition at its first reduced bucket, near the top of backward "
        "(fitcheck/core/activations/backward_zero2.py zero2_traced_component)",
        f"ZeRO-2's first reduction (the traced saved activations, {saved:,} B, beside the last rank's "
        f"grads_in_partition, {z2[1]:,} B) or its embedding's backward (the ranks' partitions made by then, "
        f"{z2[3]:,} B, beside the embedding's gradients), above the trace's backward moment",
    )
