"""The checked envelope: which kinds of run the activation formulas were checked for against traces; pure.

``benchmarks/formula_vs_trace.py`` estimates every catalog family (one real model each, real widths) × method
× checkpointing × attention × precision twice on the same CPU spec — with the pure formulas and with a
fake-tensor trace of the real transformers model — and prints the worst |formula − trace| / trace over the
phases of the step. ``CHECKED`` lists the (family, method, checkpointing, attention, precision) combinations
whose cell was within ``TOLERANCE`` at the last run; ``envelope_key`` says which combination a spec is.
A spec outside the envelope is not answered silently from the formula: ``fitcheck.core.estimator.estimate`` marks the
report ``pinned=False`` with a WARNING, and the CLI traces instead when torch is installed.
"""

from __future__ import annotations

from fitcheck.core.activations.freeze import layer_granular
from fitcheck.findings import Finding, Severity
from fitcheck.spec import AttnImpl, Dtype, MixedPrecision, TrainingSpec

TOLERANCE = 0.02

EnvelopeKey = tuple[str, str, bool, str, str]

# (family, method, checkpointing, attention, precision) within 2 % of the trace at the last run of
# benchmarks/formula_vs_trace.py (the table and its date are in benchmarks/README.md).
CHECKED: frozenset[EnvelopeKey] = frozenset()


def method_of(spec: TrainingSpec) -> str | None:
    """The grid's method name of a spec (None: a kind of run the grid does not cover)."""
    lora, quant, freeze = spec.lora, spec.quant, spec.freeze
    if freeze is not None:
        return "freeze" if layer_granular(spec) else None
    if lora is not None and (lora.target_parameters or lora.modules_to_save or lora.layers_to_transform
                             or lora.rank_pattern or lora.target_regex):
        return None  # adapters on fused experts, trained copies, per-layer subsets: not in the grid
    if quant is not None:
        if lora is None or lora.use_dora or not quant.prepare_for_kbit_training:
            return None
        return "qlora" if quant.bits == 4 else "int8"
    if lora is not None:
        return "dora" if lora.use_dora else "lora"
    return "full"


def precision_of(spec: TrainingSpec) -> str | None:
    """``bf16`` (16-bit model), ``autocast`` (bf16 autocast; fp32 model, or bf16-loaded quantized base) or
    ``fp32``; None for fp16 and other mixes (not in the grid)."""
    load, mixed = spec.precision.load_dtype, spec.precision.mixed_precision
    if mixed is MixedPrecision.BF16:
        if load is Dtype.FLOAT32 or (spec.quant is not None and load is Dtype.BFLOAT16):
            return "autocast"
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


def in_envelope(spec: TrainingSpec) -> bool:
    """Whether the activation formulas were checked against traces for this kind of run."""
    key = envelope_key(spec)
    return key is not None and key in CHECKED


def not_pinned_finding(spec: TrainingSpec) -> Finding:
    """The WARNING a formula answer outside the envelope carries."""
    key = envelope_key(spec)
    if key is None:
        what = "this kind of run (method, precision or attention) is not in the formula-vs-trace grid"
    else:
        family, method, ckpt, attn, precision = key
        what = (f"{family} / {method} / checkpointing {'on' if ckpt else 'off'} / {attn} / {precision} was not "
                f"within {TOLERANCE:.0%} of a fake-tensor trace in benchmarks/formula_vs_trace.py")
    return Finding(
        "not-pinned",
        Severity.WARNING,
        f"activation memory is from an unchecked formula: {what}",
        "install torch + transformers (fitcheck then traces the real model on fake tensors) or pass --trace",
    )
