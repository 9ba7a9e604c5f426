"""The checked envelope: which kinds of run the activation formulas were checked for against traces; pure.

``benchmarks/formula_vs_trace.py`` estimates every catalog family (one real model each, real widths) × method
× checkpointing × attention × precision twice on the same CPU spec — with the pure formulas and with a
fake-tensor trace of the real transformers model — and prints the worst |formula − trace| / trace over the
phases of the step. ``CHECKED`` holds the (family, method, checkpointing, attention, precision) combinations
whose cell was within ``TOLERANCE`` at the last run — data read from ``fitcheck/catalog/envelope_cells.json``
(the floor below reads the file; this module holds only the rules) —; ``envelope_key`` says which combination a
spec is.
A spec outside the envelope is not answered silently from the formula: ``fitcheck.core.estimator.estimate`` marks the
report ``pinned=False`` with a WARNING, and the CLI traces instead when torch is installed.

Pinned means checked at this shape (issue 20): only a kind with a row in ``fitcheck/catalog/envelope_ranges.json``
(``benchmarks/envelope_ranges.py``: 3 sequences up to >= 32k, micro-batch 1 and 8, two widths, per phase on the
activation and logits bytes) is pinned, and only inside its checked range. ``CHECKED`` / ``CHECKED_INT8`` (one
shape each, compared on device totals) no longer pin anything: they say which kinds the single-cell grids found
within 2 %, and a kind never range-checked is ``pinned: false``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fitcheck.catalog import EnvelopeKey, envelope_cells, envelope_probe_misses, envelope_ranges
from fitcheck.core.activations.envelope_range import (
    CUDA_SUFFIX,
    RANK_CLASS_LIMIT,
    checked_at_shape,
    range_label,
    recipe_of,
    recipe_suffix,
    unchecked_step,
)
from fitcheck.core.activations.freeze import layer_granular
from fitcheck.core.activations.qlora import kbit_upcast
from fitcheck.findings import Finding, Severity
from fitcheck.spec import AttnImpl, DeviceType, Dtype, MixedPrecision, NormKind, TrainingSpec

TOLERANCE = 0.02

# The cells are data, written by the benchmarks that check them (fitcheck/catalog/envelope_cells.json; each block
# says which run checked it): benchmarks/formula_vs_trace.py --update rewrites its block, 655 of 1288 grid cells
# within 2 % at its last run (2026-11-23, the table is in benchmarks/README.md); moe_mla_vs_trace.py checked the
# Qwen3-MoE and DeepSeek-V3 cells; the QLoRA-without-k-bit-preparation cells come from the same grid run on
# branch i12place. Refused by the tracer, hence never here: 8-bit bases, LoRA on Mixtral's fused experts with
# dropout (peft ParamWrapper).
CHECKED: frozenset[EnvelopeKey] = envelope_cells("formula_vs_trace", "moe_mla_vs_trace", "qlora_noprep")

# LLM.int8 LoRA cells within 2 % of a trace of real bitsandbytes Linear8bitLt layers on CPU (MatMul8bitFp,
# benchmarks/int8_vs_trace.py): pinned on CPU only (in_envelope).
CHECKED_INT8: frozenset[EnvelopeKey] = envelope_cells("int8_vs_trace")


def method_of(spec: TrainingSpec) -> str | None:
    """The grid's method name of a spec (None: a kind of run the grid does not cover)."""
    lora, quant, freeze = spec.lora, spec.quant, spec.freeze
    if spec.peft is not None:
        return None  # a non-LoRA PEFT adapter: traced only (core/states/peft_adapter.py)
    if freeze is not None:
        return "freeze" if layer_granular(spec) else None
    if lora is not None and (lora.target_parameters or lora.modules_to_save or lora.layers_to_transform
                             or lora.rank_pattern or lora.target_regex):
        return None  # adapters on fused experts, trained copies, per-layer subsets: not in the grid
    if quant is not None:
        if lora is None or lora.use_dora:
            return None
        if not kbit_upcast(spec):  # no k-bit preparation on a 16-bit load (activations/qlora16.py)
            return "qlora_noprep" if quant.bits == 4 and not quant.pre_quantized else None
        return "qlora" if quant.bits == 4 else "int8"
    if lora is not None:
        return "dora" if lora.use_dora else "lora"
    return "full"


