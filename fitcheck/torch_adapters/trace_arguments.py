"""The ``tracer.trace_step`` arguments that describe a spec's run: the whole step's, and the activation step's.

:func:`trace_kwargs` reads a ``TrainingSpec`` into the tracer's keyword arguments (shape, precision,
checkpointing, adapters, quantized base, optimizer, task, CUDA kernels); :func:`activation_trace_kwargs` is the
same for the step the default path traces (no optimizer, one step, a TRL trainer's policy at its own shape).
Split from ``tracer`` (which runs the step) to keep that module under the guide's ~500 lines.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fitcheck.spec import DeviceType, TrainingSpec


def trace_kwargs(spec: TrainingSpec) -> dict[str, Any]:
    """The :func:`trace_step` arguments that describe a spec's run."""
    from fitcheck.core import cublas_thread_workspaces
    from fitcheck.core.activations import old_bnb_4bit
    from fitcheck.core.states import trl_bf16_trainables, trl_module_cast
    from fitcheck.core.trainers import trainer_row

    act = spec.activations
    # bitsandbytes < 0.43.2 (installed or --stack) keeps each 4-bit linear's input: traced with the installed
    # MatMul4Bit patched to keep it (tracer_quant.matmul4bit_keeps_input). With 0.43.2 or later installed and the
    # older release named by --stack, that patch is the only way the trace describes the run. Its kept inputs differ
    # between reentrant and non-reentrant checkpointing (core/activations/bnb_kept_inputs.py): traced as the run asks
    old_bnb: dict[str, Any] = {"keep_4bit_inputs": True} if old_bnb_4bit(spec) else {}
    # DPO / KTO / reward: TRL zeroes every nn.Dropout before step 1 (core.trainers.step_spec says the same)
    dropout = {"disable_dropout": True} if trainer_row(spec.trainer.kind).disable_dropout else {}
    # DeepSpeed's module cast (core.kernels.deepspeed_module_view): named only where it is on, so that no other
    # run's arguments (and trace-cache keys) change
    cast: dict[str, Any] = {"module_cast": True} if spec.precision.module_cast else {}
    if trl_module_cast(spec):  # TRL 0.7.5-0.25.1 SFTTrainer's casts (core/states/trl_adapters.py): named where on
        cast["trl_cast"] = "adapters" if trl_bf16_trainables(spec) else "modules"
    return {**old_bnb, **dropout, **cast,
        "seq_len": spec.batch.seq_len,
        "micro_batch": spec.batch.micro_batch,
        "dtype": spec.precision.load_dtype.value,
        "mixed_precision": spec.precision.mixed_precision.value,
        "attn_implementation": "sdpa" if act.attn_implementation.value != "eager" else "eager",
        "checkpointing": act.checkpointing,
        "every_n_layers": act.checkpoint_every_n_layers,
        # reentrant: forward under no_grad, the recomputed graph kept to the layer's backward end (torch 2.13
        # utils/checkpoint.py CheckpointFunction; activations/int8.py, bnb_kept_inputs.py): traced as the run asks
        "use_reentrant": act.checkpointing and act.use_reentrant,
        "lora": spec.lora,
        # the adapter's tensors are the formulas' (model states); the trace builds the adapter from its config
        "adapter": None if spec.peft is None else dataclasses.replace(spec.peft, tensors=()),
        # a pre-quantized GPTQ/AWQ/FP8 base runs as a frozen 16-bit base (its per-layer dequantized weight is the
        # separate temporaries.dequantized_weight component); MXFP4 trains dequantized (core/states/mxfp4.py)
        "quant": spec.quant if spec.quant is None or spec.quant.method == "bitsandbytes" else None,
        "optimizer": spec.optimizer.name,
        "task": spec.model.shape.task,
        "freeze": spec.freeze,
        "image_tokens": spec.model.shape.image_tokens if spec.model.shape.task == "image-text-to-text" else 0,
        "cuda_kernels": spec.hardware.device_type is not DeviceType.CPU,
        "cublas_workspaces": cublas_thread_workspaces(spec),
    }


def activation_trace_kwargs(spec: TrainingSpec) -> dict[str, Any]:
    """:func:`trace_kwargs` of one step without an optimizer: ``components_from_trace`` leaves parameters,
    gradients and optimizer states to the formulas, and the activation, logits and temporary bytes of every
    phase are the same with and without the optimizer and the warm-up step (``tests/test_trace_batch.py``; at
    real width Qwen3-8B, Gemma-2-9B, Phi-2, Falcon-7B full / LoRA / DoRA / QLoRA, eager and SDPA, with and
    without checkpointing: equal), at half the time; the levers that only change the optimizer or the sharding
    share the trace.

    A TRL trainer's policy step is traced at its own shape (``core.trainers.step_spec``: DPO's chosen + rejected
    rows, GRPO/KTO's prompt + completion tokens, SFT padding-free's one flattened row); RewardTrainer's
    ``AutoModelForSequenceClassification`` as the seq-cls task. Its LM head and loss are the formula's
    (``core/step.py traced_body_formula_head``). DeepSpeed fp16/bf16 and FSDP mixed precision are traced as the
    16-bit module they run (``core.kernels.deepspeed_module_view``: DeepSpeed's cast, checked by
    ``benchmarks/deepspeed_cpu.py``'s real engine steps)."""
    from fitcheck.core.kernels import deepspeed_module_view
    from fitcheck.core.trainers import dpo_release_layout, sft_metrics_layout, step_runs_fused_head, step_spec

    policy = step_spec(deepspeed_module_view(spec))  # DeepSpeed / FSDP mixed precision run a 16-bit module
    kwargs = {**trace_kwargs(policy), "optimizer": None, "steps": 1}
    if policy.model.params is not spec.model.params:  # reward_trainer.py: loaded with num_labels=1 (steps.py)
        kwargs["task"] = "seq-cls"
    if spec.trainer.is_trl and (step_runs_fused_head(spec) or sft_metrics_layout(spec) is not None
                                or dpo_release_layout(spec) is not None):
        # the body's own peaks; the chunked head (or SFTTrainer's full-logits loss and metrics, or an older
        # DPOTrainer's full-logits log-probs, core/trainers/dpo_releases.py) is the formula's
        kwargs["count_logits"] = False
    return kwargs
