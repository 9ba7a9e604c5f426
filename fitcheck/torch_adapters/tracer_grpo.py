"""TRL 1.16's GRPO step in the tracer: what ``GRPOTrainer.__init__`` does to the model, the log-prob pre-pass of
``_generate_and_score_completions`` and ``_compute_loss``.

``trl/trainer/grpo_trainer.py`` (TRL 1.16.0) runs a training step unlike SFT's and DPO's:

- ``__init__``: peft's ``get_peft_model`` (``tracer_build``), ``model.enable_input_require_grads()`` for PEFT with
  ``gradient_checkpointing``, a quantized base's trainable parameters cast to bf16, the policy's fused head
  ``add_fused_lm_head(outputs=("log_probs", "entropy"))`` on the base model (``tracer_trl.prepare_sft``: the same
  lines); the reference (``beta == 0``: none; under PEFT none, the adapters are disabled; else a second copy from
  ``create_model_from_path`` in the policy's dtype and attention, quantized like it, with its own fused head,
  log-probs only). ``GRPOConfig.disable_dropout`` defaults to False: dropout (LoRA's included) stays on.
- ``_prepare_inputs``: every ``steps_per_generation x num_iterations`` micro-batches (``self._step % generate_every
  == 0``) it generates for the whole generation batch (``per_device_train_batch_size x steps_per_generation`` rows),
  then ``_generate_and_score_completions`` runs, under ``torch.no_grad()`` and ``disable_gradient_checkpointing``, the
  old-policy log-probs (the policy, when ``gradient_accumulation_steps % generate_every != 0``) and the reference
  log-probs (``beta != 0``: the copy, or the policy inside ``use_adapter(model, None)``), each
  ``_get_per_token_logps_and_entropies`` over the generation batch in chunks of ``per_device_train_batch_size``
  rows (fused head, ``attention_mask``, labels masked to the completion); then ``shuffle_sequence_dict`` copies every
  tensor of the batch in a random order and ``split_tensor_dict`` slices it per micro-batch
  (``self._buffered_inputs``: alive until the next generation replaces it). The other micro-batches take their
  slice of that buffer: no pre-pass (the pre-pass storages are tagged :data:`allocator_compose.PREPASS` and
  ``allocator_compose.whole_run`` keeps them in the generating passes only).
- ``_compute_loss``: ``input_ids = cat(prompt_ids, completion_ids)``, the same for the attention mask, the policy's
  fused forward with entropies, the default ``dapo`` loss (token-level importance ratio ``exp(logps - old)``, its
  clip, the KL term ``exp(ref - logps) - (ref - logps) - 1`` times the ratio (``use_bias_correction_kl`` default
  True) when ``beta != 0``, the sum over the completion mask over ``num_items_in_batch``), and its metrics (the
  masked means of the KL and entropy, the clipped-ratio masks).

What is not the real code, and why: generation itself (``model.generate``: KV cache, sampling) is not traced here;
its phase is the formula's (``core/trainers/steps.py`` ``_generation``, ``Phase.GENERATION``), and the pre-pass
starts from its outputs (the new batch's ids and masks, allocated). The previous generation batch's buffer is
the traced step's inputs (tracked in the setup: the steady state, where one buffer is always alive and the
pre-pass builds the next beside it); the new buffer is freed at the pre-pass's end in its place. The metrics'
``.item()`` reads, ``accelerator.reduce`` / ``gather`` of one process and ``nanmin`` / ``nanmax`` (one- and
two-element tensors) are left out. The ``attention_mask`` is built but not passed to the model (all ones: the mask
transformers then skips, :meth:`GrpoStep._log_probs`); a batch with padding (completions of several lengths) is
another run, with the mask and SDPA's masked kernel, as for SFT and DPO. The tracer's own ``[B, L]`` int64
``input_ids`` input is kept (unused: the step builds its ids from the buffer, as the trainer does): ``8 x B x L``
bytes more than the real run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fitcheck.torch_adapters.tracer_dpo import DpoStep, reference_copy

GRPO_SOURCE = "trl 1.16.0 trl/trainer/grpo_trainer.py GRPOTrainer.__init__ / _generate_and_score_completions / " \
              "_compute_loss"
NO_REF = "none"  # beta == 0: no reference log-probs
EPSILON = 0.2  # GRPOConfig.epsilon default (epsilon_high defaults to it); no allocation depends on it


def old_policy_pass(grad_accum: int, steps_per_generation: int, num_iterations: int = 1) -> bool:
    """``_generate_and_score_completions`` computes the old policy's log-probs: ``gradient_accumulation_steps`` is not
    a multiple of ``steps_per_generation x num_iterations`` (without vLLM)."""
    return grad_accum % (steps_per_generation * num_iterations) != 0


def generating_passes(grad_accum: int, steps_per_generation: int, num_iterations: int = 1) -> Any:
    """Whether the replay's pass ``index`` (``step x passes + micro-batch``: ``allocator_compose.whole_run``)
    generates: ``_prepare_inputs``' ``self._step % (steps_per_generation x num_iterations) == 0`` on the trainer's
    micro-batch counter, with the replay's passes per step (``replayed_micro_batches``) standing for the first ones
    of the run's ``grad_accum``."""
    from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches

    passes = replayed_micro_batches(grad_accum)
    every = steps_per_generation * num_iterations

    def generates(index: int) -> bool:
        step, micro = divmod(index, passes)
        return (step * grad_accum + micro) % every == 0

    return generates


