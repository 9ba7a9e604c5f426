"""TRL 1.16's KTO step in the tracer: what ``KTOTrainer.__init__`` does to the model, and its ``_compute_loss``.

``trl/trainer/kto_trainer.py`` (TRL 1.16.0) prepares the model as ``DPOTrainer`` does (``tracer_dpo.prepare_dpo``:
peft's input-grad hook under checkpointing, a quantized base's adapters in bf16, the reference copy
``create_model_from_path`` loads when ``ref_model is None`` without PEFT or ``precompute_ref_log_probs``,
``disable_dropout_in_model``, ``add_fused_lm_head(outputs=("log_probs", "entropy", "mean_logits"))`` on the policy
and ``add_fused_lm_head(ref_model)``) and runs a step of its own (``_compute_loss``):

- ``DataCollatorForUnpairedPreference``: one (unpaired) completion per row, ``[B, L]`` ``input_ids`` /
  ``completion_mask``, a ``label`` bool per row (desirable or not) and, where the loss estimates the KL term
  (``calculate_KL = loss_type not in ["apo_zero_unpaired"]``, ``KTOTrainer.__init__``), the mismatched
  ``KL_input_ids`` / ``KL_completion_mask`` (each prompt with its neighbour's completion: ``_prepare_dataset``'s
  ``add_kl_completion_ids``; one completion length: the same ``[B, L]``);
- ``_compute_kl_logps(model, batch)``: a ``torch.no_grad()`` forward of the policy on the KL rows (checkpointing
  still enabled, adapters on), before the policy's own forward; its per-row sums kept;
- the policy forward with the fused head (``labels = input_ids.masked_fill(completion_mask == 0, -100)``), its
  per-row sums split by ``chosen_idx = torch.nonzero(label)`` / ``rejected_idx`` (``index_select``);
- the reference pass under ``torch.no_grad()`` and ``disable_gradient_checkpointing(self.model)``: its own KL
  forward, then the completions' forward, on the copy, or under PEFT on the policy inside ``use_adapter(model,
  None)``; with ``precompute_ref_log_probs`` the batch's ``ref_logps`` / ``ref_KL_logps`` instead;
- the ``kto`` loss (``1 - sigmoid(beta * (logratio - kl))`` for desirable rows, ``1 - sigmoid(beta * (kl -
  logratio))`` for the others; ``apo_zero_unpaired`` without the KL), and the metrics (entropy, mean logits of
  the chosen / rejected rows: ``index_select`` copies of ``[rows, L - 1]``). Every local lives to the return.

What is not the real code, and why (all ``[B, L]`` or smaller): ``torch.nonzero`` has a data-dependent shape,
which fake tensors cannot run: ``chosen_idx`` / ``rejected_idx`` are ``arange`` int64 tensors of the batch's
counts (:attr:`KtoStep.desirable`: the same bytes; which rows they pick does not change a size; the two
``index_select`` copies of every ``[B, L - 1]`` tensor hold ``B`` rows together whatever the split); the boolean
index of the mean-logits metric is a masked ``where`` (``tracer_dpo``'s); the ``.item()`` reads, the
``gather_for_metrics`` of one process and ``attention_mask`` (all ones in a batch of one length) are left out,
as in the DPO trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fitcheck.torch_adapters.tracer_dpo import PRECOMPUTED, DpoStep, prepare_dpo
from fitcheck.torch_adapters.tracer_trl_plans import DpoPlan, KtoPlan

KTO_SOURCE = "trl 1.16.0 trl/trainer/kto_trainer.py KTOTrainer.__init__ / _compute_kl_logps / _compute_loss"
KTO_BETA = 0.1  # KTOConfig.beta default; no allocation depends on it

def desirable_rows(rows: int) -> int:
    """Desirable rows assumed in a batch of ``rows``: half, rounded up (the split is the data's, which no setting
    gives; KTOTrainer's ``_prepare_dataset`` warns when the dataset's balance and the loss weights disagree). No
    allocation of the step depends on it beyond a few bytes: the ``index_select`` copies of the desirable and the
    undesirable rows hold ``rows`` rows together whatever the split (module docstring)."""
    return (rows + 1) // 2


@dataclass
class KtoStep(DpoStep):
    """The KTO step of a built model (:class:`tracer_dpo.DpoStep`'s fields, one row per example).

    Attributes:
        kl_ids: ``KL_input_ids`` ``[B, L]`` int64 (None: no KL batch).
        kl_completion_mask: ``KL_completion_mask`` (None: no KL batch).
        labels: The batch's ``label`` ``[B]`` bool.
        desirable: Desirable rows in the batch (``label`` True).
    """

    kl_ids: Any = None
    kl_completion_mask: Any = None
    labels: Any = None
    desirable: int = 0

    def inputs(self) -> list[Any]:
        """The batch's tensors besides ``input_ids`` (tracked as inputs)."""
        kl = [] if self.kl_ids is None else [self.kl_ids, self.kl_completion_mask]
        return [self.completion_mask, *kl, self.labels, *self.ref_logps]

    def _kl_logps(self, model: Any) -> Any:
        """``_compute_kl_logps``: the KL rows' no_grad forward of ``model``, summed per row (None: no KL)."""
        import torch

        if self.kl_ids is None:
            return None
        kl_labels = self.kl_ids.masked_fill(self.kl_completion_mask == 0, -100)
        with torch.no_grad():
            kl_per_token_logps = model(input_ids=self.kl_ids, use_cache=False, labels=kl_labels,
                                       fused_lm_head=True).log_probs
        return kl_per_token_logps[:, -(kl_labels.size(1) - 1):].sum(-1)

    def loss(self, ids: Any, _labels: Any) -> Any:
        """``KTOTrainer._compute_loss`` (module docstring)."""
        import torch
        import torch.nn.functional as F

        rows = ids.size(0)
        num_chosen = self.labels.sum()
        num_rejected = rows - num_chosen
        kl_logps = self._kl_logps(self.model)
        completion_labels = ids.masked_fill(self.completion_mask == 0, -100)
        outputs = self.model(input_ids=ids, use_cache=False, labels=completion_labels, fused_lm_head=True)
        seq_len = ids.size(1) - 1
        per_token_logps = outputs.log_probs[:, -seq_len:]
        completion_logps = per_token_logps.sum(-1)
        bool_labels = torch.as_tensor(self.labels, dtype=torch.bool)
        chosen_idx = torch.arange(self.desirable)  # torch.nonzero(bool_labels).view(-1): module docstring
        rejected_idx = torch.arange(self.desirable, rows)
        chosen_logps = completion_logps.index_select(0, chosen_idx)
        rejected_logps = completion_logps.index_select(0, rejected_idx)
        if self.reference == PRECOMPUTED:
            ref_chosen_logps = self.ref_logps[0].index_select(0, chosen_idx)
            ref_rejected_logps = self.ref_logps[0].index_select(0, rejected_idx)
            ref_kl_logps = self.ref_logps[1] if kl_logps is not None else None
        else:
            ref_kl_logps, ref_outputs = self._reference_pass(ids, completion_labels)
            ref_completion_logps = ref_outputs.log_probs[:, -seq_len:].sum(-1)
            ref_chosen_logps = ref_completion_logps.index_select(0, chosen_idx)
            ref_rejected_logps = ref_completion_logps.index_select(0, rejected_idx)
        kl = ((kl_logps - ref_kl_logps).mean().detach().mean().clamp(min=0) if kl_logps is not None
              else torch.zeros(1))
        chosen_logratios = chosen_logps - ref_chosen_logps
        rejected_logratios = rejected_logps - ref_rejected_logps
        if kl_logps is not None:  # kto
            chosen_losses = 1 - F.sigmoid(KTO_BETA * (chosen_logratios - kl))
            rejected_losses = 1 - F.sigmoid(KTO_BETA * (kl - rejected_logratios))
        else:  # apo_zero_unpaired
            chosen_losses = 1 - F.sigmoid(KTO_BETA * chosen_logratios)
            rejected_losses = F.sigmoid(KTO_BETA * rejected_logratios)
        chosen_rewards = KTO_BETA * chosen_logratios.detach()
        rejected_rewards = KTO_BETA * rejected_logratios.detach()
        losses = torch.cat((1.0 * chosen_losses, 1.0 * rejected_losses), 0)
        per_token_entropy = outputs.entropy[:, -seq_len:].detach()  # the metrics
        mask = self.completion_mask[:, 1:]
        entropy_sum = (per_token_entropy * mask).sum()
        total_tokens = mask.sum()
        mean_logits = outputs.mean_logits[:, -seq_len:]
        chosen_mean_logits = mean_logits.index_select(0, chosen_idx)
        rejected_mean_logits = mean_logits.index_select(0, rejected_idx)
        chosen_mask = mask.index_select(0, chosen_idx)
        rejected_mask = mask.index_select(0, rejected_idx)
        total_chosen_logits = torch.where(chosen_mask.bool(), chosen_mean_logits, 0).sum()
        total_rejected_logits = torch.where(rejected_mask.bool(), rejected_mean_logits, 0).sum()
        sums = (chosen_mask.sum(), rejected_mask.sum(), chosen_rewards.nansum(), chosen_logps.nansum(),
                rejected_rewards.nansum(), rejected_logps.nansum())
        del num_rejected, bool_labels, entropy_sum, total_tokens, total_chosen_logits, total_rejected_logits, sums
        return losses.nanmean()

    def _reference_pass(self, ids: Any, labels: Any) -> tuple[Any, Any]:
        """The reference's KL forward, then its completions' forward (``tracer_dpo.DpoStep.reference_model``: the
        copy, or the policy with its adapters disabled)."""
        with self.reference_model() as model:
            ref_kl_logps = self._kl_logps(model)
            return ref_kl_logps, model(input_ids=ids, use_cache=False, labels=labels, fused_lm_head=True)

    def precompute(self, ids: Any, autocast: Any) -> None:
        """``precompute_ref_log_probs``: ``_precompute_ref_logps``'s ``compute_ref_log_probs`` over one batch,
        before step 1 and before the optimizer exists: ``torch.no_grad()``, the policy's checkpointing disabled,
        its adapters disabled under PEFT, ``accelerator.autocast()``; the completions' forward, then (its log-probs
        still held) the KL rows' forward; the per-row sums go to the CPU (``tracer_dpo.DpoStep.precompute``)."""
        if self.reference != PRECOMPUTED:
            return
        with self.no_grad_pass(adapters_off=True), autocast:
            labels = ids.masked_fill(self.completion_mask == 0, -100)
            per_token_logps = self.model(input_ids=ids, labels=labels, fused_lm_head=True).log_probs
            kl_per_token_logps = None
            if self.kl_ids is not None:
                kl_labels = self.kl_ids.masked_fill(self.kl_completion_mask == 0, -100)
                kl_per_token_logps = self.model(input_ids=self.kl_ids, labels=kl_labels, fused_lm_head=True).log_probs
        completion_logps = per_token_logps[:, -(ids.size(1) - 1):].sum(-1)
        kl_logps = None if kl_per_token_logps is None else kl_per_token_logps[:, -(ids.size(1) - 1):].sum(-1)
        del per_token_logps, kl_per_token_logps, completion_logps, kl_logps


def prepare_kto(model: Any, outputs: tuple[str, ...], rows: int, seq_len: int, plan: KtoPlan, **kwargs: Any) -> KtoStep:
    """Apply what ``KTOTrainer.__init__`` does to the built model before step 1 (``tracer_dpo.prepare_dpo``: the
    same lines) and build the KTO batch (module docstring).

    Args:
        model: ``tracer_build.build_model``'s model (PEFT-wrapped where the run trains adapters).
        outputs: The policy's fused-head outputs (``core.trainers.trainer_row(kind).fused_head``).
        rows: Rows of the step (one completion each).
        seq_len: Tokens per row.
        plan: ``tracer.trace_step``'s ``trl_kto`` (``tracer_dpo.dpo_reference``, prompt tokens, ``calculate_KL``:
            ``core.trainers.calculates_kl``, bytes of the copy's loading warm-up block, desirable rows).
        **kwargs: ``prepare_dpo``'s keyword arguments (the reference builder, quantized, checkpointing).

    Returns:
        The step.
    """
    import torch

    reference, kl, desirable = plan.reference, plan.calculate_kl, plan.desirable
    dpo = prepare_dpo(model, outputs, rows, seq_len, DpoPlan(reference, plan.prompt, None, plan.warmup), **kwargs)
    labels = torch.zeros(rows, dtype=torch.bool)  # DataCollatorForUnpairedPreference: torch.tensor of bools
    labels[:desirable] = True
    kl_ids = kl_mask = None
    if kl:  # the KL rows: each prompt with its neighbour's completion, the same length
        kl_ids = torch.zeros(rows, seq_len, dtype=torch.int64)
        kl_mask = dpo.completion_mask.clone()
    # the collator's ref_logps / ref_KL_logps: torch.tensor of the rows' floats (fp32)
    ref_logps = tuple(torch.zeros(rows) for _ in range(1 + bool(kl))) if reference == PRECOMPUTED else ()
    return KtoStep(dpo.model, dpo.backbone, dpo.completion_mask, reference, dpo.ref_model, dpo.checkpointing_kwargs,
                   None, ref_logps, plan.warmup, kl_ids, kl_mask, labels, desirable)