def precision_of(spec: TrainingSpec) -> str | None:
    """``bf16`` (16-bit model), ``autocast`` (bf16 autocast; fp32 model, or bf16-loaded quantized base) or
    ``fp32``, or ``bf16amp`` (a bf16 model with adapters under bf16 autocast); None for fp16 and other mixes (not
    in the grid)."""
    load, mixed = spec.precision.load_dtype, spec.precision.mixed_precision
    if mixed is MixedPrecision.BF16:
        if load is Dtype.FLOAT32 or (spec.quant is not None and load is Dtype.BFLOAT16):
            return "autocast"
        if load is Dtype.BFLOAT16 and spec.lora is None:
            # bf16 weights under bf16 autocast: every cast is a no-op (autocast_mode.cpp cached_cast returns a
            # tensor already in the target dtype), the step is the bf16 one (trace: Llama-3-8B, Qwen2.5-7B
            # with and without checkpointing, 0.00 %); LoRA's fp32 adapters do get cast: not in the grid
            return "bf16"
        if load is Dtype.BFLOAT16 and spec.quant is None:
            return "bf16amp"  # bf16 model, bf16 autocast, fp32 adapters cast (differential.ADAPTER_PRECISIONS)
        return None
    if mixed is not MixedPrecision.NO:
        return None
    return {Dtype.BFLOAT16: "bf16", Dtype.FLOAT32: "fp32"}.get(load)


def envelope_key(spec: TrainingSpec) -> EnvelopeKey | None:
    """The grid cell kind a spec is, or None when no cell of the grid describes it."""
    method, precision = method_of(spec), precision_of(spec)
    act = spec.activations
    attn = act.attn_implementation
    if method is None or precision is None or attn not in (AttnImpl.SDPA, AttnImpl.EAGER):
        return None
    if act.checkpointing and act.checkpoint_every_n_layers != 1:
        return None
    return (spec.model.shape.family, method, act.checkpointing, attn.value, precision)


def cuda_only_terms(spec: TrainingSpec) -> str | None:
    """What a CUDA step of this spec keeps that a CPU-checked range row did not check, or None.

    The range rows without ``@cuda`` were checked on CPU specs against CPU traces. Where the CUDA step keeps other
    tensors than the CPU one in a way the formulas' CUDA branch was never checked for, only a row checked on CUDA
    specs against the CUDA-emulating trace (``torch_adapters/cuda_emulation.py``; ``benchmarks/envelope_ranges.py
    --device cuda``) pins the answer:

    - CUDA autocast runs ``layer_norm`` and ``pow`` (``gelu_new``) in fp32 (torch 2.13 ``ATen/autocast_mode.h``
      ``AT_FORALL_FP32``; CPU autocast lists neither), so a LayerNorm family under autocast keeps fp32 tensors the
      formulas count in 16 bits (H200, Phi-2 LoRA bf16 autocast 4 x 2048: the formula was -11 %).
    - SDPA with attention dropout runs a fused kernel on CUDA (no s x s tensor) and the math path on a CPU: the
      formulas' CUDA branch of it (``layernorm_blocks.fused_math``) was not checked by the CPU rows.
    - QLoRA without k-bit preparation under autocast, checkpointed: peft 0.21.2 ``tuners/lora/bnb.py``
      ``Linear4bit.forward`` runs its LoRA branch on the 16-bit input when the argument-less
      ``torch.is_autocast_enabled()`` (CUDA's) is True, and in fp32 under CPU autocast (``cuda_emulation.py`` item
      5), so the first recomputed layer's backward holds 8·I B/token less on CUDA (``qlora16.sixteen_bit_branch``).
      Without checkpointing the backward's peak comes before any branch's input gradient: the CUDA trace of every
      shape of ``llama/qlora_noprep/nockpt/sdpa/autocast`` is the same with either branch (the ``@cuda`` check
      -3.60 % .. 0.00 % per shape with both), so the CPU row still describes it.
    """
    if spec.hardware.device_type is DeviceType.CPU:
        return None
    traits = spec.model.shape.traits
    if spec.precision.mixed_precision is not MixedPrecision.NO and traits.norm_kind is NormKind.LAYERNORM:
        return "CUDA autocast runs layer_norm and pow (gelu_new) in fp32, where CPU autocast keeps 16 bits"
    eager = spec.activations.attn_implementation is AttnImpl.EAGER or traits.eager_only
    if not eager and traits.dropout.attention > 0:
        return "SDPA with attention dropout runs a fused kernel on CUDA and the math path on a CPU"
    if (spec.precision.mixed_precision is not MixedPrecision.NO and spec.activations.checkpointing
            and method_of(spec) == "qlora_noprep"):
        return ("peft's 4-bit LoRA layers run their branch on the 16-bit input under CUDA autocast "
                "(torch.is_autocast_enabled() reports CUDA's), in fp32 under CPU autocast")
    return None


