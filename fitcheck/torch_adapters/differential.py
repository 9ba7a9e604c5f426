"""Formula vs fake-tensor trace on the same spec, at real widths: the differential check behind the envelope.

One :class:`Cell` is a (catalog model, method, checkpointing, attention, precision, sequence, micro-batch) run.
:func:`compare` estimates it twice with ``fitcheck.core.estimate`` on a CPU device (live tensors only):
once with the pure activation formulas, once with the activation components of a fake-tensor trace of the real
transformers model (``fitcheck.torch_adapters.tracer_depth.trace_components``: one and two layer groups traced and
extrapolated to the full depth; the model states are the same pure code in both, and they equal PyTorch's
allocations to the byte, ``tests/test_torch_model_states.py``). The error of a cell is the worst, over the phases
of the step (end of forward, start of backward, during backward), of |formula − trace| / trace.

``benchmarks/formula_vs_trace.py`` runs the grid and prints the worst error per family and method; the result
is written into ``fitcheck.core.activations.envelope`` (the checked envelope the estimate consults).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from fitcheck.report import Phase
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    Dtype,
    FreezeSpec,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    OptimizerSpec,
    PrecisionSpec,
    QuantSpec,
    TrainingSpec,
)

# One catalog model per family: the real widths the grid runs at.
FAMILY_MODELS: dict[str, str] = {
    "llama": "meta-llama/Meta-Llama-3-8B",
    "mistral": "mistralai/Mistral-7B-v0.1",
    "qwen2": "Qwen/Qwen2.5-7B",
    "gemma": "google/gemma-7b",
    "gemma2": "google/gemma-2-9b",
    "mixtral": "mistralai/Mixtral-8x7B-v0.1",
    "phi3": "microsoft/Phi-3-mini-4k-instruct",
    "phi": "microsoft/phi-2",
    "gpt2": "openai-community/gpt2-large",
    "falcon": "tiiuae/falcon-7b",
    "bloom": "bigscience/bloomz-7b1",
    "olmo2": "allenai/OLMo-2-1124-7B",  # issue 12 (branch i12pin)
    "gpt_oss": "openai/gpt-oss-20b",
    "qwen3": "Qwen/Qwen3-8B",  # the current dense Qwen (q/k norms per head): session 3
    "granite": "ibm-granite/granite-3.3-8b-instruct",  # issue 18: the family added by walking the recipe
}
METHODS = ("full", "lora", "qlora", "int8", "dora", "freeze", "qlora_noprep")
PRECISIONS = ("bf16", "autocast", "fp32")
# bf16-loaded model + bf16 autocast (``torch_dtype=bfloat16`` and ``TrainingArguments(bf16=True)``): the usual LoRA
# recipe. Only adapters differ from plain bf16 there (their fp32 weights are cast): run for LoRA and DoRA only.
ADAPTER_PRECISIONS = ("bf16amp",)
_ADAPTER_METHODS = ("lora", "dora")
PHASES = (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD)
# TRL ModelConfig defaults (lora_r 16, alpha 32, dropout 0.05) on every linear layer
_LORA = LoraSpec(r=16, alpha=32, dropout=0.05, target_modules=("all-linear",))
# QLoRA as TRL's docs configure it: nf4, double quantization, bf16 compute
_NF4 = QuantSpec(quant_type="nf4", double_quant=True, compute_dtype=Dtype.BFLOAT16)
# Partial freezing is traced at this depth (every layer traced: frozen and trainable layers differ)
FREEZE_DEPTH = 4


@dataclass(frozen=True)
class Cell:
    """One run of the grid.

    Attributes:
        family: Key of ``FAMILY_MODELS``.
        method: ``full`` / ``lora`` / ``qlora`` / ``int8`` / ``dora`` / ``freeze`` (last layer trained, the rest
            frozen, at ``FREEZE_DEPTH`` layers) / ``qlora_noprep`` (QLoRA without peft's k-bit preparation, as
            TRL 1.16 runs it).
        ckpt: Gradient checkpointing.
        attn: ``sdpa`` / ``eager``.
        precision: ``bf16`` (16-bit model, no autocast), ``autocast`` (bf16 autocast over an fp32 model; for
            quantized bases over a bf16-loaded model, as TRL's ``--bf16`` QLoRA runs) or ``fp32`` (no autocast).
        seq: Tokens per sequence.
        batch: Micro-batch.
    """

    family: str
    method: str
    ckpt: bool
    attn: str
    precision: str
    seq: int
    batch: int

    @property
    def label(self) -> str:
        """A short readable name."""
        ck = "ckpt" if self.ckpt else "nockpt"
        return f"{self.family}/{self.method}/{ck}/{self.attn}/{self.precision}/{self.batch}x{self.seq}"


@dataclass(frozen=True)
class Outcome:
    """Formula vs trace of one cell.

    Attributes:
        cell: The run.
        formula: Phase -> allocated bytes from the formulas.
        trace: Phase -> allocated bytes with traced activations.
        error: Worst |formula − trace| / trace over ``PHASES`` (signed value of the worst).
        refused: Why the run could not be traced or estimated (then the numbers are empty).
    """

    cell: Cell
    formula: dict[Phase, int]
    trace: dict[Phase, int]
    error: float
    refused: str = ""


def model_config(family: str) -> dict[str, object]:
    """The catalog config.json of a family's representative model."""
    from fitcheck.catalog import find_catalog_config

    found = find_catalog_config(FAMILY_MODELS[family])
    if found is None:
        raise KeyError(f"{FAMILY_MODELS[family]} is not in the catalog")
    return dict(found[0])


def cell_spec(cell: Cell, config: dict[str, object] | None = None) -> TrainingSpec:
    """The TrainingSpec of a cell: one CPU process, plain AdamW, the catalog model's real widths."""
    from fitcheck.readers import inventory_from_config

    cfg = dict(config if config is not None else model_config(cell.family))
    if cell.method == "freeze":
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if key in cfg:
                cfg[key] = FREEZE_DEPTH
        if isinstance(cfg.get("layer_types"), list):
            cfg["layer_types"] = list(cfg["layer_types"])[:FREEZE_DEPTH]  # type: ignore[call-overload]
    quantized = cell.method in ("qlora", "int8", "qlora_noprep")
    if cell.precision == "bf16amp":
        precision = PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16)
    elif cell.precision == "autocast":
        precision = PrecisionSpec(Dtype.BFLOAT16 if quantized else Dtype.FLOAT32, MixedPrecision.BF16)
    elif cell.precision == "fp32":
        precision = PrecisionSpec(Dtype.FLOAT32, MixedPrecision.NO)
    else:
        precision = PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.NO)
    lora: LoraSpec | None = None
    if cell.method in ("lora", "qlora", "int8", "qlora_noprep"):
        lora = _LORA
    elif cell.method == "dora":
        lora = dataclasses.replace(_LORA, use_dora=True)
    quant = _NF4 if cell.method == "qlora" else QuantSpec(bits=8) if cell.method == "int8" else None
    if cell.method == "qlora_noprep":  # TRL 1.16 never calls prepare_model_for_kbit_training
        quant = dataclasses.replace(_NF4, prepare_for_kbit_training=False)
    freeze = FreezeSpec(trainable=("*",), trainable_layers=(FREEZE_DEPTH - 1,)) if cell.method == "freeze" else None
    return TrainingSpec(
        model=inventory_from_config(cfg, FAMILY_MODELS[cell.family], "fitcheck/catalog"),
        precision=precision,
        optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(micro_batch=cell.batch, seq_len=cell.seq),
        activations=ActivationSpec(checkpointing=cell.ckpt, attn_implementation=AttnImpl(cell.attn)),
        hardware=HardwareSpec(device_type=DeviceType.CPU),
        lora=lora,
        quant=quant,
        freeze=freeze,
    )


