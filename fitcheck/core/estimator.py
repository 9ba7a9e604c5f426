"""The estimate: every module's components summed per phase, the peak, the verdict.

``estimate(spec) -> Report`` is pure: no torch, no files, no environment. The per-phase model is:
peak allocated = max over phases of the sum of DEVICE components alive in that phase (what
``torch.cuda.max_memory_allocated`` reports); reserved comes from the caching-allocator model in
``allocator.reserved_bytes``; device used (nvidia-smi) = reserved + components outside torch's allocator
(CUDA context, cuBLAS workspace, NCCL, managed memory of paged optimizers).
"""

from __future__ import annotations

from fitcheck.core.activations import (
    activation_findings,
    in_envelope,
    int8_outlier_findings,
    not_pinned_finding,
    versions_findings,
)
from fitcheck.core.allocator import (
    ReplayedGap,
    allocator_findings,
    phase_reserved,
    plus_side_pools,
    reserved_bytes,
    reserved_risk_findings,
)
from fitcheck.core.loading import allocator_conf, load_component, load_findings, load_phase, run_reserved
from fitcheck.core.overheads import nccl_group_bytes
from fitcheck.core.parallelism import (
    describe_layout,
    parallel_components,
    parallel_findings,
    rank_local_spec,
)
from fitcheck.core.saving import save_components, save_cost, save_findings
from fitcheck.core.states import (
    SidePools,
    check_peft_adapter,
    deepspeed_side_pools,
    describe_regime,
    fsdp_qlora_findings,
    fsdp_side_pools,
    load_peak,
    model_state_findings,
    peft_adapter_findings,
    peft_adapter_params,
    prequant_findings,
    sharding_findings,
    trainable_params,
)
from fitcheck.core.step import collect_components, peak_phase, traced_trainer_finding, transient_bytes_at
from fitcheck.core.trainers import evaluation_findings
from fitcheck.findings import Finding, Severity
from fitcheck.report import Component, Location, Phase, Report, phase_phrase
from fitcheck.spec import DeviceType, TrainingSpec
from fitcheck.units import format_bytes

# Warnings the formulas raise about themselves (activations/recipe_gaps.py, activations/backward.py)
_FORMULA_UNPINNED = frozenset({"activations-not-pinned", "backward-not-pinned", "vision-not-pinned"})
# Notes that say part of this run is not modelled, traced or not: a CUDA kernel the CPU trace cannot see
# (activations/cuda.py), torch.compile, Liger's fused experts (kernels/levers.py). None is ever pinned (issue 20).
# peft-adapter-traced: a non-LoRA PEFT adapter, checked on CPU steps of a tiny model only (core/states/peft_adapter)
# quantization-not-modelled: a quantization method or llm_int8_has_fp16_weight the readers estimate as an
# unquantized base (readers/quantization_config.py, prequant_config.py): neither formula nor trace is that run;
# sft-metrics-unchecked: an SFTTrainer release whose metrics were read from its source, never run (sft_metrics.py)
_NOT_MODELLED = frozenset({"cuda-not-traced", "not-modelled", "peft-adapter-traced", "quantization-not-modelled",
                           "sft-metrics-unchecked"})


def _unmodelled_stack_notes(spec: TrainingSpec, findings: list[Finding], traced: bool) -> set[str]:
    """Notes of a library version's allocations not modelled, which unpin the answer (issue 20: "not modelled"
    never next to ``pinned: true``; activations/versions.py).

    - ``bnb-keeps-inputs`` as a WARNING: bitsandbytes <= 0.43.1 keeps 4-bit inputs the formulas do not count for
      this model or adapter (``legacy_bnb_kept_inputs`` bounds them); a trace runs the installed bitsandbytes.
    - ``versions-not-modelled``: the range rows and the probes ran the modelled stack; a formula answer for
      another one is unchecked, and so is a trace when the stack is one the run names (``--stack``), not the
      installed libraries the trace ran.
    """
    out = {f.code for f in findings if f.code == "bnb-keeps-inputs" and f.severity is Severity.WARNING}
    if not traced or spec.stack.source != "installed":
        out |= {f.code for f in findings if f.code == "versions-not-modelled"}
    return out

