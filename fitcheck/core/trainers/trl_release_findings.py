"""What the stack's TRL release changes in a ``--trainer dpo`` / ``reward`` run, as findings (pure).

The release rules are ``core/states/trl_adapters.py``'s; a release whose step is modelled gets an info here, and
``activations/versions.py`` drops its ``versions-not-modelled`` warning (``trl_release_modelled``); any other keeps
that warning, which unpins the answer (``core/estimator.py``). SFT's are ``sft_metrics.sft_release_findings``.
"""

from __future__ import annotations

from fitcheck.core.states import MODELLED_TRL, DpoLoss, reward_step_modelled, trl_release
from fitcheck.core.trainers.dpo_releases import dpo_release_layout
from fitcheck.findings import Finding, Severity
from fitcheck.spec import TrainerKind, TrainingSpec

_WHAT = {
    DpoLoss.CONCATENATED_FORWARD: "concatenated_forward with output_hidden_states: the fp32 logits and hidden states "
                                  "of the policy, then of the reference",
    DpoLoss.SHIFTED_COPIES: "_compute_loss: the policy's and the reference's fp32 logits and shifted copies, then "
                            "entropy over the policy's",
    DpoLoss.SHIFTED_VIEWS: "_compute_loss: the policy's and the reference's fp32 logits, then entropy over a copy of "
                           "the policy's shifted view",
}


def dpo_release_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """What the stack's TRL release changes in a ``--trainer dpo`` run (an info where modelled; an unmodelled release
    keeps the ``versions-not-modelled`` warning, ``activations/versions.py``, which unpins it)."""
    layout = dpo_release_layout(spec)
    if layout is None:
        return ()
    name = f"trl {spec.stack.get('trl')} ({spec.stack.source})"
    out = [Finding(
        "versions-modelled", Severity.INFO,
        f"{name}: DPOTrainer computes its log-probs from the full logits ({_WHAT[layout]}; "
        "core/trainers/dpo_releases.py)")]
    if spec.trainer.eval_batch_size is not None:  # prediction_step runs the same full-logits forwards, unmeasured
        out.append(Finding(
            "not-modelled", Severity.WARNING,
            f"{name}: DPOTrainer's evaluation step of this release (the same full-logits forwards under no_grad) is "
            "not modelled; the evaluation phase is estimated as TRL 1.16's",
            "pass --stack trl=1.16 to ask about the modelled release, or measure an evaluation"))
    return tuple(out)


def reward_release_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """An info for ``--trainer reward`` at a release other than 1.16 that runs its step (``reward_step_modelled``,
    ``core/states/trl_adapters.py``: one forward of chosen + rejected from 0.24); an older one keeps the
    ``versions-not-modelled`` warning."""
    release = trl_release(spec)
    if spec.trainer.kind is not TrainerKind.REWARD or release is None or release[:2] == MODELLED_TRL \
            or not reward_step_modelled(release):
        return ()
    return (Finding(
        "versions-modelled", Severity.INFO,
        f"trl {spec.stack.get('trl')} ({spec.stack.source}): RewardTrainer runs chosen + rejected as one forward "
        "(from TRL 0.24), as TRL 1.16 does (core/trainers/reward_step.py)"),)
