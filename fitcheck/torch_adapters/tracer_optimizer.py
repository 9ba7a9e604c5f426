"""The optimizer's own allocations over several steps, traced without a forward or backward.

The whole-run allocator replay (``allocator_whole_run.replay_whole_run``) needs every step's optimizer events; the
forward and backward of a step are the activation trace's (``PinnedPath`` has run it for the headline), so only
``optimizer.step()`` is traced here: the model built as :func:`tracer.trace_step` builds it, every trainable
parameter given a gradient of its own shape and dtype (autograd's, ``torch/csrc/autograd/input_buffer.cpp``
accumulates in the parameter's dtype), the Trainer's optimizer (``tracer_trainer_optim.make_trainer_optimizer``),
and ``steps`` calls of ``step()``, each in its region (``optimizer_warmup`` ... ``optimizer``) as ``trace_step``
names them. The first step allocates the states (``torch.optim`` creates them lazily in ``step``); a foreach
optimizer allocates and frees temporaries in every step. The gradients exist before the recorder starts: their
allocation and ``zero_grad``'s frees are the activation trace's events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.spec import FreezeSpec, LoraSpec, PeftAdapterSpec, QuantSpec


def trace_optimizer(
    config: Mapping[str, Any],
    *,
    optimizer: str,
    steps: int,
    num_layers: int | None = None,
    dtype: str = "bfloat16",
    attn_implementation: str = "sdpa",
    checkpointing: bool = False,
    every_n_layers: int = 1,
    lora: LoraSpec | None = None,
    quant: QuantSpec | None = None,
    task: str = "causal-lm",
    freeze: FreezeSpec | None = None,
    use_reentrant: bool = False,
    cuda_kernels: bool = False,
    trl_head: tuple[str, ...] = (),
    adapter: PeftAdapterSpec | None = None,
    trl_cast: str = "",
    **_step_only: Any,
) -> tuple[tuple[tuple[int, int, str], ...], tuple[int, ...]]:
    """``steps`` optimizer steps of the model ``trace_step`` would build, on fake tensors.

    Args:
        config: config.json mapping.
        optimizer: ``TrainingArguments.optim`` name.
        steps: Steps run (the last is the measured one: its region has no ``_warmup`` suffix).
        num_layers: Depth to build (None = the config's).
        dtype: Load dtype name.
        attn_implementation: As ``trace_step``.
        checkpointing: As ``trace_step``.
        every_n_layers: As ``trace_step``.
        lora: As ``trace_step``.
        adapter: As ``trace_step``.
        quant: As ``trace_step``.
        task: As ``trace_step``.
        freeze: As ``trace_step``.
        use_reentrant: As ``trace_step``.
        cuda_kernels: As ``trace_step``: the optimizer steps as on CUDA
            (``tracer_trainer_optim.make_trainer_optimizer``).
        trl_head: As ``trace_step``: TRL's SFTTrainer, which casts a quantized base's trainable parameters to bf16
            before the optimizer exists (``tracer_trl.trainable_to_bf16``).
        trl_cast: As ``trace_step``: TRL 0.7.5-0.25.1 SFTTrainer's ``peft_module_casting_to_bf16``.
        **_step_only: The other ``trace_step`` arguments (sequence, micro-batch, autocast, ...): no optimizer
            allocation depends on them.

    Returns:
        (``alloc_events`` as ``trace_step`` records them, parameters and gradients first as ``setup``; the index
        of the first event of each region: the ``optimizer`` and ``zero_grad`` regions of every step, then
        ``done``).
    """
    import torch

    from fitcheck.torch_adapters.tracer import fake_mode, torch_dtype
    from fitcheck.torch_adapters.tracer_build import build_model, reduced_config
    from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder
    from fitcheck.torch_adapters.tracer_task import task_trace_config
    from fitcheck.torch_adapters.tracer_trainer_optim import make_trainer_optimizer

    cfg = task_trace_config(reduced_config(config, num_layers), task)
    if quant is not None:
        from fitcheck.torch_adapters.tracer_patches import warm_bitsandbytes

        warm_bitsandbytes()
    with fake_mode(True):
        model = build_model(cfg, dtype=torch_dtype(dtype), attn_implementation=attn_implementation,
                            checkpointing=checkpointing, every_n_layers=every_n_layers, lora=lora, quant=quant,
                            fake=True, task=task, freeze=freeze, use_reentrant=use_reentrant,
                            adapter=adapter)
        if trl_head and quant is not None and trl_cast != "modules":
            from fitcheck.torch_adapters.tracer_trl import trainable_to_bf16

            trainable_to_bf16(model)
        if trl_cast:  # TRL < 0.26 SFTTrainer's casts, as trace_step applies them (core/states/trl_adapters.py)
            from fitcheck.torch_adapters.tracer_quant import trl_module_casting_to_bf16

            trl_module_casting_to_bf16(model, adapters=trl_cast == "adapters")
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        opt = make_trainer_optimizer(optimizer, model, cuda_kernels)
        rec = LiveTensorRecorder()
        # known before the steps, as in trace_step: an in-place update's output is then not a new storage
        rec.track(model.parameters())
        rec.track(p.grad for p in model.parameters() if p.grad is not None)
        with rec:
            for step in range(steps):
                suffix = "" if step == steps - 1 else "_warmup"
                rec.enter_region("optimizer" + suffix)
                opt.step()
                rec.enter_region("zero_grad" + suffix)
            rec.enter_region("done")
    events = tuple((s, sign * rec.sizes[s], rec.tags[s]) for s, sign in rec.events)
    return events, tuple(rec.region_starts)
