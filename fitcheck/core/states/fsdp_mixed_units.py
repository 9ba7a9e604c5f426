"""FSDP1 units that hold frozen and trainable parameters together: the whole unit gets a gradient.

torch 2.13 ``distributed/fsdp/_flat_param.py``: ``FlatParamHandle._validate_tensors_to_flatten`` permits
non-uniform ``requires_grad`` under ``use_orig_params=True`` and gives the flat parameter the OR of its original
parameters' flags; ``_use_unsharded_views`` hands every module a view of the unsharded flat parameter, so autograd
produces one gradient for the whole flat parameter (the frozen weights' slices included), and the reduce-scatter
keeps a shard of the whole unit (``_use_sharded_grad_views`` only hides the frozen slices as ``grad=None``; the
storage stays). The ``FullyShardedDataParallel`` docstring: "For ``use_orig_params=True``, FSDP supports mixing
frozen and non-frozen parameters, but it's recommended to avoid doing so to prevent higher than expected gradient
memory usage". Under gradient accumulation, ``no_sync`` keeps each unit's unsharded gradient ("FSDP will
accumulate the full model gradients (instead of gradient shards) until the eventual sync",
``FullyShardedDataParallel.no_sync``).

The Hugging Face Trainer never builds such units: transformers 5.23 ``distributed/fsdp.py``
``update_fsdp_plugin_peft`` sets peft 0.21.2's ``fsdp_auto_wrap_policy`` (``utils/other.py``), whose lambda policy
wraps every leaf module whose weight requires grad (the LoRA A/B) in a unit of its own, leaving the decoder
layer's flat parameter all frozen. A wrap by decoder block alone builds them: Lightning Fabric's
``FSDPStrategy(auto_wrap_policy={Block})`` over litgpt's LoRA ``GPT`` (Fabric sets ``use_orig_params=True``,
``lightning/fabric/strategies/fsdp.py`` ``FSDPStrategy.__init__``). FSDP2 (``fully_shard``) shards per parameter
(DTensor), so a frozen parameter has no gradient there.
"""

from __future__ import annotations

from fitcheck.core.states.lora import plan_lora
from fitcheck.findings import Finding, Severity
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import Strategy, TrainingSpec
from fitcheck.units import format_bytes

SOURCE = (
    "torch 2.13 distributed/fsdp/_flat_param.py (use_orig_params=True: flat parameter requires_grad = OR of its "
    "parameters; one gradient for the whole flat parameter) and FullyShardedDataParallel.no_sync (unsharded "
    "gradients kept until the sync); transformers 5.23 distributed/fsdp.py update_fsdp_plugin_peft isolates "
    "LoRA layers, a wrap by decoder block does not"
)


def mixed_unit_frozen_params(spec: TrainingSpec) -> int:
    """Frozen parameters that share an FSDP1 unit with trainable ones, so they get a gradient.

    A LoRA adapter on any per-layer module makes every decoder-layer unit mixed (the unit is one decoder layer,
    adapters included); one on a module outside the layers (LM head, embeddings, ``modules_to_save``) makes the
    root unit mixed. Zero unless ``FsdpSpec.frozen_shares_units`` (FSDP1, ``use_orig_params=True``).

    Args:
        spec: The training spec.

    Returns:
        The number of frozen parameters whose gradient FSDP allocates.
    """
    fs = spec.sharding.fsdp
    if (spec.sharding.strategy is not Strategy.FSDP or fs is None or fs.version != 1 or not fs.use_orig_params
            or not fs.frozen_shares_units or spec.lora is None or spec.quant is not None):
        return 0
    plan = plan_lora(spec)
    layers_mixed = any(t.entry.per_layer for t in plan.targets) or any(s.entry.per_layer for s in plan.saved)
    root_mixed = any(not t.entry.per_layer for t in plan.targets) or any(not s.entry.per_layer for s in plan.saved)
    return sum(p.numel for p in spec.model.params if (layers_mixed if p.per_layer else root_mixed))


def mixed_unit_components(spec: TrainingSpec, divisor: int, unsharded_bytes: int, sharded_bytes: int,
                          kept_unsharded: bool) -> tuple[Component, ...]:
    """The gradients of frozen parameters in mixed FSDP1 units.

    Args:
        spec: The training spec.
        divisor: The gradient partition (FSDP's shard group).
        unsharded_bytes: Bytes per element of the unsharded gradient (the flat parameter's compute dtype).
        sharded_bytes: Bytes per element of the kept gradient shard (the flat parameter's stored dtype).
        kept_unsharded: Whether unsharded gradients are kept across accumulation micro-steps (``no_sync``).

    Returns:
        One component, or none when no unit mixes frozen and trainable parameters.
    """
    frozen = mixed_unit_frozen_params(spec)
    if not frozen:
        return ()
    sharded = -(frozen * sharded_bytes // -max(divisor, 1))
    full = frozen * unsharded_bytes
    accum = spec.batch.grad_accum > 1
    by_phase: dict[Phase, int] = {}
    for p in PHASES:
        if kept_unsharded and p is not Phase.OPTIMIZER_STEP:
            by_phase[p] = full
        elif p in (Phase.FORWARD_END, Phase.BACKWARD_START) and not accum:
            by_phase[p] = 0  # zero_grad(set_to_none=True) freed last step's shard
        else:
            by_phase[p] = sharded
    detail = (f"{frozen:,} frozen params share FSDP1 units with trainable ones: the flat parameter's gradient "
              f"covers them" + ("; unsharded across no_sync micro-steps" if kept_unsharded else
                                f", 1/{divisor} per GPU" if divisor > 1 else ""))
    return (Component("gradients.frozen_in_units", Category.GRADIENTS, Location.DEVICE, by_phase, SOURCE, detail),)


def mixed_unit_findings(spec: TrainingSpec, unsharded_bytes: int) -> tuple[Finding, ...]:
    """A warning when FSDP1 units mix frozen and trainable parameters.

    Args:
        spec: The training spec.
        unsharded_bytes: Bytes per element of the unsharded gradient.

    Returns:
        The finding, or none.
    """
    frozen = mixed_unit_frozen_params(spec)
    if not frozen:
        return ()
    return (
        Finding(
            "fsdp-frozen-in-trainable-units",
            Severity.WARNING,
            f"FSDP1 units hold frozen and trainable parameters together (use_orig_params=True): the gradient "
            f"covers all {frozen:,} frozen parameters too ({format_bytes(frozen * unsharded_bytes)} unsharded), "
            "as if they were not frozen",
            "wrap the LoRA modules in units of their own (peft's fsdp_auto_wrap_policy, which the Trainer sets) "
            "or use FSDP2",
        ),
    )