def _cuda_row_applies(spec: TrainingSpec, key: EnvelopeKey, ranges: Mapping[str, object]) -> bool:
    """Whether the kind's ``@cuda`` row describes this CUDA spec: it exists, and the spec is not 16-bit weights
    under autocast in a family where CUDA autocast changes the step (the grid's ``bf16`` cells run no autocast)."""
    if key[4] == "bf16" and spec.precision.mixed_precision is not MixedPrecision.NO and cuda_only_terms(spec):
        return False
    return range_label(key, (recipe_suffix(spec) or "") + CUDA_SUFFIX) in ranges


def in_envelope(spec: TrainingSpec) -> bool:
    """Whether the activation formulas were checked against traces for this run: its kind, its per-token recipe
    and (where the kind was range-checked) its shape.

    - The recipe must be one the grids ran (``envelope_range.recipe_of``: TRL's default adapters on every
      linear layer, or peft's default q/v targets with their own ``+qv`` rows, r <= 64, dropout on; no Liger,
      fused/chunked loss, activation offloading, vision inputs or reentrant checkpointing).
    - A kind checked over a range of shapes (``fitcheck/catalog/envelope_ranges.json``, written by
      ``benchmarks/envelope_ranges.py``) is pinned only inside that range, and only when every shape and phase was
      within 2 % on the activation and logits bytes.
    - A kind never range-checked is not pinned (issue 20: its single grid cell, ``CHECKED`` / ``CHECKED_INT8``,
      was one shape compared on total bytes, which hides a wrong activation term behind the model states).
    - A kind an off-grid probe found more than 2 % off its trace (``fitcheck/catalog/envelope_probe_misses.json``,
      written by ``benchmarks/pinned_probes.py --record-misses``) is not pinned anywhere: its range was checked at
      two widths, and the probe's model (another width, vocabulary or ratio) showed a term the range missed.
    - LLM.int8 on CUDA is never pinned (MatMul8bitLt, modelled from source; the traces run MatMul8bitFp); on CPU
      it is pinned where its range was checked, like any other kind.
    - A CUDA spec is pinned by its kind's ``@cuda`` row where one exists (checked on CUDA specs against the
      CUDA-emulating trace), and needs one where ``cuda_only_terms`` says the CPU row did not check it; a
      LayerNorm family's 16-bit weights under autocast (the ``bf16`` kind, whose cells run without autocast) are
      not pinned on CUDA.
    """
    key = envelope_key(spec)
    if key is not None and key[1] == "int8" and spec.hardware.device_type is not DeviceType.CPU:
        return False  # CUDA runs MatMul8bitLt, modelled from source; the traces ran MatMul8bitFp (activations/int8.py)
    rs = recipe_suffix(spec)
    if key is None or rs is None:
        return False
    if range_label(key, rs) in envelope_probe_misses():
        return False  # an off-grid probe of this kind was more than 2 % off its trace (benchmarks/pinned_probes.py)
    ranges = envelope_ranges()
    if spec.hardware.device_type is not DeviceType.CPU:
        if _cuda_row_applies(spec, key, ranges):
            return checked_at_shape(spec, key, ranges, CUDA_SUFFIX)
        if cuda_only_terms(spec) is not None:
            return False
    return checked_at_shape(spec, key, ranges)  # no range row: never range-checked, not pinned


