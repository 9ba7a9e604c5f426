"""Read a DeepSpeed JSON config and resolve its ``"auto"`` values the way transformers does.

Resolution follows transformers 5.23 ``transformers/integrations/deepspeed.py``:

* ``HfTrainerDeepSpeedConfig.trainer_config_process`` (run when TrainingArguments is built):
  ``train_micro_batch_size_per_gpu`` <- ``per_device_train_batch_size``, ``gradient_accumulation_steps`` <-
  ``gradient_accumulation_steps``, ``train_batch_size`` <- world x micro x GAS, ``fp16.enabled`` <- ``fp16``,
  ``bf16.enabled`` <- ``bf16``. ``fill_match`` fills only keys that are present and ``"auto"``; a concrete
  value
  that differs from TrainingArguments is a mismatch ("- ds {key}={ds} vs hf {hf_key}={hf}"), raised at
  ``trainer_config_finalize`` with "The easiest method is to set these DeepSpeed config values to 'auto'".
* ``trainer_config_finalize``: ``zero_optimization.reduce_bucket_size`` = hidden²; for ZeRO-3
  ``stage3_prefetch_bucket_size`` = int(0.9·hidden²) and ``stage3_param_persistence_threshold`` = 10·hidden.
* DeepSpeed itself (``deepspeed/runtime/config.py`` ``_set_batch_related_parameters`` / ``_batch_assertion``)
  derives a missing batch key from the other two and asserts
  ``train_batch_size == micro_batch * grad_acc * world_size`` with the message reproduced here.

Defaults are DeepSpeed 0.19's (``deepspeed/runtime/zero/config.py``, ``offload_config.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import AUTO, as_bool, as_int, as_str, load_mapping_file, where
from fitcheck.spec import DeepSpeedSpec, MixedPrecision, OffloadDevice

# deepspeed/runtime/zero/config.py DeepSpeedZeroConfig fields and aliases
# (deepspeed 0.19.8; pinned by a test).
ZERO_KEYS = frozenset(
    [
        "allgather_bucket_size",
        "allgather_partitions",
        "allgather_sequential",
        "compute_grad_norm",
        "contiguous_gradients",
        "cpu_offload",
        "cpu_offload_param",
        "cpu_offload_use_pin_memory",
        "elastic_checkpoint",
        "enable_sanity_checks",
        "gather_16bit_weights_on_model_save",
        "ignore_unused_parameters",
        "leaf_module",
        "legacy_stage1",
        "load_from_fp32_weights",
        "log_trace_cache_warnings",
        "max_live_parameters",
        "max_reuse_distance",
        "memory_efficient_linear",
        "model_persistence_threshold",
        "module_granularity_threshold",
        "offload_optimizer",
        "offload_param",
        "overlap_comm",
        "override_module_apply",
        "param_persistence_threshold",
        "parameter_alignment",
        "pipeline_loading_checkpoint",
        "prefetch_bucket_size",
        "reduce_bucket_size",
        "reduce_scatter",
        "round_robin_gradients",
        "save_muon_momentum_buffer_in_memory",
        "stage",
        "stage3_allgather_sequential",
        "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "stage3_model_persistence_threshold",
        "stage3_module_granularity_threshold",
        "stage3_param_persistence_threshold",
        "stage3_prefetch_bucket_size",
        "stage3_use_all_reduce_for_fetch_params",
        "sub_group_size",
        "use_all_reduce_for_fetch_params",
        "use_multi_rank_bucket_allreduce",
        "zenflow",
        "zero_hpz_partition_size",
        "zero_quantized_gradients",
        "zero_quantized_nontrainable_weights",
        "zero_quantized_weights",
    ]
)
OFFLOAD_PARAM_KEYS = frozenset(
    ["buffer_count", "buffer_size", "device", "max_in_cpu", "nvme_path", "pin_memory"]
)
OFFLOAD_OPTIMIZER_KEYS = frozenset(
    [
        "buffer_count",
        "cpuadam_cores_perc",
        "device",
        "fast_init",
        "nvme_path",
        "pin_memory",
        "pipeline_read",
        "pipeline_write",
        "ratio",
        "super_offload",
    ]
)
# deepspeed/runtime/config.py _REMOVED_ZERO_CONFIG_KEYS: DeepSpeed 0.19 refuses to start with these.
REMOVED_ZERO_KEYS = frozenset({"mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"})

_TA_DEFAULT_MICRO = 8  # transformers training_args.py per_device_train_batch_size default
_TA_DEFAULT_GAS = 1  # transformers training_args.py gradient_accumulation_steps default
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
    """

    spec: DeepSpeedSpec
    micro_batch: int
    grad_accum: int
    train_batch_size: int
    mixed_precision: MixedPrecision
    precision_from_file: bool
    provenance: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


