"""FSDP's bytes at backward's moments for :mod:`.backward` (``backward_moments``): what FSDP2 / FSDP1 hold then
(``core/states/fsdp_backward.py``) against what the components count in ``Phase.BACKWARD``, and the moments of
their reductions (the tail unit's reduce-scatter, FSDP1's top layer's, the embedding's or the root's at the end).
Pure.
"""

from __future__ import annotations

from fitcheck.core.activations.backward_grads import down_proj_numel
from fitcheck.core.states import FsdpBackward, accumulates_in_grad
from fitcheck.report import Phase
from fitcheck.spec import TrainingSpec

# Saved-for-backward scalars of the loss (backward._LOSS_SCALARS: the trace's grad seed + the loss, fp32)
_LOSS_SCALARS = 8


def fsdp_counted(spec: TrainingSpec) -> tuple[FsdpBackward, int] | None:
    """FSDP's bytes at backward's moments (``core/states/fsdp_backward.py`` ``fsdp_backward_held``) and what the
    components count in ``Phase.BACKWARD`` for the same things (the gradients, the gathered-unit buffer), which each
    moment subtracts; None where FSDP's moments are not modelled (the plain run's ``missing`` applies)."""
    from fitcheck.core.states import buffer_components, fsdp_backward_held, model_state_components

    # a layer's first weight gradient at its MLP backward: down_proj's (LoRA: the few r-wide rows of its adapter, if
    # any, left out)
    made = down_proj_numel(spec) if spec.lora is None and (
        not accumulates_in_grad(spec) or spec.batch.grad_accum == 1) else 0
    held = fsdp_backward_held(spec, made)
    if held is None:
        return None
    counted = sum(c.at(Phase.BACKWARD) for c in (*model_state_components(spec), *buffer_components(spec))
                  if c.name in ("gradients", "buffers.fsdp_unsharded_params"))
    return held, counted


def fsdp_reduce_moments(fsdp: tuple[FsdpBackward, int], outside: int, per_layer: int, layers: int,
                        residual_grad: int) -> dict[str, int]:
    """The tail unit's reduce-scatter (FSDP2: every layer's saved tensors alive) and FSDP1's top layer's reduction
    (the layers below it alive), each with the gradient entering the layer below (``residual_grad``).

    Args:
        fsdp: :func:`fsdp_counted`'s answer.
        outside: Saved bytes outside the layers that outlive the final norm's backward.
        per_layer: What one layer keeps to its backward (its saved tensors, or its checkpointed input).
        layers: Number of decoder layers.
        residual_grad: Bytes of the residual stream's gradient.

    Returns:
        Moment name -> bytes beside the states and the counted gradients and buffer.
    """
    held, counted = fsdp
    out: dict[str, int] = {}
    if held.tail_reduce is not None:
        out["tail reduce"] = outside + layers * per_layer + residual_grad - counted + held.tail_reduce + _LOSS_SCALARS
    if held.layer_reduce is not None:
        out["top layer reduce"] = (outside + (layers - 1) * per_layer + residual_grad - counted + held.layer_reduce
                                   + _LOSS_SCALARS)
    return out


def fsdp_embedding_moment(fsdp: tuple[FsdpBackward, int], during: int) -> int:
    """The larger of the input embedding's backward (``during``: its output's gradient and CUDA temporaries, beside
    what FSDP holds then) and the reduction at the end (FSDP2's embedding reduce-scatter, FSDP1's root flat
    gradient), less what the components count."""
    held, counted = fsdp
    return max(during + held.embedding, held.reduce_end) - counted + _LOSS_SCALARS