_SEVERITY_ORDER = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}


def _verdict(
    spec: TrainingSpec,
    components: tuple[Component, ...],
    phase: Phase,
    device_used: int,
    budget: int,
    host: int,
) -> list[Finding]:
    out: list[Finding] = []
    cpu = spec.hardware.device_type is DeviceType.CPU
    name = spec.hardware.gpu_name
    where = name or ("the CPU run" if cpu else "the GPU")
    on = f" on {name}" if name else (" of RAM (CPU run)" if cpu else " (--gpu_memory)")
    per = "per process" if cpu else "per GPU"
    when = phase_phrase(phase)
    alive = sorted(
        ((c.at(phase), c.name) for c in components if c.location is Location.DEVICE and c.at(phase)),
        reverse=True,
    )
    top = ", ".join(f"{name} {format_bytes(b)}" for b, name in alive[:3])
    if device_used > budget:
        out.append(
            Finding(
                "does-not-fit",
                Severity.ERROR,
                f"needs {format_bytes(device_used)} {per} but {where} has {format_bytes(budget)} "
                f"(short by {format_bytes(device_used - budget)}); the peak is {when}, "
                f"largest then: {top}",
                "see the suggestions, or try a smaller --per_device_train_batch_size with a larger "
                "--gradient_accumulation_steps, --gradient_checkpointing, LoRA/QLoRA, or ZeRO/FSDP sharding",
            )
        )
    else:
        out.append(
            Finding(
                "fits",
                Severity.INFO,
                f"{format_bytes(device_used)} of {format_bytes(budget)}{on} "
                f"({format_bytes(budget - device_used)} free); the peak is {when}, "
                f"largest then: {top}",
            )
        )
    host_limit = spec.hardware.host_memory_bytes
    if host_limit is not None and host > host_limit:
        on_host = sorted((c for c in components if c.location is Location.HOST and c.peak_bytes),
                         key=lambda c: -c.peak_bytes)
        what = ", ".join(f"{c.name} {format_bytes(c.peak_bytes)}" for c in on_host[:3])
        out.append(
            Finding(
                "host-memory",
                Severity.ERROR,
                f"the run needs {format_bytes(host)} of host RAM per node ({what}) but --host_memory is "
                f"{format_bytes(host_limit)}",
                "offload less (optimizer only, not parameters), use more nodes, or a larger host",
            )
        )
    return out


def _context_findings(spec: TrainingSpec) -> list[Finding]:
    """A sequence longer than the context the config declares (``max_position_embeddings``)."""
    declared = spec.model.shape.max_position_embeddings
    seq = spec.batch.seq_len
    if declared <= 0 or seq <= declared:
        return []
    return [
        Finding(
            "seq-beyond-context",
            Severity.WARNING,
            f"--max_seq_length {seq} is longer than the {declared} positions config.json declares "
            "(max_position_embeddings): a model with learned position embeddings (GPT-2, BERT, OPT) raises an "
            "index error, a RoPE model runs but was not trained at this length",
            f"use --max_seq_length {declared} or less, or a model (or RoPE scaling) made for {seq} tokens",
        )
    ]


def _side_pool_findings(side: SidePools | None, released: bool) -> list[Finding]:
    """Where the side-stream part of reserved comes from (INFO), or that it is released to fit (WARNING)."""
    if side is None or side.gather + side.reduce == 0:
        return []
    if released:
        return [Finding(
            side.code, Severity.WARNING,
            f"{side.detail}: with them the run would need more than the GPU, so torch's allocator releases the "
            "cached free segments and retries (CUDACachingAllocator.cpp release_cached_blocks) at each step's "
            "peak; the number leaves them out, nvidia-smi will show the GPU nearly full and steps run slower "
            f"(torch.cuda.memory_stats()['num_alloc_retries'] > 0) ({side.source})",
            "leave headroom (a smaller micro-batch with more accumulation) to avoid the per-step cache flushes")]
    return [Finding(side.code, Severity.INFO, f"{side.detail} ({side.source})",
                    "nothing to change: with expandable_segments:True these pools grow by 20 MiB pages instead")]


