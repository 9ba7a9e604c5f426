"""FSDP's gradients at backward's worst moment for traced activations (the default path); pure.

A trace of the plain step gives, at its backward peak, what is alive beside every gradient the plain run makes
(``torch_adapters/trace_result.py`` ``components_from_trace``: the live bytes less the states and the final
gradients); the estimate adds the model states' gradients and the gathered-unit buffer. An FSDP rank holds its
gradients otherwise at each moment (``core/states/fsdp_backward.py``: reduced fp32 shards, the unit's unsharded
gradients, the last reduce-scatter input), which the formula's moments count (``backward.backward_moments``). The
traced activations are shifted by what that changes in the formula's phase: the formula with FSDP's moments less
the formula with the plain run's, so a trace that agrees with the formula's plain moments gives the formula's
answer, and the trace's own difference from them is kept.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.report import Category, Component, Location, Phase
from fitcheck.spec import TrainingSpec


def fsdp_traced_backward(spec: TrainingSpec, traced: tuple[Component, ...]) -> tuple[Component, ...]:
    """The traced activation components with their ``Phase.BACKWARD`` shifted to FSDP's moments.

    Args:
        spec: The step's spec.
        traced: The traced activation components (``activations.traced``, ``logits.traced``,
            ``temporaries.traced``, ...).

    Returns:
        ``traced`` unchanged where ``core/states/fsdp_backward.py`` does not describe the run, else with the
        shift added to ``activations.traced`` (a negative one taken off the temporaries, the logits, then the
        activations, none below 0).
    """
    from fitcheck.core.activations.decoder import activation_components
    from fitcheck.core.states import fsdp_backward_applies

    if not fsdp_backward_applies(spec):
        return traced
    shift = _backward(activation_components(spec)) - _backward(activation_components(spec, fsdp_moments=False))
    if shift == 0:
        return traced
    out = list(traced)
    order = ("activations.traced",) if shift > 0 else ("temporaries.traced", "logits.traced", "activations.traced")
    for name in order:
        for i, c in enumerate(out):
            if c.name != name or c.location is not Location.DEVICE:
                continue
            now = c.at(Phase.BACKWARD)
            new = max(now + shift, 0)
            shift -= new - now
            out[i] = replace(c, by_phase={**c.by_phase, Phase.BACKWARD: new})
    return tuple(out)


def _backward(comps: tuple[Component, ...]) -> int:
    """Device bytes of activation-side components (activations, logits, temporaries) in ``Phase.BACKWARD``."""
    kinds = (Category.ACTIVATIONS, Category.LOGITS, Category.TEMPORARIES)
    return sum(c.at(Phase.BACKWARD) for c in comps if c.location is Location.DEVICE and c.category in kinds)
