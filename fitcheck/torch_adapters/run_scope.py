"""What of a run the tracer and the whole-run allocator replay describe (``PinnedPath``, ``verdict_replay``).

- :func:`traceable`: what the default path may trace (the plain Trainer step of a text model with transformers'
  loss); :func:`untraced_parts` names what no trace describes.
- :func:`plain_trainer_run`: the whole run is the plain Trainer's, as ``allocator_whole_run.replay_whole_run``
  composes it (torch's optimizer on the module's own parameters).
- :func:`replayed_run`: the whole run ``replay_whole_run`` describes: the plain Trainer's, TRL's SFTTrainer's
  (its model preparation, fused LM head and loss traced: ``tracer_trl``), DPOTrainer's (its reference copy or
  adapters-off pass, concatenated chosen + rejected rows and loss: ``tracer_dpo``), KTOTrainer's (the same
  reference, the KL batch's no_grad forwards, the desirable / undesirable split: ``tracer_kto``) or GRPOTrainer's
  (the log-prob pre-pass after each generation and the loss: ``tracer_grpo``; ``generate`` is the formula's
  generation phase);
  :func:`not_replayed` says which part of any other run the replay leaves out.
- :func:`accumulates_in_grad`: a later micro-step of the run's accumulation window adds into ``.grad`` as torch does
  (the core's one rule, ``core/states/accumulation.py``) and the traced answer reads its one pass as that micro-step;
  :func:`accumulation_not_traced` says why a trace cannot (FSDP1, ZeRO-1 with ``overlap_comm``).
"""

from __future__ import annotations

from fitcheck.spec import TrainingSpec


def traceable(spec: TrainingSpec) -> bool:
    """Whether the default path may trace this run: a Trainer step with transformers' loss (``untraced_parts`` is
    empty) of a text model. DeepSpeed fp16/bf16 and FSDP mixed precision are traced as the 16-bit module they run
    (``trace_arguments.activation_trace_kwargs``). ``--trace`` also traces a TRL trainer's policy step and a
    vision-language model."""
    from fitcheck.spec import TrainerKind

    return not untraced_parts(spec) and spec.trainer.kind is TrainerKind.TRAINER and _images_traceable(spec)


def accumulates_in_grad(spec: TrainingSpec) -> bool:
    """Whether the traced answer reads its one pass as a later micro-step of the run's gradient accumulation window
    (``trace_result.accumulating_step``: every ``.grad`` held, each new gradient beside it until its
    ``AccumulateGrad`` returns): where the run does so (``core/states/accumulation.py`` ``accumulates_in_grad``, the
    one rule, which the formula's backward moments read too) and the trace can show it
    (:func:`accumulation_not_traced` is empty)."""
    from fitcheck.core.states import accumulates_in_grad as rule

    return rule(spec) and not accumulation_not_traced(spec)


def gradients_resident(spec: TrainingSpec) -> bool:
    """Whether the traced answer reads its one pass as a run holding every gradient byte from the start of backward
    (``trace_result.resident_gradients_step``): ZeRO-3's flat gradient buffer on the device
    (``core/states/sharding.py`` ``Partition.gradients_resident``, which ``core/states/accumulation.py``
    ``gradients_held_from_start`` reads for the formula's moments too), in every micro-step; and a ZeRO-2/3 run with
    ``offload_optimizer``, whose device never holds the gradients made so far (``accumulation.py``
    ``gradients_never_on_device``: the component is the host's, so no row of backward may hold any)."""
    from fitcheck.core.states import gradients_never_on_device, partition

    if accumulates_in_grad(spec):
        return False
    return partition(spec).gradients_resident or gradients_never_on_device(spec)


