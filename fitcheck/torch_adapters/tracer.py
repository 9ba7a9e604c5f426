"""Trace one real training step of the real transformers model on fake tensors, and measure it by phase.

``trace_step`` builds the model class from config.json (``tracer_build``), runs two steps of forward, loss,
backward, optimizer step and ``zero_grad`` under ``torch._subclasses.fake_tensor.FakeTensorMode`` (so the
optimizer states exist, as in the steady state the estimate describes), and records every live storage with
``tracer_recorder.LiveTensorRecorder``. The second step is split into the phases of ``fitcheck.report.Phase``:

- FORWARD_END: the peak during forward and loss (the logits, their fp32 upcast and log-softmax coexist there);
- BACKWARD_START: the peak from ``loss.backward()`` until the gradient of the logits is produced (before any
  parameter gradient exists): every saved activation plus the loss/logits gradient pair;
- BACKWARD: the peak over the rest of backward (parameter gradients growing, activations being freed);
- OPTIMIZER_STEP: the peak during ``optimizer.step()``.

Each phase is broken down by category (parameters, gradients, optimizer state, activations, logits/loss,
temporaries, inputs) at the moment of its peak. ``tracer_depth.trace_extrapolated`` traces one and two repeating
layer groups and extrapolates every number linearly to the full depth (exact, design note 04), and
``tracer_depth.trace_components`` turns that into activation components for the estimate (``--trace``).
The same code runs on real CPU tensors (``fake=False``): that is the truth ``benchmarks/cpu_truth.py`` uses.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any

from fitcheck.report import Phase
from fitcheck.spec import FreezeSpec, LoraSpec, PeftAdapterSpec, QuantSpec
from fitcheck.torch_adapters.trace_result import (
    ACTIVATIONS,
    CATEGORIES,
    GRADS,
    INPUTS,
    LOGITS,
    OPTSTATE,
    PARAMS,
    TEMPORARIES,
    PhaseBreakdown,
    TraceResult,
    breakdown_at_peak,
    pending_grads,
)
from fitcheck.torch_adapters.tracer_task import task_head, task_labels, task_trace_config
from fitcheck.torch_adapters.tracer_trainer_optim import make_trainer_optimizer
from fitcheck.torch_adapters.tracer_trl_plans import DpoPlan, GrpoPlan, KtoPlan

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def torch_dtype(name: str) -> Any:
    """torch dtype from its name (``float32``/``bfloat16``/``float16``)."""
    import torch

    return getattr(torch, _DTYPES[name])


@contextlib.contextmanager
def fake_mode(fake: bool) -> Iterator[None]:
    """torch's ``FakeTensorMode`` (with the tracer's sequence patch) when ``fake``, else nothing."""
    if not fake:
        yield
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fitcheck.torch_adapters.tracer_patches import unpacked_sequences

    with FakeTensorMode(allow_non_fake_inputs=True), unpacked_sequences():
        yield


def trace_step(
    config: Mapping[str, Any],
    *,
    seq_len: int,
    micro_batch: int,
    dtype: str = "bfloat16",
    mixed_precision: str = "no",
    attn_implementation: str = "sdpa",
    checkpointing: bool = False,
    every_n_layers: int = 1,
    lora: LoraSpec | None = None,
    quant: QuantSpec | None = None,
    optimizer: str | None = "adamw_torch",
    num_layers: int | None = None,
    fake: bool = True,
    seed: int = 0,
    task: str = "causal-lm",
    freeze: FreezeSpec | None = None,
    use_reentrant: bool = False,
    image_tokens: int = 0,
    steps: int = 2,
    grad_accum: int = 1,
    count_logits: bool = True,
    cuda_kernels: bool = False,
    cublas_workspaces: tuple[int, ...] = (),
    trl_head: tuple[str, ...] = (),
    trl_dpo: DpoPlan | None = None,
    trl_kto: KtoPlan | None = None,
    trl_grpo: GrpoPlan | None = None,
    skip_tiles: bool = True,
    keep_4bit_inputs: bool = False,
    adapter: PeftAdapterSpec | None = None,
    disable_dropout: bool = False,
    module_cast: bool = False,
    trl_cast: str = "",
) -> TraceResult:
    """Run two training steps of the real model and record live tensor bytes of the second, by phase.

    Args:
        config: config.json mapping.
        seq_len: Tokens per sequence.
        micro_batch: Sequences per step.
        dtype: Load dtype name.
        mixed_precision: ``no`` / ``bf16`` / ``fp16`` (autocast around forward + loss, as accelerate does).
        attn_implementation: ``eager`` or ``sdpa``.
        checkpointing: Activation checkpointing (non-reentrant, the transformers 5 default).
        every_n_layers: Checkpoint one layer in n.
        lora: PEFT LoRA wrapping.
        quant: bitsandbytes base.
        optimizer: ``TrainingArguments.optim`` name; None runs no optimizer step (gradients are set to None
            between the steps, as ``zero_grad`` does): the activation, logits and temporary bytes of every
            phase are the same, and ``transformers.trainer`` is not imported (``trace_components``).
        num_layers: Depth to build (None = the config's).
        fake: Trace on fake tensors (True) or run a real CPU step (False).
        seed: RNG seed for the real step.
        task: ``causal-lm``, ``seq-cls``, ``token-cls`` (the head and labels of that task).
        freeze: Partial training without PEFT (``fitcheck.torch_adapters.tracer_freeze``).
        use_reentrant: Reentrant activation checkpointing (``gradient_checkpointing_kwargs``).
        image_tokens: Vision patches per sample of an ``image-text-to-text`` step (``trace_inputs_vlm``).
        steps: Steps run; the last one is measured (2: the optimizer states of the first exist in the second).
        grad_accum: Forward and backward passes per step (``gradient_accumulation_steps``); every pass but the
            last step's last is a warm-up one (its regions suffixed ``_warmup``).
        count_logits: False leaves the LM head's logits and loss (the ``logits`` category) out of every series,
            so each phase's peak is the body's own (a TRL trainer runs its chunked head instead:
            ``activation_trace_kwargs``).
        cuda_kernels: Trace the ops whose CUDA kernel keeps other tensors than the CPU one as CUDA runs them
            (``cuda_emulation``: dropout's bool mask, SDPA's in-kernel dropout, CUDA autocast's fp32 lists), and
            step the optimizer on its CUDA path (foreach for a non-fused torch optimizer:
            ``make_trainer_optimizer``); False for a real CPU step and ``device_type cpu`` estimates.
        cublas_workspaces: Bytes each thread keeps from its first BLAS op, in ``alloc_events`` only (item 4 there).
        trl_head: The fused-head outputs of TRL's SFTTrainer: run its step (``tracer_trl``: its model preparation,
            fused LM head and loss; on CUDA the head's Triton folds) instead of the plain Trainer's.
        trl_dpo: With ``trl_head``, TRL's DPOTrainer step instead of SFT's (``tracer_trl_plans.DpoPlan``;
            ``tracer_dpo``: ``micro_batch`` is its chosen + rejected rows; the reference copy's warm-up block is
            allocated and freed in the setup, between the policy and the copy).
        trl_kto: With ``trl_head``, TRL's KTOTrainer step instead (``tracer_trl_plans.KtoPlan``; ``tracer_kto``:
            its KL batch and forwards).
        trl_grpo: With ``trl_head``, TRL's GRPOTrainer micro-step instead (``tracer_trl_plans.GrpoPlan``;
            ``tracer_grpo``: the log-prob pre-pass, tagged ``prepass``, then the policy's forward and loss).
        skip_tiles: On fake tensors, run the fused head's repeated token tiles once or twice
            (``tracer_trl.repeated_tiles_skipped``: the same replay); False runs every tile.
        adapter: A PEFT method other than LoRA (``peft_adapters``: peft's own config class and ``get_peft_model``;
            prompt / prefix tuning's virtual tokens enter the step through peft's forward).
        keep_4bit_inputs: Trace bitsandbytes <= 0.43.1's ``MatMul4Bit``, which keeps every 4-bit linear's input
            (``tracer_quant.matmul4bit_keeps_input``; the stack's bitsandbytes, ``trace_kwargs``).
        disable_dropout: Every ``nn.Dropout``'s ``p`` set to 0 once the model is built, as TRL's DPO, KTO and
            reward trainers do (``trl/trainer/utils.py`` ``disable_dropout_in_model``; the registry's
            ``disable_dropout``): the plain step of such a trainer's policy (``activation_trace_kwargs``).
        module_cast: Cast every floating parameter (peft's adapters included) to ``dtype`` after the model's
            preparation, as DeepSpeed's fp16/bf16 engine does (deepspeed 0.19.8 ``runtime/engine.py``
            ``_cast_module_mixed_precision``; ``PrecisionSpec.module_cast``).
        trl_cast: ``modules`` / ``adapters``: TRL 0.7.5-0.25.1 SFTTrainer's ``peft_module_casting_to_bf16`` after the
            LoRA wrap (``adapters``: 0.7.5-0.8.6's, the LoRA layers too; ``tracer_quant.trl_module_casting_to_bf16``).

    Returns:
        The per-phase breakdown of the second step.
    """
    import torch

    from fitcheck.torch_adapters.trace_inputs_vlm import check_traceable, image_inputs, image_metadata_constants
    from fitcheck.torch_adapters.tracer_build import build_model, config_layers, reduced_config
    from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder

    start = time.perf_counter()
    cfg = task_trace_config(reduced_config(config, num_layers), task)
    depth = config_layers(cfg)
    check_traceable(cfg, image_tokens)
    if trl_head and fake:  # trl.trainer.utils imports transformers.trainer_utils, which imports peft (and peft
        # bitsandbytes): imported first without torch.compile's inductor lookup, as for LoRA (tracer_patches)
        from fitcheck.torch_adapters.tracer_patches import bitsandbytes_uncompiled

        bitsandbytes_uncompiled()
    if quant is not None and fake:
        from fitcheck.torch_adapters.tracer_patches import warm_bitsandbytes

        warm_bitsandbytes()
    torch.manual_seed(seed)
    from fitcheck.torch_adapters.cuda_emulation import CublasWorkspaces
    from fitcheck.torch_adapters.cuda_emulation import cuda_kernels as cuda_emulation

    kernels = contextlib.ExitStack()
    if cuda_kernels:
        kernels.enter_context(cuda_emulation())
        if trl_head:
            from fitcheck.torch_adapters.tracer_trl import triton_folds

            kernels.enter_context(triton_folds())
    if keep_4bit_inputs:
        from fitcheck.torch_adapters.tracer_quant import matmul4bit_keeps_input

        kernels.enter_context(matmul4bit_keeps_input(True))
    if adapter is not None and fake:
        from fitcheck.torch_adapters.peft_build import module_dropout_drawn

        kernels.enter_context(module_dropout_drawn())
    if trl_head and fake and skip_tiles:
        from fitcheck.torch_adapters.tracer_trl import repeated_tiles_skipped

        kernels.enter_context(repeated_tiles_skipped())
    preference = trl_dpo or trl_kto or trl_grpo  # DPO's / KTO's / GRPO's plan: reference, prompt tokens, ...
    if preference and cuda_kernels and fake:  # the fused head's CUDA path scores the labelled positions only
        from fitcheck.torch_adapters.tracer_dpo import compact_gather, labelled_positions

        kernels.enter_context(compact_gather(labelled_positions(micro_batch, seq_len, preference.prompt)))
    with fake_mode(fake), image_metadata_constants(task, micro_batch * (seq_len + 1)), kernels:
        model = build_model(
            cfg,
            dtype=torch_dtype(dtype),
            attn_implementation=attn_implementation,
            checkpointing=checkpointing,
            every_n_layers=every_n_layers,
            lora=lora,
            quant=quant,
            fake=fake,
            task=task,
            freeze=freeze,
            use_reentrant=use_reentrant,
            adapter=adapter,
        )
        if disable_dropout:  # trl/trainer/utils.py disable_dropout_in_model, without importing TRL
            for module in model.modules():
                if isinstance(module, torch.nn.Dropout):
                    module.p = 0
        sft: Any = None
        if trl_head and preference:
            from fitcheck.torch_adapters.tracer_dpo import prepare_dpo
            from fitcheck.torch_adapters.tracer_grpo import prepare_grpo
            from fitcheck.torch_adapters.tracer_kto import prepare_kto

            reference = functools.partial(build_model, cfg, dtype=torch_dtype(dtype), checkpointing=False, quant=quant,
                                          attn_implementation=attn_implementation, fake=fake, task=task)
            prepared: dict[str, Any] = {"build_reference": reference, "quantized": quant is not None,
                                        "checkpointing": checkpointing, "use_reentrant": use_reentrant}
            if trl_kto:
                sft = prepare_kto(model, trl_head, micro_batch, seq_len, trl_kto, **prepared)
            elif trl_grpo:
                sft = prepare_grpo(model, trl_head, micro_batch, seq_len, trl_grpo, **prepared)
            elif trl_dpo:
                sft = prepare_dpo(model, trl_head, micro_batch, seq_len, trl_dpo, **prepared)
        elif trl_head:
            from fitcheck.torch_adapters.tracer_trl import prepare_sft

            # TRL 0.9.3-0.25.1 leaves the adapters fp32 (trl_cast "modules"): not TRL 1.16's trainables cast
            sft = prepare_sft(model, trl_head, quantized=quant is not None and trl_cast != "modules",
                              checkpointing=checkpointing)
        if trl_cast:  # TRL < 0.26 SFTTrainer, after get_peft_model (core/states/trl_adapters.py)
            from fitcheck.torch_adapters.tracer_quant import trl_module_casting_to_bf16

            trl_module_casting_to_bf16(model, adapters=trl_cast == "adapters")
        if module_cast:  # deepspeed.initialize, after the trainer's own preparation: every castable parameter
            castable, target = (torch.float16, torch.bfloat16, torch.float32, torch.float64), torch_dtype(dtype)
            for p in model.parameters():
                if p.dtype in castable and p.dtype != target:
                    p.data = p.data.to(target)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = make_trainer_optimizer(optimizer, model, cuda_kernels) if optimizer is not None else None
        vocab = int(model.config.get_text_config(decoder=True).vocab_size)  # composite VLM configs nest it
        ids = torch.randint(0, vocab, (micro_batch, seq_len))
        ids, images = image_inputs(model, ids, image_tokens)  # {} unless image-text-to-text with images
        rec = LiveTensorRecorder()
        rec.op_hook = CublasWorkspaces(tuple(cublas_workspaces)) if cublas_workspaces else None
        rec.track(model.parameters())
        rec.track(model.buffers())
        quant_meta: list[Any] = []
        if quant is not None:  # absmax / code tables / nested state: model state, neither params nor buffers
            from fitcheck.torch_adapters.tracer_quant import quant_state_tensors

            quant_meta = quant_state_tensors(model)
            rec.track(quant_meta)
        ref_state = sft.track_reference(rec) if preference else []  # the reference copy, loaded after the policy
        labels = task_labels(model, ids, task)
        rec.track([ids] if labels is ids else [ids, labels])
        batch_extra = sft.inputs() if preference else []  # completion mask (KL rows, labels, log-probs), GRPO batch
        rec.track(batch_extra)
        rec.track(images.values())
        head = task_head(model)
        autocast = mixed_precision in ("bf16", "fp16")
        accumulated: list[tuple[int, int, int]] = []  # accumulated_after, in the first pass
        returned: list[tuple[int, int]] = []  # (event index, .grad serial) where each AccumulateGrad returned
        hooks = [p.register_post_accumulate_grad_hook(_accumulate_marker(rec, accumulated, returned)) for p in params]
        ac_dtype = torch.bfloat16 if mixed_precision == "bf16" else torch.float16
        with rec:
            if preference:  # precompute_ref_log_probs: the pass DPOTrainer/KTOTrainer.__init__ runs, in the setup
                sft.precompute(ids, torch.autocast("cpu", dtype=ac_dtype) if autocast else contextlib.nullcontext())
            for step in range(steps):
                for micro in range(grad_accum):
                    suffix = "" if (step, micro) == (steps - 1, grad_accum - 1) else "_warmup"
                    marks = sft.region_hooks(rec.enter_region, suffix) if sft is not None else [
                        head.register_forward_pre_hook(_region_opener(rec, "forward_head" + suffix)),
                        head.register_forward_hook(_grad_marker(rec, "backward" + suffix))]
                    rec.enter_region("forward" + suffix)
                    ctx = torch.autocast("cpu", dtype=ac_dtype) if autocast else contextlib.nullcontext()
                    with ctx:
                        loss = _loss(model, ids, labels, images) if sft is None else sft.loss(ids, labels)
                    rec.enter_region("backward_start" + suffix)
                    loss.backward()
                    del loss
                    for mark in marks:
                        mark.remove()
                rec.enter_region("optimizer" + suffix)
                if opt is not None:
                    opt.step()
                    if adapter is not None and adapter.peft_type == "ADALORA":
                        # the loop peft's AdaLoRA asks for (tuners/adalora/model.py update_and_allocate, after the
                        # optimizer step): the rank allocator's states. At step 0 (<= tinit) it masks nothing:
                        # its masking (kthvalue(...).item()) cannot run on fake tensors
                        model.base_model.update_and_allocate(0)
                rec.enter_region("zero_grad" + suffix)
                if step == steps - 1:
                    grad_serials = {rec.serial(p.grad) for p in params if p.grad is not None}
                    state_serials = {
                        rec.serial(v)
                        for st in (opt.state.values() if opt is not None else ())
                        for v in st.values()
                        if isinstance(v, torch.Tensor)
                    }
                    param_serials = {rec.serial(p) for p in model.parameters()} | {
                        rec.serial(b) for b in model.buffers()
                    } | {rec.serial(t) for t in quant_meta} | {rec.serial(t) for t in ref_state}
                    ids_serials = {rec.serial(ids), rec.serial(labels)} | {rec.serial(t) for t in images.values()}
                    ids_serials |= {rec.serial(t) for t in batch_extra}
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
                else:
                    model.zero_grad(set_to_none=True)
            rec.enter_region("done")
    for h in hooks:
        h.remove()
    final_grads = sum(rec.sizes[s] for s in grad_serials if s is not None)

    def classify(serial: int) -> str:
        if serial in param_serials:
            return PARAMS
        if serial in grad_serials:
            return GRADS
        if serial in state_serials:
            return OPTSTATE
        if serial in ids_serials:
            return INPUTS
        tag = rec.tags[serial]
        if tag == "forward":
            return ACTIVATIONS
        if tag in ("forward_head", "backward_start"):
            return LOGITS
        return TEMPORARIES

    index = {c: i for i, c in enumerate(CATEGORIES)}
    cat_of: dict[int, int] = {}

    def category(serial: int) -> int:
        if serial not in cat_of:
            cat_of[serial] = index[classify(serial)]
        return cat_of[serial]

    series: dict[Phase, tuple[tuple[int, ...], ...]] = {}
    phases: dict[Phase, PhaseBreakdown] = {}
    for phase, names in REGIONS.items():
        rows = tuple(rec.series(names, category, len(CATEGORIES)))
        if not count_logits:
            at = index[LOGITS]
            rows = tuple(tuple(0 if i == at else n for i, n in enumerate(row)) for row in rows)
        series[phase] = rows
        phases[phase] = breakdown_at_peak(series[phase])
    structure = hash(tuple((category(s), sign) for s, sign in rec.events[rec.regions["forward"].start_event + 1:]))
    events, starts = rec.allocation_events()
    window = rec.regions.get("backward")  # the measured pass's: the first since zero_grad only without accumulation
    pending = pending_grads(window.start_event, window.end_event, returned, {s: rec.sizes[s] for s in grad_serials
                            if s is not None}) if window is not None and grad_accum == 1 else ()
    return TraceResult(phases, depth, final_grads, time.perf_counter() - start, series=series, structure=structure,
                       alloc_events=events, region_starts=starts, accumulated_after=tuple(accumulated),
                       pending_grads=pending)


# The recorder's regions of the measured (second) step that make up each phase.
REGIONS: Mapping[Phase, tuple[str, ...]] = {
    Phase.FORWARD_END: ("forward", "forward_head"),
    Phase.BACKWARD_START: ("backward_start",),
    Phase.BACKWARD: ("backward",),
    Phase.OPTIMIZER_STEP: ("optimizer",),
}


def _region_opener(rec: Any, region: str) -> Any:
    """A forward pre-hook that opens ``region`` (the LM head and loss)."""

    def hook(*_args: Any) -> None:
        rec.enter_region(region)

    return hook


def _grad_marker(rec: Any, region: str) -> Any:
    """A forward hook on the LM head whose tensor hook opens ``region`` when the logits gradient exists."""
    import torch

    def hook(_module: Any, _inputs: Any, out: Any) -> None:
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda _grad: rec.enter_region(region))  # type: ignore[no-untyped-call]

    return hook


def _accumulate_marker(rec: Any, out: list[tuple[int, int, int]], returned: list[tuple[int, int]]) -> Any:
    """A post-accumulate-grad hook that records, in the first pass only (``.grad`` stolen: torch 2.13
    ``accumulate_grad.h``), the event right before the parameter's ``AccumulateGrad`` returned (``out``), and in
    every pass that event's index with the ``.grad``'s serial (``returned``: ``trace_result.pending_grads``)."""
    seen: set[int] = set()

    def hook(p: Any) -> None:
        serial = rec.serial(p.grad)
        if serial is not None:
            returned.append((len(rec.events) - 1, serial))
        if id(p) not in seen and serial is not None and rec.events:
            seen.add(id(p))
            out.append((serial, *rec.events[-1]))

    return hook


def _loss(model: Any, ids: Any, labels: Any, images: Mapping[str, Any] | None = None) -> Any:
    """Forward + loss as the Trainer's ``compute_loss`` does: the outputs are dropped, the loss kept."""
    out = model(input_ids=ids, labels=labels, use_cache=False, **(images or {}))
    return out.loss
