"""The reference model under FSDP2: TRL 1.16 shards it as ONE unit, so each reference forward gathers all of it.

``trl/models/utils.py prepare_fsdp`` (TRL 1.16) wraps the reference with ``fully_shard(model, ...)`` on the root
module only (FSDP2 branch, L313-338; the FSDP1 branch sets the plugin's auto-wrap policy, one unit per decoder
layer). With one parameter group, ``FSDPParamGroup.pre_forward`` all-gathers every reference parameter before the
forward and ``post_forward`` reshards them after it (torch 2.13 ``_fully_shard/_fsdp_param_group.py``;
accelerate's FSDP2 default ``reshard_after_forward=True`` keeps them sharded between forwards). So while a
reference forward runs (DPO/KTO: after the policy's forward, on top of its saved activations; GRPO: the reference
log-prob pass after ``generate``), each GPU holds the whole reference in the load dtype. That transient is not in
the phases; this finding states its size.
"""

from __future__ import annotations

from fitcheck.core.states import partition
from fitcheck.findings import Finding, Severity
from fitcheck.spec import Strategy, TrainerKind, TrainingSpec
from fitcheck.units import format_bytes


def reference_fsdp2_finding(spec: TrainingSpec, has_reference_copy: bool) -> Finding | None:
    """A warning with the whole-reference gather of an FSDP2 run that keeps a reference copy, else None."""
    sh = spec.sharding
    if not has_reference_copy or sh.strategy is not Strategy.FSDP or (sh.fsdp is not None and sh.fsdp.version != 2):
        return None
    part = partition(spec)
    if part.weights <= 1:
        return None
    full = spec.model.total_params * spec.precision.load_dtype.nbytes
    extra = full - -(-full // part.weights)
    when = ("during the reference log-prob pass after generate" if spec.trainer.kind is TrainerKind.GRPO
            else "during the reference forward, on top of the policy's saved activations")
    return Finding(
        "fsdp2-reference-gathered-whole", Severity.WARNING,
        f"TRL 1.16 prepare_fsdp wraps the reference model as one FSDP2 unit (fully_shard on the root only): each "
        f"reference forward all-gathers all of it, {format_bytes(extra)} per GPU beyond its shard, {when}; this "
        "transient is not in the phases above",
        "use --precompute_ref_log_probs (DPO/KTO) or --use_peft (the reference is the base with adapters "
        "disabled), or FSDP1 (accelerate --fsdp_version 1 / fsdp_config version 1: the reference is wrapped per "
        "decoder layer)")