def estimate(
    spec: TrainingSpec,
    *,
    activations: tuple[Component, ...] | None = None,
    gap_fraction: float | None = None,
    replayed: ReplayedGap | None = None,
) -> Report:
    """Estimate per-GPU peak memory of one steady-state training step.

    Args:
        spec: The training run.
        activations: Activation components to use instead of the per-family formulas (from a fake-tensor
            trace, ``fitcheck estimate --trace``). Without them, a spec outside the checked envelope
            (``fitcheck.core.activations.envelope``) gets ``pinned=False`` and a ``not-pinned`` WARNING.
        gap_fraction: The caching allocator's reserved-over-allocated gap as a fraction of the step's transient
            bytes, replayed from the traced step's allocation sequence (``torch_adapters.allocator_replay``);
            None: the published fraction of ``core/allocator.py``. Shorthand for ``replayed=ReplayedGap(f)``.
        replayed: What the run's replay measured: its gap fraction and, where the replayed run is this run itself,
            its own reserved bytes, below which the answer's reserved never falls (``allocator.phase_reserved``).
            Not together with ``gap_fraction``.

    Returns:
        The itemised report with the peak phase, allocated/reserved/used bytes, the verdict and findings.
    """
    if gap_fraction is not None:
        if replayed is not None:
            raise ValueError("estimate: give gap_fraction or replayed, not both")
        replayed = ReplayedGap(gap_fraction)
    check_peft_adapter(spec)  # a non-LoRA PEFT adapter: only with its tensors built from the real peft model
    # tp/cp/sp/HSDP: one rank's step is an ordinary step of a smaller problem plus attention buffers
    # (fitcheck.core.parallelism); `local` is `spec` itself without a layout.
    local = rank_local_spec(spec)
    parallel = local is not spec
    components = (
        *collect_components(local, None if parallel else activations),
        *parallel_components(spec, nccl_group_bytes),
    )
    # the load phase (from_pretrained, k-bit preparation) on a model loaded whole onto the GPU (core/loading)
    outside_step = sum(c.peak_bytes for c in components if c.location is Location.DEVICE_OTHER)
    loaded = None if parallel else load_phase(local, spec.hardware.gpu_memory_bytes - outside_step)
    step_totals = peak_phase(components)[1]
    # FSDP's and DeepSpeed's side streams keep their own cached segments (gathers, gradients) beside the step's pool
    side = fsdp_side_pools(local, allocator_conf(local)) or deepspeed_side_pools(local, allocator_conf(local))
    # the gap (published or replayed) at every phase, never below the replay's own reserved: a block freed stays
    # cached, so the step's reserved is the largest phase's, side pools included (allocator.phase_reserved)
    own = phase_reserved(local, step_totals, {p: transient_bytes_at(components, p) for p in step_totals}, replayed)
    own_reserved = max(own.values(), default=0)
    step_reserved = own_reserved if side is None else max(
        (plus_side_pools(own[p], side.beyond_allocated(p)) for p in own), default=0)
    if loaded is not None:
        components = (*components, load_component(loaded))
    # Trainer.save_model's gathers on rank 0 (core/saving): the resident states plus the largest gather
    saving = None if parallel else save_cost(local)
    components = (*components, *save_components(saving, components))
    phase, totals = peak_phase(components)
    peak_allocated = totals[phase]
    save_reserved = reserved_bytes(local, totals.get(Phase.SAVE, 0), transient_bytes=0)
    peak_reserved = max(run_reserved(step_reserved, loaded), save_reserved)
    outside = sum(c.peak_bytes for c in components if c.location is Location.DEVICE_OTHER)
    device_used = peak_reserved + outside
    budget = spec.hardware.gpu_memory_bytes
    released = False
    if device_used > budget and (step_reserved > own_reserved or (loaded is not None and loaded.oversize_cached)):
        # above the GPU, torch's allocator releases the oversize cached blocks, then every unsplit cached segment,
        # the side streams' free ones included, and retries (CUDACachingAllocator.cpp malloc ->
        # release_available_cached_blocks, release_cached_blocks) before it raises
        without = max(run_reserved(own_reserved, loaded, released=True), save_reserved)
        if without + outside <= budget:
            released, peak_reserved, device_used = True, without, without + outside
    host = sum(c.peak_bytes for c in components if c.location is Location.HOST)
    host_ok = spec.hardware.host_memory_bytes is None or host <= spec.hardware.host_memory_bytes
    host_ok = host_ok and _load_fits(local, budget, spec.hardware.host_memory_bytes)
    findings = [
        *spec.findings,
        *model_state_findings(local),
        *peft_adapter_findings(local),
        *prequant_findings(spec),
        *activation_findings(local),
        *sharding_findings(local),
        *fsdp_qlora_findings(local, budget, spec.hardware.host_memory_bytes),  # FSDP-QLoRA, FSDP loading
        *allocator_findings(local, None if replayed is None else replayed.fraction),
        *_side_pool_findings(side, released),
        *reserved_risk_findings(local, peak_allocated, peak_reserved, outside, budget),
        *load_findings(loaded, step_reserved),
        *save_findings(saving, spec.hardware.host_memory_bytes),
        *versions_findings(spec),  # library versions vs the modelled ones (activations/versions.py)
        *evaluation_findings(spec, totals),
        *parallel_findings(spec, traced=parallel and activations is not None),
        *_context_findings(spec),
        *int8_outlier_findings(local, device_used, budget),  # LLM.int8's outlier columns (activations/int8_outliers)
        *_verdict(spec, components, phase, device_used, budget, host),
    ]
    if activations is not None:  # traced: the formulas' own "not pinned" warnings do not apply to this number
        findings = [f for f in findings if f.code not in _FORMULA_UNPINNED]
        findings.extend(traced_trainer_finding(spec, activations))  # a TRL run: which parts are traced, which formula
    # pinned: traced or inside the checked envelope, and no note saying that part of the run is not modelled
    unpinning = _NOT_MODELLED if activations is not None else _NOT_MODELLED | _FORMULA_UNPINNED
    notes = sorted({f.code for f in findings if f.code in unpinning}
                   | _unmodelled_stack_notes(spec, findings, activations is not None))
    pinned = (activations is not None or in_envelope(spec)) and not notes
    if not pinned:
        findings.append(not_pinned_finding(spec, notes))
    findings.sort(key=lambda f: _SEVERITY_ORDER[f.severity])
    trainable = trainable_params(spec)
    total = spec.model.total_params + _adapter_params(spec, trainable)
    return Report(
        spec=spec,
        components=components,
        peak_phase=phase,
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=peak_reserved,
        device_used_bytes=device_used,
        budget_bytes=budget,
        host_bytes=host,
        fits=device_used <= budget and host_ok,
        findings=tuple(findings),
        regime=describe_regime(local) + (f"; parallelism {describe_layout(spec)}" if parallel else ""),
        trainable_params=trainable,
        total_params=total,
        pinned=pinned,
    )


def _load_fits(spec: TrainingSpec, budget: int, host_limit: int | None) -> bool:
    """Loading under FSDP fits: a 4-bit model loaded whole on each GPU, the host copies (fsdp_qlora.py)."""
    peak = load_peak(spec)
    if peak is None:
        return True
    return peak.gpu_bytes <= budget and (host_limit is None or peak.host_bytes <= host_limit)


def _adapter_params(spec: TrainingSpec, trainable: int) -> int:
    """Parameters PEFT adds on top of the base model (0 without PEFT)."""
    if spec.lora is None:
        return peft_adapter_params(spec)
    from fitcheck.core.states import adapter_param_count

    return adapter_param_count(spec)