def accumulation_not_traced(spec: TrainingSpec) -> str:
    """Why the traced step cannot stand for this run's accumulating micro-step ('' where it can, or where the run
    does not accumulate into ``.grad``): FSDP1, whose ``AccumulateGrad`` adds a unit's whole flat gradient at once
    (the per-parameter gradients wait in the flat parameter's view backward until the unit's last one is made; the
    plain module's trace adds each parameter's own), and ZeRO-1 with ``overlap_comm``, whose boundary micro-step
    reduces during backward beside the held ``.grad`` (``stage_1_and_2.py`` ``reduce_ready_partitions_and_remove_grads``
    at ``is_gradient_accumulation_boundary``), which the traced step does not run. Such an answer reads the one pass
    and is not pinned (``path_findings.accumulation_not_pinned``)."""
    from fitcheck.core.states import accumulates_in_grad as rule
    from fitcheck.spec import Strategy

    if not rule(spec):
        return ""
    sh = spec.sharding
    if sh.strategy is Strategy.FSDP and sh.fsdp is not None and sh.fsdp.version == 1:
        return "FSDP1's accumulation into each unit's flat gradient"
    ds = sh.deepspeed
    if sh.zero_stage == 1 and ds is not None and ds.overlaps_comm:
        return "ZeRO-1 with overlap_comm: the boundary micro-step's reduction during backward beside the held .grad"
    return ""


def plain_trainer_run(spec: TrainingSpec) -> bool:
    """Whether the whole run is the plain Trainer's, as ``allocator_whole_run.replay_whole_run`` composes it from the
    traces (torch's optimizer on the module's own parameters): a traceable run without DeepSpeed's engine (its
    optimizer, buckets and partitions) or a module cast (``kernels/module_cast.py``)."""
    from fitcheck.core.kernels import deepspeed_module_view
    from fitcheck.spec import Strategy

    return (traceable(spec) and spec.sharding.strategy is not Strategy.DEEPSPEED
            and deepspeed_module_view(spec) is spec)


def plain_replay_is_rank_run(spec: TrainingSpec) -> bool:
    """Whether the plain whole-run replay (``allocator_whole_run.replay_whole_run``: one process holding the whole
    model) is this rank's own run, so that its reserved bytes are this run's: nothing shards it (no FSDP, no
    DeepSpeed). An FSDP run its rewrites decline (``fsdp2_run_events.rewrite_for``: FSDP1 with ``backward_prefetch``,
    offload, ...) is replayed as the plain run, a stand-in whose gap fraction alone carries over."""
    from fitcheck.spec import Strategy

    return spec.sharding.strategy not in (Strategy.FSDP, Strategy.DEEPSPEED)


def untraced_parts(spec: TrainingSpec) -> tuple[str, ...]:
    """What of this run the tracer cannot describe, each with the flag that asks for it: Liger kernels, a fused or
    chunked loss and activation offloading (modelled by the formulas only: fitcheck/core/kernels/), one rank of a
    tp/cp/sp layout (core/parallelism), a GPTQ/AWQ/FP8 base (core/states/prequant), an 8-bit base on CUDA, a
    torch < 1.11 stack's eager softmax keeping its input (core/activations/versions), FSDP1 with reentrant
    checkpointing on transformers < 4.52 (core/activations/fsdp1_reentrant) and transformers < 5.0's per-expert
    Mixtral loop (core/activations/moe_expert_loop). A
    trace of the plain step would be a different run: ``--trace`` refuses these (``PinnedPath.activations``). The
    paths following a traced headline (a Liger or sequence-parallel suggestion) trace the plain step: no saving
    is claimed for the part the trace leaves out, where the formulas' saving could rest on activations that the
    traced headline showed to be off."""
    from fitcheck.core.activations import expert_loop_applies, held_checkpoint_inputs, legacy_softmax_input_added
    from fitcheck.spec import DeviceType

    act = spec.activations
    layout = spec.sharding.parallelism
    quant = spec.quant
    parts = []
    if act.liger is not None:
        parts.append("Liger kernels (--use_liger_kernel)")
    if act.loss != "torch":
        parts.append(f"the {act.loss} loss (--loss)")
    if act.offload_activations:
        parts.append("activation offloading (--activation_offloading)")
    if layout is not None and layout.active:
        parts.append("one rank of a tp/cp/sp layout (--tp_size / --cp_size / --sp_size)")
    if quant is not None and quant.pre_quantized and quant.method != "bitsandbytes":
        parts.append(f"a pre-quantized {quant.method} base")
    # an 8-bit base traces CPU's MatMul8bitFp; CUDA runs MatMul8bitLt (core/activations/int8.py, source)
    if quant is not None and quant.bits == 8 and spec.hardware.device_type is not DeviceType.CPU:
        parts.append("the CUDA 8-bit matmul of an 8-bit base (MatMul8bitLt; --load_in_8bit)")
    if legacy_softmax_input_added(spec):  # the installed torch's softmax drops its input (core/activations/versions)
        parts.append(f"torch {spec.stack.get('torch')}'s softmax keeping its input for backward (--stack torch=)")
    # transformers < 4.52 checkpoints around the FSDP1 unit, which then holds every checkpointed input and its
    # gradient to the end of backward (core/activations/fsdp1_reentrant.py); the installed 5.23 checkpoints inside
    # the layer: its trace is a different run
    if held_checkpoint_inputs(spec):
        parts.append(f"transformers {spec.stack.get('transformers')}'s reentrant checkpoint around each FSDP1 unit, "
                     "holding every layer input and its gradient to the end of backward (--stack transformers=)")
    # transformers < 5.0 loops over Mixtral's nn.Linear experts (core/activations/moe_expert_loop.py); the installed
    # 5.23 runs its fused experts: a different layer
    if expert_loop_applies(spec):
        parts.append(f"transformers {spec.stack.get('transformers')}'s per-expert nn.Linear MoE loop (the installed "
                     "transformers fuses the experts; --stack transformers=)")
    return tuple(parts)


