"""Read a DeepSpeed JSON config and resolve its ``"auto"`` values the way transformers does.

Resolution follows transformers 5.23 ``transformers/integrations/deepspeed.py``:

* ``HfTrainerDeepSpeedConfig.trainer_config_process`` (run when TrainingArguments is built):
  ``train_micro_batch_size_per_gpu`` <- ``per_device_train_batch_size``, ``gradient_accumulation_steps`` <-
  ``gradient_accumulation_steps``, ``train_batch_size`` <- world x micro x GAS, ``fp16.enabled`` <- ``fp16``,
  ``bf16.enabled`` <- ``bf16``. ``fill_match`` fills only keys that are present and ``"auto"``; a concrete
  value that differs from TrainingArguments is a mismatch ("- ds {key}={ds} vs hf {hf_key}={hf}"), raised at
  ``trainer_config_finalize`` with "The easiest method is to set these DeepSpeed config values to 'auto'".
* ``trainer_config_finalize``: the hidden-size based ``zero_optimization`` keys, filled in
  :mod:`fitcheck.readers.deepspeed_zero` (which also checks that section's keys against DeepSpeed's).
* DeepSpeed itself (``deepspeed/runtime/config.py`` ``_set_batch_related_parameters`` / ``_batch_assertion``)
  derives a missing batch key from the other two and asserts
  ``train_batch_size == micro_batch * grad_acc * world_size``: :mod:`fitcheck.readers.deepspeed_batch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.deepspeed_batch import batch_int, set_batch_related
from fitcheck.readers.deepspeed_optimizer import ConfigOptimizer, read_config_optimizer
from fitcheck.readers.deepspeed_zero import not_modelled_findings, zero_spec
from fitcheck.readers.run_settings import DEFAULTS as _RUN_DEFAULTS
from fitcheck.readers.sources import as_bool, is_auto, load_mapping_file, where
from fitcheck.spec import DeepSpeedSpec, MixedPrecision

# TrainingArguments defaults "auto" falls back to (transformers training_args.py), written once in RunSettings.
_TA_DEFAULT_MICRO = _RUN_DEFAULTS.per_device_train_batch_size
_TA_DEFAULT_GAS = _RUN_DEFAULTS.gradient_accumulation_steps
_EASIEST = "The easiest method is to set these DeepSpeed config values to 'auto'."  # transformers' wording


@dataclass(frozen=True)
class DeepSpeedRead:
    """A DeepSpeed config with every memory-relevant ``"auto"`` resolved.

    Attributes:
        spec: The memory-relevant settings.
        micro_batch: ``train_micro_batch_size_per_gpu`` after resolution.
        grad_accum: ``gradient_accumulation_steps`` after resolution.
        train_batch_size: ``train_batch_size`` after resolution (micro x GAS x data-parallel world).
        mixed_precision: What ``bf16.enabled``/``fp16.enabled`` imply (NO when neither is enabled).
        precision_from_file: True when the file itself sets bf16/fp16 ``enabled`` to a concrete value.
        provenance: Field -> where it was read or what filled it.
        findings: Mismatches with TrainingArguments, deprecated keys, unknown keys, not-modelled features.
        optimizer: What the config's own ``optimizer`` section builds (None without one): the run's ``optim``.
    """

    spec: DeepSpeedSpec
    micro_batch: int
    grad_accum: int
    train_batch_size: int
    mixed_precision: MixedPrecision
    precision_from_file: bool
    provenance: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    optimizer: ConfigOptimizer | None = None


# accelerate DeepSpeedPlugin zero_stage default (accelerate 1.15 utils/dataclasses.py).
ACCELERATE_ZERO_STAGE = 2


def accelerate_deepspeed_config(
    stage: int = ACCELERATE_ZERO_STAGE,
    gradient_accumulation_steps: object = "auto",
    offload: Mapping[str, object] | None = None,
    save_16bit_model: bool | None = None,
) -> dict[str, object]:
    """The DeepSpeed dict accelerate builds without a config file (``DeepSpeedPlugin.__post_init__``,
    accelerate 1.15 utils/dataclasses.py): ``zero_stage`` default 2, batch sizes ``"auto"``.

    Args:
        stage: ``zero_stage``.
        gradient_accumulation_steps: accelerate's value (``"auto"`` unless its config sets one).
        offload: ``offload_optimizer``/``offload_param`` sections, when the accelerate config names them.
        save_16bit_model: ``zero3_save_16bit_model``, when the accelerate config sets it: accelerate writes it as
            ``zero_optimization.stage3_gather_16bit_weights_on_model_save`` (same ``__post_init__``).
    """
    zero: dict[str, object] = {"stage": stage, **(offload or {})}
    if save_16bit_model is not None:
        zero["stage3_gather_16bit_weights_on_model_save"] = save_16bit_model
    return {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "zero_optimization": zero,
    }


def load_deepspeed_file(path: str) -> dict[str, object]:
    """Load a DeepSpeed JSON config (DeepSpeed reads it with ``json.load``).

    Raises:
        ConfigError: Missing file, malformed JSON, or not a mapping.
    """
    return load_mapping_file(path, what="DeepSpeed config (--deepspeed)")


def _section(raw: Mapping[str, object], key: str, source: str) -> dict[str, object] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where(source, key)}: expected a mapping of settings, got {value!r}")
    return {str(k): v for k, v in value.items()}


@dataclass
class _Run:
    """What the resolution takes from the run (TrainingArguments/CLI after precedence)."""

    micro: int | None
    gas: int | None
    bf16: bool | None
    fp16: bool | None
    world: int
    hidden: int | None
    names: Mapping[str, str]


def resolve_deepspeed(
    raw: Mapping[str, object],
    *,
    source: str,
    run: Mapping[str, object],
    run_provenance: Mapping[str, str],
    world_size: int,
    hidden_size: int | None,
) -> DeepSpeedRead:
    """Resolve a DeepSpeed config against the run's values, as transformers' Trainer integration does.

    Args:
        raw: The parsed DeepSpeed JSON.
        source: The file name (or ``"accelerate deepspeed_config"``), for provenance and messages.
        run: Flat run values with canonical TrainingArguments names (``per_device_train_batch_size``,
            ``gradient_accumulation_steps``, ``bf16``, ``fp16``) that were explicitly given somewhere.
        run_provenance: Where each run value was read.
        world_size: Data-parallel world size (total processes over all machines).
        hidden_size: The model's hidden size (for hidden-size based ``"auto"`` keys), if known.

    Returns:
        The resolved settings.

    Raises:
        ConfigError: Bad types or ranges, an ``"auto"`` that cannot be resolved, keys DeepSpeed refuses, or a
            batch-size inconsistency (DeepSpeed's own assertion).
    """
    r = _Run(
        micro=_opt_int(run.get("per_device_train_batch_size")),
        gas=_opt_int(run.get("gradient_accumulation_steps")),
        bf16=_opt_bool(run.get("bf16")),
        fp16=_opt_bool(run.get("fp16")),
        world=world_size,
        hidden=hidden_size,
        names=run_provenance,
    )
    if "zero_optimization" not in raw:
        # accelerate DeepSpeedPlugin.__post_init__ (used by the Trainer too) refuses a file without it.
        raise ConfigError(
            f"{source}: Please specify the ZeRO optimization config in the DeepSpeed config (accelerate's "
            'message); add "zero_optimization": {"stage": 0|1|2|3}'
        )
    fill = _Filler(source, r.names)
    findings: list[Finding] = []
    micro, gas, tbs = _batch(raw, r, fill, findings)
    mixed, precision_from_file = _precision(raw, r, fill)
    zero = _section(raw, "zero_optimization", source) or {}
    spec = zero_spec(zero, source=source, hidden=r.hidden, prov=fill.prov, findings=findings)
    findings.extend(not_modelled_findings(raw, source))
    optimizer = read_config_optimizer(
        raw, source, stage=spec.stage, offload_optimizer=spec.offload_optimizer,
        run_optim=str(run["optim"]) if run.get("optim") is not None else None,
        run_optim_where=r.names.get("optim", "the run"),
    )
    if optimizer is not None:
        spec = replace(spec, optimizer_class=optimizer.builds)
        fill.prov["optimizer_class"] = where(source, "optimizer.type")
        findings.extend(optimizer.findings)
    if fill.mismatches:
        findings.append(
            Finding(
                "deepspeed-trainer-mismatch",
                Severity.ERROR,
                f"{source}: DeepSpeed config values mismatch TrainingArguments values (transformers raises "
                "this at Trainer start):\n" + "\n".join(fill.mismatches),
                _EASIEST,
            )
        )
    return DeepSpeedRead(spec, micro, gas, tbs, mixed, precision_from_file, fill.prov, tuple(findings), optimizer)


class _Filler:
    """transformers' ``fill_match``: ``"auto"`` takes the run value; a concrete value must equal it."""

    def __init__(self, source: str, names: Mapping[str, str]) -> None:
        self.source = source
        self.names = names
        self.prov: dict[str, str] = {}
        self.mismatches: list[str] = []

    def __call__(self, key: str, value: object, hf_key: str, hf_val: object, default: object) -> object:
        source = self.source
        if value is None:
            return None
        if is_auto(value):
            self.prov[key] = (
                f"{source}:{key}=auto <- {self.names.get(hf_key, hf_key)}"
                if hf_val is not None
                else f"{source}:{key}=auto <- TrainingArguments default {hf_key}={default}"
            )
            return hf_val if hf_val is not None else default
        self.prov[key] = where(source, key)
        if hf_val is not None and value != hf_val:
            self.mismatches.append(
                f"- ds {key}={value} vs hf {hf_key}={hf_val} (from {self.names.get(hf_key, hf_key)})"
            )
        return value


def _batch(raw: Mapping[str, object], r: _Run, fill: _Filler, findings: list[Finding]) -> tuple[int, int, int]:
    """Micro-batch, accumulation and train batch size after "auto" and DeepSpeed's own derivation."""
    source = fill.source
    problems: list[str] = []
    gas_raw = raw.get("gradient_accumulation_steps")
    gas_missing = gas_raw is None
    if gas_missing:
        gas_raw = 1  # accelerate DeepSpeedPlugin: "if 'gradient_accumulation_steps' not in config: ... = 1"
        if r.gas is not None and r.gas != 1:
            findings.append(
                Finding(
                    "deepspeed-gas-missing",
                    Severity.WARNING,
                    f"{source} has no gradient_accumulation_steps, so accelerate sets it to 1 while "
                    f"{r.names.get('gradient_accumulation_steps', 'the run')} says {r.gas}",
                    f'add "gradient_accumulation_steps": "auto" to {source}',
                )
            )
    micro_key, gas_key, tbs_key = "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"
    micro_filled = fill(micro_key, raw.get(micro_key), "per_device_train_batch_size", r.micro, _TA_DEFAULT_MICRO)
    micro = batch_int(micro_filled, source, micro_key, problems)
    gas_filled = fill(gas_key, gas_raw, gas_key, None if gas_missing else r.gas, _TA_DEFAULT_GAS)
    gas = batch_int(gas_filled, source, gas_key, problems)
    run_micro = micro if micro is not None else r.micro if r.micro is not None else _TA_DEFAULT_MICRO
    run_gas = gas if gas is not None else r.gas if r.gas is not None else _TA_DEFAULT_GAS
    # transformers fills world x TrainingArguments micro x GAS; after a recorded mismatch transformers stops on
    # that mismatch first, so the DeepSpeed-side product keeps the assertion quiet here.
    tbs_run = (
        r.world * run_micro * run_gas
        if fill.mismatches
        else r.world * (r.micro or run_micro) * (r.gas or run_gas)
    )
    tbs = batch_int(fill(tbs_key, raw.get(tbs_key), "train_batch_size (calculated)", tbs_run, None), source,
                    tbs_key, problems)
    if problems:
        raise ConfigError.collect(problems)
    return set_batch_related(micro, gas, tbs, r.world, source)


def _precision(raw: Mapping[str, object], r: _Run, fill: _Filler) -> tuple[MixedPrecision, bool]:
    """What ``bf16.enabled``/``fp16.enabled`` imply, and whether the file sets them to concrete values."""
    source = fill.source
    bf16_sec = _section(raw, "bf16", source) or _section(raw, "bfloat16", source)
    fp16_sec = _section(raw, "fp16", source)
    precision_from_file = False
    enabled: dict[str, bool] = {}
    for name, sec, hf in (("bf16", bf16_sec, r.bf16), ("fp16", fp16_sec, r.fp16)):
        if sec is None or "enabled" not in sec:
            continue
        value = fill(f"{name}.enabled", sec["enabled"], name, hf, False)
        enabled[name] = as_bool(value, at=where(source, f"{name}.enabled"))
        precision_from_file = precision_from_file or not is_auto(sec["enabled"])
    if enabled.get("bf16") and enabled.get("fp16"):
        raise ConfigError(f"{source}: bf16.enabled and fp16.enabled are both true; enable only one")
    return MixedPrecision.from_flags(enabled.get("bf16"), enabled.get("fp16")), precision_from_file


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None




def deepspeed_precision_conflict(
    ds: DeepSpeedRead, run_mixed: MixedPrecision | None, run_where: str, source: str
) -> Finding | None:
    """A finding when the DeepSpeed file's precision disagrees with the run's (accelerate's check).

    accelerate ``DeepSpeedPlugin.set_mixed_precision``: "`--mixed_precision` arg cannot be set to `bf16` when
    `fp16` is set in the DeepSpeed config file."

    Args:
        ds: The resolved DeepSpeed config.
        run_mixed: The run's mixed precision (TrainingArguments bf16/fp16 or accelerate mixed_precision).
        run_where: Where the run's precision was read.
        source: The DeepSpeed file.

    Returns:
        An error finding naming both places, or None.
    """
    if run_mixed is None or run_mixed is MixedPrecision.NO or not ds.precision_from_file:
        return None
    if ds.mixed_precision is MixedPrecision.NO or ds.mixed_precision is run_mixed:
        return None
    return Finding(
        "precision-conflict",
        Severity.ERROR,
        f"{run_where} asks for {run_mixed.value} but {source} enables {ds.mixed_precision.value}; "
        "accelerate refuses to start with both",
        f'set {ds.mixed_precision.value}.enabled to "auto" in {source}, or use the same precision in both',
    )