def compare(cell: Cell, config: dict[str, object] | None = None) -> Outcome:
    """Formula vs trace of one cell (a refusal of either side is returned, not raised)."""
    from fitcheck.core import estimate
    from fitcheck.errors import FitcheckError
    from fitcheck.torch_adapters.tracer_depth import trace_components

    try:
        spec = cell_spec(cell, config)
        formula = estimate(spec)
        traced = estimate(spec, activations=trace_components(spec))
    except (FitcheckError, NotImplementedError, ValueError, TypeError, RuntimeError) as exc:
        return Outcome(cell, {}, {}, 0.0, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    f = {p: sum(c.at(p) for c in formula.components if c.location.value == "device") for p in PHASES}
    t = {p: sum(c.at(p) for c in traced.components if c.location.value == "device") for p in PHASES}
    worst = max(PHASES, key=lambda p: abs(f[p] - t[p]) / max(t[p], 1))
    return Outcome(cell, f, t, (f[worst] - t[worst]) / max(t[worst], 1))


def grid(families: tuple[str, ...] = tuple(FAMILY_MODELS), methods: tuple[str, ...] = METHODS,
         seqs: tuple[int, int] = (256, 2048), batches: tuple[int, int] = (1, 4)) -> Iterator[Cell]:
    """Every family × method × checkpointing × attention × precision, one (seq, batch) per cell.

    The (short/long sequence, micro-batch 1/4) pair rotates over the cells of each (family, method), so every
    pair is exercised for every method while the grid stays 12 cells per (family, method): activations are
    linear in the micro-batch and (SDPA) in the sequence, eager's s² term is checked at the long sequences.
    """
    pairs = [(s, b) for s in seqs for b in batches]
    for family in families:
        for method in methods:
            i = 0
            for ckpt in (False, True):
                for attn in ("sdpa", "eager"):
                    for precision in PRECISIONS:
                        seq, batch = pairs[i % len(pairs)]
                        i += 1
                        yield Cell(family, method, ckpt, attn, precision, seq, batch)
            if method not in _ADAPTER_METHODS:
                continue
            for ckpt in (False, True):  # after the others, so that their (seq, batch) rotation is unchanged
                for attn in ("sdpa", "eager"):
                    for precision in ADAPTER_PRECISIONS:
                        seq, batch = pairs[i % len(pairs)]
                        i += 1
                        yield Cell(family, method, ckpt, attn, precision, seq, batch)


# The categories a trace measures (activation, logits and temporary components): the error of a shape is measured
# on them, not on device totals that also hold the model states (the same pure code on both sides).
_MEASURED = ("activations", "logits and loss", "temporaries")


def phase_errors(spec: TrainingSpec, traced_components: tuple[object, ...]) -> dict[Phase, float]:
    """Signed error of the formulas per phase, relative to the traced activation, logits and temporary bytes.

    Args:
        spec: A CPU spec (live tensors only).
        traced_components: ``trace_result.components_from_trace`` of a trace of that spec's step.

    Returns:
        Phase -> (formula total − traced total) / traced (activations + logits + temporaries), for ``PHASES``.
        The model states are the same pure components on both sides, so the difference is the activation
        formulas' alone; dividing by the activation part, not the device total, keeps a large model's weights
        and optimizer states from hiding a wrong activation term.
    """
    from fitcheck.core import estimate
    from fitcheck.report import Component

    comps = tuple(c for c in traced_components if isinstance(c, Component))
    formula, traced = estimate(spec), estimate(spec, activations=comps)
    out: dict[Phase, float] = {}
    for p in PHASES:
        f = sum(c.at(p) for c in formula.components if c.location.value == "device")
        t = sum(c.at(p) for c in traced.components if c.location.value == "device")
        act = sum(c.at(p) for c in traced.components
                  if c.location.value == "device" and c.category.value in _MEASURED)
        out[p] = (f - t) / max(act, 1)
    return out