def _images_traceable(spec: TrainingSpec) -> bool:
    """A text model. A vision-language step is traced only on ``--trace`` (Qwen2.5-VL, trace_inputs_vlm): tracing
    its 32-block tower twice per micro-batch size tried takes minutes on a loaded CPU, and the vision formula is
    checked against that trace (benchmarks/vision_vs_trace.py)."""
    return spec.model.shape.task != "image-text-to-text"


def replayed_run(spec: TrainingSpec) -> bool:
    """Whether ``allocator_whole_run.replay_whole_run`` describes this run's whole run: the plain Trainer's
    (:func:`plain_trainer_run`), or TRL 1.16's ``SFTTrainer`` (``trl/trainer/sft_trainer.py``: a Trainer subclass
    whose ``__init__`` prepares the model and patches its fused LM head, and whose ``compute_loss`` reads the
    fused head's log-probs; ``tracer_trl`` traces both) under the same conditions, without padding-free or
    packing, or TRL 1.16's ``DPOTrainer`` (``trl/trainer/dpo_trainer.py``: its reference copy for a full
    fine-tune, the adapters-off pass under PEFT, the sigmoid loss with or without ``rpo_alpha``; ``tracer_dpo``), or
    TRL 1.16's ``KTOTrainer`` (``trl/trainer/kto_trainer.py``: the same reference, the KL batch's no_grad forwards
    of the policy and the reference before and after the policy's forward, ``kto`` or ``apo_zero_unpaired``;
    ``tracer_kto``), or ``GRPOTrainer`` without vLLM (``trl/trainer/grpo_trainer.py``: the reference copy or
    adapters-off pass, the old-policy pass, the log-prob pre-pass of each generation, the dapo loss; ``tracer_grpo``;
    its generation phase is the formula's), or ``RewardTrainer`` (``trl/trainer/reward_trainer.py``: the
    ``AutoModelForSequenceClassification`` step on chosen + rejected rows, traced as the seq-cls task). Checked
    against the real SFTTrainer, DPOTrainer, KTOTrainer and GRPOTrainer on CPU: ``benchmarks/trl_replay.py``;
    RewardTrainer: ``benchmarks/reward_truth.py`` (10 cases within 0.06 %)."""
    return plain_trainer_run(spec) or not not_replayed(spec)