def load_deepspeed_file(path: str) -> dict[str, object]:
    """Load a DeepSpeed JSON config (DeepSpeed reads it with ``json.load``).

    Raises:
        ConfigError: Missing file, malformed JSON, or not a mapping.
    """
    return load_mapping_file(path, what="DeepSpeed config (--deepspeed)")


def _is_auto(value: object) -> bool:
    return value is AUTO or (isinstance(value, str) and value.strip().lower() == "auto")


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
    findings: list[Finding] = []
    prov: dict[str, str] = {}
    problems: list[str] = []
    mismatches: list[str] = []

    def fill_match(key: str, value: object, hf_key: str, hf_val: object, default: object) -> object:
        """transformers' fill_match: "auto" takes the run value; a concrete value must equal it."""
        if value is None:
            return None
        if _is_auto(value):
            chosen = hf_val if hf_val is not None else default
            prov[key] = (
                f"{source}:{key}=auto <- {r.names.get(hf_key, hf_key)}"
                if hf_val is not None
                else f"{source}:{key}=auto <- TrainingArguments default {hf_key}={default}"
            )
            return chosen
        prov[key] = where(source, key)
        if hf_val is not None and value != hf_val:
            mismatches.append(
                f"- ds {key}={value} vs hf {hf_key}={hf_val} (from {r.names.get(hf_key, hf_key)})"
            )
        return value

    if "zero_optimization" not in raw:
        # accelerate DeepSpeedPlugin.__post_init__ (used by the Trainer too) refuses a file without it.
        raise ConfigError(
            f"{source}: Please specify the ZeRO optimization config in the DeepSpeed config (accelerate's "
            'message); add "zero_optimization": {"stage": 0|1|2|3}'
        )
    # --- batch -------------------------------------------------------------------------------------------
    micro_raw = raw.get("train_micro_batch_size_per_gpu")
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
    tbs_raw = raw.get("train_batch_size")
    micro = _batch_int(
        fill_match(
            "train_micro_batch_size_per_gpu",
            micro_raw,
            "per_device_train_batch_size",
            r.micro,
            _TA_DEFAULT_MICRO,
        ),
        source,
        "train_micro_batch_size_per_gpu",
        problems,
    )
    gas = _batch_int(
        fill_match(
            "gradient_accumulation_steps",
            gas_raw,
            "gradient_accumulation_steps",
            None if gas_missing else r.gas,
            _TA_DEFAULT_GAS,
        ),
        source,
        "gradient_accumulation_steps",
        problems,
    )
    run_micro = micro if micro is not None else r.micro if r.micro is not None else _TA_DEFAULT_MICRO
    run_gas = gas if gas is not None else r.gas if r.gas is not None else _TA_DEFAULT_GAS
    tbs = _batch_int(
        fill_match(
            "train_batch_size",
            tbs_raw,
            "train_batch_size (calculated)",
            # transformers fills world x TrainingArguments micro x GAS; after a recorded mismatch transformers
            # stops on that mismatch first, so the DeepSpeed-side product keeps the assertion quiet here.
            r.world * run_micro * run_gas
            if mismatches
            else r.world * (r.micro or run_micro) * (r.gas or run_gas),
            None,
        ),
        source,
        "train_batch_size",
        problems,
    )
    if problems:
        raise ConfigError.collect(problems)
    micro, gas, tbs = _set_batch_related(micro, gas, tbs, r.world, source)

    # --- precision ---------------------------------------------------------------------------------------
    bf16_sec = _section(raw, "bf16", source) or _section(raw, "bfloat16", source)
    fp16_sec = _section(raw, "fp16", source)
    precision_from_file = False
    enabled: dict[str, bool] = {}
    for name, sec, hf in (("bf16", bf16_sec, r.bf16), ("fp16", fp16_sec, r.fp16)):
        if sec is None or "enabled" not in sec:
            continue
        value = fill_match(f"{name}.enabled", sec["enabled"], name, hf, False)
        enabled[name] = as_bool(value, at=where(source, f"{name}.enabled"))
        precision_from_file = precision_from_file or not _is_auto(sec["enabled"])
    if enabled.get("bf16") and enabled.get("fp16"):
        raise ConfigError(f"{source}: bf16.enabled and fp16.enabled are both true; enable only one")
    mixed = (
        MixedPrecision.BF16
        if enabled.get("bf16")
        else MixedPrecision.FP16
        if enabled.get("fp16")
        else MixedPrecision.NO
    )

    spec = _zero_spec(raw, source, r, prov, findings)
    findings.extend(_not_modelled(raw, source))
    if mismatches:
        findings.append(
            Finding(
                "deepspeed-trainer-mismatch",
                Severity.ERROR,
                f"{source}: DeepSpeed config values mismatch TrainingArguments values (transformers raises "
                "this at Trainer start):\n" + "\n".join(mismatches),
                _EASIEST,
            )
        )
    return DeepSpeedRead(spec, micro, gas, tbs, mixed, precision_from_file, prov, tuple(findings))


