"""The step a whole run repeats, as the tracer is asked for it, and what the load leaves before it.

:func:`run_trace_kwargs`: the ``tracer.trace_step`` arguments of the step (the plain Trainer's, TRL's SFT / DPO /
KTO / GRPO / reward step); :func:`load_warmup`: ``caching_allocator_warmup``'s block, allocated and freed before the
parameters as ``from_pretrained`` runs it. Read by the replays of :mod:`.allocator_replay` (steps at two layer
groups, the full-depth trace) and :mod:`.allocator_whole_run` (the whole run composed from one-step traces).
"""

from __future__ import annotations

from typing import Any

from fitcheck.core.loading import allocator_conf
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters.tracer_trl_plans import DpoPlan, GrpoPlan, KtoPlan


def run_trace_kwargs(spec: TrainingSpec) -> dict[str, Any]:
    """The ``tracer.trace_step`` arguments of the step the whole run repeats: the plain Trainer's
    (``trace_arguments.trace_kwargs``), or TRL's SFTTrainer / DPOTrainer / KTOTrainer step (``tracer_trl`` /
    ``tracer_dpo`` / ``tracer_kto``: its model preparation and fused LM head, ``trl_head`` the outputs it patches the
    model with; DPO's reference and prompt, ``trl_dpo``; KTO's, its KL batch and desirable rows, ``trl_kto``), or
    GRPOTrainer's micro-step with its log-prob pre-pass (``trl_grpo``: ``tracer_grpo``), or RewardTrainer's
    sequence-classification step (the registry's ``classifier``: the seq-cls task, as
    ``trace_arguments.activation_trace_kwargs``) at the shape it runs (``core.trainers.step_spec``: DPO's and the reward
    trainer's chosen + rejected rows, GRPO's prompt + completion)."""
    from fitcheck.core.trainers import step_spec, trainer_row
    from fitcheck.torch_adapters.trace_arguments import trace_kwargs

    t = spec.trainer
    row = trainer_row(t.kind)
    if row.classifier:  # the reward trainer: the seq-cls model on chosen + rejected rows (as activation_trace_kwargs)
        return {**trace_kwargs(step_spec(spec)), "task": "seq-cls"}
    if row.replay_step is None or row.fused_head is None:  # the registry's column: SFT's, DPO's, KTO's, GRPO's
        return trace_kwargs(spec)
    kwargs = {**trace_kwargs(step_spec(spec)), "trl_head": row.fused_head}
    if row.replay_step == "tracer_grpo":
        plan = _grpo_plan(spec)
        return {**kwargs, "trl_grpo": plan} if plan else trace_kwargs(spec)
    if row.replay_step in ("tracer_dpo", "tracer_kto"):
        from fitcheck.spec import Strategy
        from fitcheck.torch_adapters.tracer_dpo import dpo_reference

        if spec.sharding.strategy in (Strategy.DEEPSPEED, Strategy.FSDP):
            # the reference copy is prepare_deepspeed's / prepare_fsdp's there, which no rewrite describes
            # (run_scope.not_replayed): the rewrites keep the plain step they composed before
            return trace_kwargs(spec)

        reference = dpo_reference(spec.lora is not None, t.precompute_ref_log_probs)
        # the copy is loaded like the policy (create_model_from_path: device_map "auto" on a GPU), so its
        # from_pretrained runs caching_allocator_warmup too: the block of load_warmup, at the same size
        warm = load_warmup(spec)
        block = warm[0][1] if warm else 0
        if row.replay_step == "tracer_dpo":
            kwargs["trl_dpo"] = DpoPlan(reference, t.prompt_length, t.rpo_alpha, block)
        else:
            from fitcheck.core.trainers import calculates_kl
            from fitcheck.torch_adapters.tracer_kto import desirable_rows

            rows = kwargs["micro_batch"]
            kwargs["trl_kto"] = KtoPlan(reference, t.prompt_length, calculates_kl(t.loss_type), block,
                                        desirable_rows(rows))
    return kwargs


def _grpo_plan(spec: TrainingSpec) -> GrpoPlan | None:
    """``trace_step``'s ``trl_grpo`` for a GRPO run (``tracer_grpo.prepare_grpo``'s plan); None under DeepSpeed/FSDP,
    as DPO's (the reference copy is ``prepare_deepspeed``'s / ``prepare_fsdp``'s there: the plain step is kept)."""
    from fitcheck.core.trainers import grpo_steps_per_generation, has_reference_copy
    from fitcheck.spec import Strategy
    from fitcheck.torch_adapters.tracer_dpo import ADAPTERS_OFF, MODEL_REF
    from fitcheck.torch_adapters.tracer_grpo import NO_REF, old_policy_pass

    if spec.sharding.strategy in (Strategy.DEEPSPEED, Strategy.FSDP):
        return None
    t = spec.trainer
    accum = spec.batch.grad_accum
    chunks = grpo_steps_per_generation(spec)
    warm = load_warmup(spec)  # the copy's from_pretrained runs caching_allocator_warmup too (as DPO's)
    # GRPOTrainer.__init__'s reference block: none with beta 0, else the registry's rule (a copy, or adapters off)
    reference = NO_REF if t.beta == 0.0 else (MODEL_REF if has_reference_copy(spec) else ADAPTERS_OFF)
    return GrpoPlan(reference, t.prompt_length, t.beta, chunks, old_policy_pass(accum, chunks),
                    warm[0][1] if warm else 0, accum)


def load_warmup(spec: TrainingSpec) -> list[tuple[int, int, str]]:
    """``caching_allocator_warmup``'s block, allocated and freed before the parameters, as ``from_pretrained`` runs
    it (``core.loading.load_events``: transformers 5.23 ``modeling_utils.py``): the parameters are then carved out
    of one segment (best fit, split) instead of each taking a segment of its own rounded to 2 MiB. Without it the
    replay of Phi-2's step (bf16, 128 attention weights of 12.5 MiB in 14 MiB segments) started 190 MiB above the
    5304 MiB the H200 measured after loading, and Qwen2.5-0.5B's 36 MiB above (``gpu_truth_nvidia_h200.json``,
    ``load_end_reserved``).

    None where the load phase is not one device's ``from_pretrained`` (``loads_on_one_device``: FSDP, DeepSpeed,
    tp/cp/sp), under ``max_split_size_mb``, where the block stays cached beside the step's segments and the load
    phase adds it (``LoadPhase.oversize_cached``, ``run_reserved``), and for a base quantized on load, whose
    16-bit copies are materialised and freed inside the block (``core.loading.load_events``), which the trace's
    setup (the packed weights only) does not describe: on the H100's Llama-3.2-1B QLoRA row
    (``gpu_truth_nvidia_h100_80gb_hbm3.json``) the block alone moved reserved from -0.55 % to -1.46 %, the load's
    own events replayed first to -1.35 %.

    Args:
        spec: The training spec.

    Returns:
        ``(serial, +bytes / -bytes, "setup")`` events to put before the trace's own.
    """
    from fitcheck.core.loading import loads_on_one_device, warmup_bytes

    if not loads_on_one_device(spec) or allocator_conf(spec).max_split_size is not None or spec.quant is not None:
        return []
    warm = warmup_bytes(spec, spec.hardware.gpu_memory_bytes)  # the block load_events starts with
    return [(-1, warm, "setup"), (-1, -warm, "setup")] if warm else []