def not_replayed(spec: TrainingSpec) -> str:
    """What of this run the whole-run replay leaves out ('' where it describes it all: :func:`replayed_run`)."""
    from fitcheck.core.kernels import deepspeed_module_view
    from fitcheck.core.trainers import step_runs_fused_head, trainer_row
    from fitcheck.spec import Strategy, TrainerKind

    t = spec.trainer
    parts = list(untraced_parts(spec))
    if not _images_traceable(spec):
        parts.append("a vision-language step")
    if spec.sharding.strategy is Strategy.DEEPSPEED:
        parts.append("DeepSpeed's engine")
    elif deepspeed_module_view(spec) is not spec:
        parts.append("FSDP's module cast")
    if t.kind is TrainerKind.SFT:
        if t.padding_free or t.packing:
            parts.append("SFT's padding-free / packed batch (one flattened row, flash-attention varlen)")
        if not step_runs_fused_head(spec):
            parts.append("SFT without TRL's fused LM head")
    elif trainer_row(t.kind).replay_step in ("tracer_dpo", "tracer_kto"):  # DPO's, KTO's: the registry's column
        parts += _preference_not_replayed(spec)
    elif trainer_row(t.kind).replay_step == "tracer_grpo":  # GRPO's: the registry's column
        parts += _grpo_not_replayed(spec)
    elif t.kind is not TrainerKind.TRAINER and not trainer_row(t.kind).classifier:
        # the reward trainer (the registry's classifier): its seq-cls step is traced (replay_step_args.run_trace_kwargs)
        parts.append(f"the {t.kind.value} trainer's step (its own loss)")
    return ", ".join(parts)


def _preference_not_replayed(spec: TrainingSpec) -> list[str]:
    """What of a DPOTrainer or KTOTrainer run the replay of ``tracer_dpo``'s / ``tracer_kto``'s step leaves out: the
    reference copy, the adapters-off pass, ``precompute_ref_log_probs``' pass before training and the fused LM head
    are traced, with DPO's sigmoid (+ ``rpo_alpha``'s sft) loss, KTO's KL batch and its no_grad forwards (``kto``)
    or none (``apo_zero_unpaired``: the readers refuse any other KTO loss type)."""
    from fitcheck.core.trainers import step_runs_fused_head
    from fitcheck.spec import TrainerKind

    t = spec.trainer
    name = t.kind.value.upper()
    parts = []
    if not step_runs_fused_head(spec):
        parts.append(f"{name} without TRL's fused LM head (full-vocabulary logits)")
    other = [loss for loss in t.loss_type if loss not in _DPO_LOSSES]
    if t.kind is TrainerKind.DPO and other:
        parts.append(f"DPO's {'/'.join(other)} loss (tracer_dpo traces sigmoid and rpo_alpha's sft term)")
    if spec.sharding.fsdp:
        parts.append(f"{name}'s reference copy under FSDP (prepare_fsdp)")
    return parts


def _grpo_not_replayed(spec: TrainingSpec) -> list[str]:
    """What of a GRPOTrainer run the replay of ``tracer_grpo``'s micro-step leaves out. Traced: the reference copy
    (``beta`` != 0) or the adapters-off pass, the old-policy pass, the log-prob pre-pass in the micro-batches that
    generate, the fused LM head and the default ``dapo`` loss. ``model.generate`` itself is a phase of its own
    (``Phase.GENERATION``), traced where the step is (``tracer_generate``; the formula's, ``core/trainers/steps.py``,
    where that trace cannot run) but not replayed through the allocator, as the load and save phases are not: the
    replay starts each generating micro-batch from generate's outputs."""
    parts = []
    if spec.trainer.use_vllm:
        parts.append("GRPO's vLLM engine (use_vllm: its generation and the importance-sampling pass)")
    if spec.sharding.fsdp:
        parts.append("GRPO's reference copy under FSDP (prepare_fsdp)")
    return parts


_DPO_LOSSES = ("sigmoid", "sft")  # tracer_dpo.DpoStep.loss: DPOTrainer._compute_loss's sigmoid and sft branches