def _opt_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _batch_int(value: object, source: str, key: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    try:
        # DeepSpeed _batch_assertion: each "has to be greater than 0"
        return as_int(value, at=where(source, key), minimum=1)
    except ConfigError as exc:
        problems.append(exc.problems[0] + '; set a positive integer or "auto"')
        return None


def _set_batch_related(
    micro: int | None, gas: int | None, tbs: int | None, world: int, source: str
) -> tuple[int, int, int]:
    """deepspeed/runtime/config.py ``_set_batch_related_parameters`` + ``_batch_assertion``."""
    if micro is not None and gas is not None and tbs is not None:
        m, g, t = micro, gas, tbs
    elif tbs is not None and micro is not None:
        m, g, t = micro, tbs // micro // world, tbs
    elif tbs is not None and gas is not None:
        m, g, t = tbs // world // gas, gas, tbs
    elif micro is not None and gas is not None:
        m, g, t = micro, gas, micro * gas * world
    elif tbs is not None:
        m, g, t = tbs // world, 1, tbs
    elif micro is not None:
        m, g, t = micro, 1, micro * world
    else:
        raise ConfigError(
            f"{source}: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided "
            '(DeepSpeed\'s message); set train_micro_batch_size_per_gpu to "auto"'
        )
    micro, gas, tbs = m, g, t
    if micro <= 0 or gas <= 0:
        raise ConfigError(
            f"{source}: train_batch_size {tbs} is smaller than world_size {world} x the other batch keys, "
            f'so DeepSpeed derives a zero batch; set train_batch_size to "auto"'
        )
    if tbs != micro * gas * world:
        raise ConfigError(
            f"{source}: Check batch related parameters. train_batch_size is not equal to "
            f"micro_batch_per_gpu * gradient_acc_step * world_size {tbs} != {micro} * {gas} * {world} "
            '(DeepSpeed\'s assertion); set train_batch_size to "auto" or make it equal that product'
        )
    return micro, gas, tbs


def _zero_spec(
    raw: Mapping[str, object], source: str, r: _Run, prov: dict[str, str], findings: list[Finding]
) -> DeepSpeedSpec:
    zero = _section(raw, "zero_optimization", source) or {}
    sec = "zero_optimization"
    removed = sorted(REMOVED_ZERO_KEYS & zero.keys())
    if removed:
        raise ConfigError(
            f"{source}: {sec}.{removed[0]} was removed from DeepSpeed (0.19 "
            "refuses to start with it); delete it"
        )
    unknown = sorted(set(zero) - ZERO_KEYS)
    if unknown:
        findings.append(
            Finding(
                "deepspeed-unknown-key",
                Severity.WARNING,
                f"{source}: unknown key(s) in {sec}: {', '.join(unknown)} (DeepSpeed 0.19's config model "
                "forbids extra keys and will refuse them)",
                "check the spelling against the DeepSpeed ZeRO config docs",
            )
        )

    def get(*names: str) -> tuple[str, object] | None:
        for name in names:
            if name in zero and zero[name] is not None:
                return name, zero[name]
        return None

    stage_item = get("stage")
    stage = 0
    if stage_item is not None:
        if _is_auto(stage_item[1]):
            raise ConfigError(f'{where(source, sec + ".stage")}: "auto" is not resolvable; set 0, 1, 2 or 3')
        stage = as_int(stage_item[1], at=where(source, sec + ".stage"))
        if stage not in (0, 1, 2, 3):
            raise ConfigError(f"{where(source, sec + '.stage')}: must be 0, 1, 2 or 3, got {stage}")
        prov["stage"] = where(source, sec + ".stage")

    def size(
        field_names: tuple[str, ...], default: int, hidden_rule: tuple[str, int] | None, minimum: int
    ) -> int:
        item = get(*field_names)
        if item is None:
            return default
        key = f"{sec}.{item[0]}"
        if _is_auto(item[1]):
            if hidden_rule is None:
                raise ConfigError(f'{where(source, key)}: "auto" is not filled by transformers; set a number')
            if r.hidden is None:
                raise ConfigError(
                    f'{where(source, key)}: "auto" is filled from the model\'s hidden_size '
                    "(transformers trainer_config_finalize), which fitcheck does not know here; "
                    'give the model or replace "auto" with an integer'
                )
            rule, value = hidden_rule
            prov[item[0]] = f"{where(source, key)}=auto <- {rule} (hidden_size {r.hidden})"
            return value
        prov[item[0]] = where(source, key)
        return as_int(item[1], at=where(source, key), minimum=minimum)

    h = r.hidden or 0
    # DeepSpeedZeroConfig: reduce_bucket_size gt=0, others ge=0 (deepspeed/runtime/zero/config.py).
    reduce_bucket = size(("reduce_bucket_size",), 500_000_000, ("hidden_size²", h * h), 1)
    allgather_bucket = size(("allgather_bucket_size",), 500_000_000, None, 0)
    z3_rule = (
        stage == 3
    )  # transformers fills the stage-3 keys only for ZeRO-3; DeepSpeed ignores them below 3
    prefetch = size(
        ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
        50_000_000,
        ("0.9·hidden_size²", int(0.9 * h * h)) if z3_rule else ("unused below ZeRO-3", 0),
        0,
    )
    persistence = size(
        ("stage3_param_persistence_threshold", "param_persistence_threshold"),
        100_000,
        ("10·hidden_size", 10 * h) if z3_rule else ("unused below ZeRO-3", 0),
        0,
    )
    max_live = size(("stage3_max_live_parameters", "max_live_parameters"), 1_000_000_000, None, 0)
    sub_group = size(("sub_group_size",), 1_000_000_000, None, 0)

    def flag(name: str, default: bool | None) -> bool | None:
        item = get(name)
        if item is None:
            return default
        if _is_auto(item[1]):
            raise ConfigError(
                f'{where(source, sec + "." + name)}: "auto" is not resolvable; set true or false'
            )
        prov[name] = where(source, f"{sec}.{name}")
        return as_bool(item[1], at=where(source, f"{sec}.{name}"))

    overlap = flag("overlap_comm", None)
    contiguous = flag("contiguous_gradients", True)

    off_opt, pin_opt = _offload(zero, "offload_optimizer", OFFLOAD_OPTIMIZER_KEYS, source, prov, findings)
    off_par, pin_par = _offload(zero, "offload_param", OFFLOAD_PARAM_KEYS, source, prov, findings)
    # Deprecated booleans (DeepSpeedZeroConfig cpu_offload / cpu_offload_param, "new_param" offload_*).
    legacy = [("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")]
    for old, new in legacy:
        item = get(old)
        if item is not None and as_bool(item[1], at=where(source, f"{sec}.{old}")):
            findings.append(
                Finding(
                    "deprecated-key",
                    Severity.INFO,
                    f"{source}: {sec}.{old} is deprecated; read as {new}.device=cpu",
                    f'write "{new}": {{"device": "cpu"}}',
                )
            )
            if new == "offload_optimizer" and off_opt is OffloadDevice.NONE:
                off_opt = OffloadDevice.CPU
            if new == "offload_param" and off_par is OffloadDevice.NONE:
                off_par = OffloadDevice.CPU
    if off_par is not OffloadDevice.NONE and stage != 3:
        findings.append(
            Finding(
                "offload-param-ignored",
                Severity.WARNING,
                f"{source}: {sec}.offload_param is only used by ZeRO-3 (stage3.py); stage {stage} ignores it",
                "use stage 3 to offload parameters, or remove offload_param",
            )
        )
        off_par = OffloadDevice.NONE
    if off_opt is not OffloadDevice.NONE and stage == 0:
        findings.append(
            Finding(
                "offload-optimizer-ignored",
                Severity.WARNING,
                f"{source}: {sec}.offload_optimizer is done by the ZeRO optimizer "
                "(stage >= 1); stage 0 ignores it",
                "use stage 1, 2 or 3 to offload the optimizer",
            )
        )
        off_opt = OffloadDevice.NONE
    zero3_init = True
    return DeepSpeedSpec(
        stage=stage,
        offload_optimizer=off_opt,
        offload_param=off_par,
        reduce_bucket_size=reduce_bucket,
        allgather_bucket_size=allgather_bucket,
        overlap_comm=overlap,
        contiguous_gradients=bool(contiguous),
        prefetch_bucket_size=prefetch,
        max_live_parameters=max_live,
        param_persistence_threshold=persistence,
        sub_group_size=sub_group,
        zero3_init=zero3_init,
        pin_memory=pin_opt or pin_par,
    )


def _offload(
    zero: Mapping[str, object],
    name: str,
    known: frozenset[str],
    source: str,
    prov: dict[str, str],
    findings: list[Finding],
) -> tuple[OffloadDevice, bool]:
    key = f"zero_optimization.{name}"
    sec = zero.get(name)
    if sec is None:
        return OffloadDevice.NONE, False
    if not isinstance(sec, Mapping):
        raise ConfigError(f'{where(source, key)}: expected a mapping like {{"device": "cpu"}}, got {sec!r}')
    unknown = sorted(str(k) for k in sec if k not in known)
    if unknown:
        findings.append(
            Finding(
                "deepspeed-unknown-key",
                Severity.WARNING,
                f"{source}: unknown key(s) in {key}: {', '.join(unknown)} (DeepSpeed refuses them)",
                "check the spelling against the DeepSpeed offload docs",
            )
        )
    device_raw = sec.get("device", "none")
    if device_raw is None:
        device_raw = "none"
    if _is_auto(device_raw):
        raise ConfigError(
            f'{where(source, key + ".device")}: "auto" is not resolvable; set none, cpu or nvme'
        )
    device_text = as_str(device_raw, at=where(source, key + ".device")).strip().lower()
    try:
        device = OffloadDevice(device_text)
    except ValueError:
        raise ConfigError(
            f"{where(source, key + '.device')}: must be none, cpu or nvme, got {device_raw!r}"
        ) from None
    if device is OffloadDevice.NVME and not sec.get("nvme_path"):
        raise ConfigError(f"{where(source, key + '.nvme_path')}: device nvme needs an nvme_path; set one")
    ratio = sec.get("ratio")
    if ratio is not None and name == "offload_optimizer":
        try:
            partial = float(str(ratio)) < 1.0
        except ValueError:
            raise ConfigError(f"{where(source, key + '.ratio')}: expected a number in [0, 1]") from None
        if partial:
            findings.append(
                Finding(
                    "not-modelled",
                    Severity.WARNING,
                    f"{source}: {key}.ratio={ratio} (partial optimizer offload) is not modelled; "
                    "the estimate assumes the whole optimizer is offloaded",
                    "",
                )
            )
    prov[name] = where(source, key + ".device")
    pin = as_bool(
        sec.get("pin_memory", True), at=where(source, key + ".pin_memory")
    )  # offload_config.py default
    return device, pin and device is not OffloadDevice.NONE


def _not_modelled(raw: Mapping[str, object], source: str) -> list[Finding]:
    """Tensor/pipeline/sequence parallel and ZeRO++ features that change memory but are not modelled."""
    out: list[Finding] = []

    def note(what: str) -> None:
        out.append(
            Finding(
                "not-modelled",
                Severity.WARNING,
                f"{source}: {what} is not modelled; the estimate treats every process as a "
                "plain data-parallel ZeRO rank",
                "",
            )
        )

    tp = raw.get("tensor_parallel")
    if isinstance(tp, Mapping) and _gt1(tp.get("autotp_size", tp.get("tp_size"))):
        note("tensor_parallel (AutoTP)")
    if _gt1(raw.get("sequence_parallel_size")):
        note("sequence_parallel_size (Ulysses)")
    if "pipeline" in raw:
        note("pipeline parallelism (the pipeline section)")
    zero = raw.get("zero_optimization")
    if isinstance(zero, Mapping):
        if _gt1(zero.get("zero_hpz_partition_size")):
            note("zero_optimization.zero_hpz_partition_size (ZeRO++ hierarchical partitioning)")
        for key in (
            "zero_quantized_weights",
            "zero_quantized_gradients",
            "zero_quantized_nontrainable_weights",
        ):
            if zero.get(key) is True:
                note(f"zero_optimization.{key} (ZeRO++ quantization)")
    return out


def _gt1(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1


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