def not_pinned_finding(spec: TrainingSpec, notes: Sequence[str] = ()) -> Finding:
    """The WARNING an answer that is not pinned carries.

    Args:
        spec: The run.
        notes: Codes of the findings that say part of the run is not modelled (then the answer is not pinned
            even inside the envelope or traced).
    """
    key = envelope_key(spec)
    recipe = recipe_of(spec)
    rs = recipe_suffix(spec)
    if key is not None and key[1] == "int8" and spec.hardware.device_type is not DeviceType.CPU:  # (in_envelope)
        return Finding(
            "not-pinned",
            Severity.WARNING,
            "activation memory of the 8-bit layers is modelled from bitsandbytes' CUDA source (MatMul8bitLt), not "
            "traced: the CPU trace runs MatMul8bitFp instead. Measured on an H200 with random weights "
            "(benchmarks/data/gpu_truth_nvidia_h200.json): Llama-3.2-1B 4 x 1024 -1.4 %, Llama-2-7B 8 layers "
            "1 x 4096 -7.6 % (checkpointed -17.5 %), below by the outlier columns MatMul8bitLt keeps (subA: "
            "almost every down_proj input column with random weights, a few in a trained model; not counted); "
            "+0.0 %, +0.2 % and -2.9 % with them counted (benchmarks/int8_cuda_outliers.py)",
            "measure one step on the GPU (benchmarks/gpu_truth.py) if the margin is small",
        )
    if notes:
        return Finding(
            "not-pinned",
            Severity.WARNING,
            f"activation memory is not pinned: part of this run is not modelled (see {', '.join(notes)})",
            "measure one step (FitcheckCallback, benchmarks/gpu_truth.py) if the margin is small",
        )
    ranges = envelope_ranges()
    if key is None:
        what = "this kind of run (method, precision or attention) is not in the formula-vs-trace grid"
    elif recipe is None:
        what = (f"{unchecked_step(spec)} is not in the formula-vs-trace grids (none of Liger kernels, a fused or "
                "chunked loss, activation offloading, vision inputs and reentrant checkpointing is)")
    elif rs is None:
        what = (f"the adapters ({', '.join(recipe)}) are not a checked recipe (every linear layer or peft's default "
                f"q_proj/v_proj, r <= {RANK_CLASS_LIMIT}, dropout on)")
    elif range_label(key, rs) in envelope_probe_misses():
        miss = max(envelope_probe_misses()[range_label(key, rs)],
                   key=lambda p: max(abs(e) for e in p["errors"].values()))
        phase, err = max(miss["errors"].items(), key=lambda kv: abs(kv[1]))
        what = (f"{range_label(key, rs)} was within 2 % over its checked range, but an off-grid probe "
                f"(benchmarks/pinned_probes.py) of {miss['model']} at {miss['batch']} x {miss['seq']} was {err:+.1f} % "
                f"off the trace {phase}")
    elif spec.hardware.device_type is not DeviceType.CPU and _cuda_row_applies(spec, key, ranges):
        row = ranges[range_label(key, rs + CUDA_SUFFIX)]
        what = (f"{range_label(key, rs)} was checked on CUDA specs against the CUDA-emulating trace at "
                f"{len(row['shapes'])} shapes (benchmarks/envelope_ranges.py --device cuda): "
                + ("this shape is outside them" if row["within"] else
                   "not within 2 % at every shape and phase (worst: " + ", ".join(
                       f"{phase} {err:+.1f} %" for phase, err in row["worst"].items()) + ")"))
    elif checked_at_shape(spec, key, ranges) and (cuda_why := cuda_only_terms(spec)) is not None:
        what = (f"{range_label(key, rs)} was range-checked on CPU only, and this CUDA step differs from it "
                f"({cuda_why}; benchmarks/envelope_ranges.py --device cuda has no row for it)")
    elif range_label(key, rs) in ranges:
        row = ranges[range_label(key, rs)]
        what = (f"{range_label(key, rs)} was checked at {len(row['shapes'])} shapes (benchmarks/envelope_ranges.py): "
                + ("this shape is outside them" if row["within"] else
                   "not within 2 % at every shape and phase (worst: " + ", ".join(
                       f"{phase} {err:+.1f} %" for phase, err in row["worst"].items()) + ")"))
    else:
        what = (f"{range_label(key, rs)} was never range-checked (benchmarks/envelope_ranges.py has no row for it: "
                + ("one grid shape was within 2 % on total bytes, not a range of shapes per phase)"
                   if key in CHECKED or key in CHECKED_INT8 else "nor was it within 2 % at its one grid shape)"))
    return Finding(
        "not-pinned",
        Severity.WARNING,
        f"activation memory is from an unchecked formula: {what}",
        "install torch + transformers (fitcheck then traces the real model on fake tensors) or pass --trace",
    )