@dataclass
class GrpoStep(DpoStep):
    """The GRPO micro-step of a built model (``DpoStep``'s reference copy, its tracking and region hooks; the
    GRPO pre-pass and loss).

    Attributes:
        prompt: Prompt tokens of every row (``[B, prompt + completion]``).
        beta: ``GRPOConfig.beta``.
        chunks: Micro-batches per generation (``steps_per_generation``): the pre-pass runs over ``chunks x B`` rows.
        old_pass: The pre-pass computes the old policy's log-probs (:func:`old_policy_pass`).
        scale: ``current_gradient_accumulation_steps / steps_per_generation`` (dapo's normalizer).
        buffer: The buffered generation batch: prompt ids, prompt mask, completion ids, completion mask,
            advantages, ``num_items_in_batch``, then the old-policy and reference log-probs where computed.
    """

    prompt: int = 0
    beta: float = 0.0
    chunks: int = 1
    old_pass: bool = False
    scale: float = 1.0
    buffer: dict[str, Any] | None = None

    def inputs(self) -> list[Any]:
        """The buffered generation batch (tracked as inputs)."""
        return list((self.buffer or {}).values())

    def loss(self, ids: Any, _labels: Any) -> Any:
        """One micro-batch: the pre-pass (:meth:`prepass`, tagged), then ``GRPOTrainer._compute_loss``."""
        import torch

        from fitcheck.torch_adapters.allocator_compose import PREPASS
        from fitcheck.torch_adapters.tracer_recorder import tagged

        with tagged(PREPASS):
            self.prepass(ids.size(0))
        buf = self.buffer or {}
        rows = ids.size(0)
        # split_tensor_dict: the micro-batch's slice of each buffered tensor (a view)
        part = {k: (v[:rows] if v.dim() else v) for k, v in buf.items()}
        completion_mask = part["completion_mask"]
        input_ids = torch.cat([part["prompt_ids"], part["completion_ids"]], dim=1)
        attention_mask = torch.cat([part["prompt_mask"], completion_mask], dim=1)
        keep = completion_mask.size(1)
        mask = completion_mask
        per_token_logps, entropies = self._log_probs(self.model, input_ids, attention_mask, keep, rows, True)
        advantages = part["advantages"].unsqueeze(1)
        old = part.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        log_ratio = per_token_logps - old
        coef_1 = torch.exp(log_ratio)
        per_token_kl = None
        if self.beta != 0.0:
            ref = part["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
            per_token_kl = per_token_kl * coef_1  # use_bias_correction_kl (default True)
        coef_2 = torch.clamp(coef_1, 1 - EPSILON, 1 + EPSILON)
        per_token_loss1 = coef_1 * advantages
        per_token_loss2 = coef_2 * advantages
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
        if per_token_kl is not None:
            per_token_loss = per_token_loss + self.beta * per_token_kl
        normalizer = part["num_items_in_batch"].clamp(min=1.0) / 1  # / accelerator.num_processes
        normalizer = normalizer * self.scale
        loss = (per_token_loss * mask).sum() / normalizer
        policy_loss = loss.detach()

        def global_masked_mean(x: Any) -> Any:  # the .item() and accelerator.reduce of one process left out
            totals = torch.stack([(x * mask).sum(), mask.sum().float()])
            return totals[0] / totals[1].clamp(min=1.0)

        def masked_seq_mean(x: Any) -> Any:
            return (x * mask).sum(-1) / mask.sum(-1)

        metrics = [policy_loss]
        if per_token_kl is not None:
            metrics.append(global_masked_mean(per_token_kl))
        metrics.append(global_masked_mean(entropies))
        is_low_clipped = (coef_1 < 1 - EPSILON) & (advantages < 0)
        is_high_clipped = (coef_1 > 1 + EPSILON) & (advantages > 0)
        is_region_clipped = is_low_clipped | is_high_clipped
        metrics += [global_masked_mean(is_low_clipped.float()), global_masked_mean(is_high_clipped.float()),
                    global_masked_mean(is_region_clipped.float()), masked_seq_mean(is_low_clipped.float()),
                    masked_seq_mean(is_high_clipped.float())]
        del metrics
        return loss

    def prepass(self, rows: int) -> None:
        """``_generate_and_score_completions`` after ``generate``: the new batch's ids and masks, the old-policy and
        reference log-prob passes (``no_grad``, checkpointing disabled) over ``chunks x rows`` rows in chunks of
        ``rows``, ``shuffle_sequence_dict``'s copies; the new buffer then replaces the old (module docstring)."""
        if self.reference == NO_REF and not self.old_pass:
            new = self._new_batch(rows)
            shuffled = self._shuffled(new)
            del new, shuffled
            return
        import torch

        new = self._new_batch(rows)
        prompt_completion_ids = torch.cat([new["prompt_ids"], new["completion_ids"]], dim=1)
        attention_mask = torch.cat([new["prompt_mask"], new["completion_mask"]], dim=1)
        keep = new["completion_ids"].size(1)
        if self.old_pass:  # the policy as it is (adapters on)
            with self.no_grad_pass(adapters_off=False):
                new["old_per_token_logps"] = self._log_probs(self.model, prompt_completion_ids, attention_mask,
                                                             keep, rows, False)[0]
        if self.reference != NO_REF:  # DpoStep.reference_model: no_grad_pass, adapters off or the copy
            with self.reference_model() as model:
                new["ref_per_token_logps"] = self._log_probs(model, prompt_completion_ids, attention_mask, keep,
                                                             rows, False)[0]
        del prompt_completion_ids, attention_mask
        shuffled = self._shuffled(new)
        del new, shuffled

    def _new_batch(self, rows: int) -> dict[str, Any]:
        """What ``_generate_and_score_completions`` builds from ``generate``'s output: the padded prompt and
        completion ids and masks (int64), the advantages (fp32) and ``num_items_in_batch``."""
        import torch

        buf = self.buffer or {}
        return {k: torch.zeros_like(buf[k]) for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                      "completion_mask", "advantages", "num_items_in_batch")}

    def _shuffled(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``shuffle_sequence_dict``: every tensor with a first dimension indexed by one permutation (a copy)."""
        import torch

        size = batch["prompt_ids"].size(0)
        permutation = torch.randperm(size)
        return {k: (v[permutation] if v.dim() else v) for k, v in batch.items()}

    def _log_probs(self, model: Any, input_ids: Any, attention_mask: Any, keep: int, rows: int,
                   entropy: bool) -> tuple[Any, Any]:
        """``_get_per_token_logps_and_entropies``: fused forwards over chunks of ``rows`` rows, the completion's
        log-probs (and entropies) concatenated."""
        import torch

        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), rows):
            end = min(start + rows, input_ids.size(0))
            input_ids_batch = input_ids[start:end]
            attention_mask_batch = attention_mask[start:end]
            labels = input_ids_batch.masked_fill(attention_mask_batch == 0, -100)
            labels[:, :-keep] = -100
            # attention_mask not passed: the batch is of one length (all ones), where transformers skips the mask
            # (masking_utils._ignore_causal_mask_sdpa: fast_all(padding_mask)) and SDPA runs is_causal; a fake
            # tensor never skips it (is_tracing), which would trace the masked kernel the run does not take
            outputs = model(input_ids=input_ids_batch, labels=labels, fused_lm_head=True)
            all_logps.append(outputs.log_probs[:, -keep:])
            if entropy:
                all_entropies.append(outputs.entropy[:, -keep:])
        logps = torch.cat(all_logps, dim=0)
        entropies = torch.cat(all_entropies, dim=0) if entropy else None
        return logps, entropies


def prepare_grpo(model: Any, outputs: tuple[str, ...], rows: int, seq_len: int, plan: tuple[Any, ...], *,
                 build_reference: Any, quantized: bool, checkpointing: bool, use_reentrant: bool) -> GrpoStep:
    """Apply what ``GRPOTrainer.__init__`` does to the built model before step 1 (module docstring).

    Args:
        model: ``tracer_build.build_model``'s model (PEFT-wrapped where the run trains adapters).
        outputs: The policy's fused-head outputs (``core.trainers.trainer_row(kind).fused_head``).
        rows: ``per_device_train_batch_size`` (completions per micro-batch).
        seq_len: Prompt + completion tokens per row.
        plan: ``tracer.trace_step``'s ``trl_grpo``: (the reference: :data:`NO_REF`, ``ADAPTERS_OFF`` or
            ``MODEL_REF``, prompt tokens, ``beta``, ``steps_per_generation``, :func:`old_policy_pass`, bytes of
            the copy's loading warm-up block, ``gradient_accumulation_steps``).
        build_reference: Builds the reference copy (``MODEL_REF``): the model as ``create_model_from_path`` loads
            it, without adapters or checkpointing.
        quantized: The base is bitsandbytes-quantized.
        checkpointing: ``gradient_checkpointing``.
        use_reentrant: ``gradient_checkpointing_kwargs["use_reentrant"]``.

    Returns:
        The step.
    """
    import torch
    from trl.trainer.utils import add_fused_lm_head

    from fitcheck.torch_adapters.tracer_trl import prepare_sft

    reference, prompt, beta, chunks, old_pass, warmup, grad_accum = plan
    policy = prepare_sft(model, outputs, quantized=quantized, checkpointing=checkpointing)
    ref_model = reference_copy(reference, build_reference)  # GRPOConfig.disable_dropout: False, dropout stays
    if ref_model is not None:
        add_fused_lm_head(ref_model)
    total, completion = rows * chunks, seq_len - prompt
    buffer = {"prompt_ids": torch.zeros(total, prompt, dtype=torch.int64),
              "prompt_mask": torch.ones(total, prompt, dtype=torch.int64),
              "completion_ids": torch.zeros(total, completion, dtype=torch.int64),
              "completion_mask": torch.ones(total, completion, dtype=torch.int64),
              "advantages": torch.zeros(total),
              "num_items_in_batch": torch.tensor(total * completion)}
    if old_pass:
        buffer["old_per_token_logps"] = torch.zeros(total, completion)
    if reference != NO_REF:
        buffer["ref_per_token_logps"] = torch.zeros(total, completion)
    kwargs = {"use_reentrant": use_reentrant} if checkpointing else {}
    return GrpoStep(model, policy.backbone, buffer["completion_mask"], reference, ref_model, kwargs, None, (),
                    warmup, prompt=prompt, beta=beta, chunks=chunks, old_pass=old_pass,
                    scale=grad_accum / chunks, buffer=buffer)
