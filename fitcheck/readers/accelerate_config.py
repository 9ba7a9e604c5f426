"""Read an accelerate config YAML (and FSDP settings from it or from TrainingArguments) as accelerate does.

Sources: accelerate 1.15 ``commands/config/config_args.py`` (default location, ``process_config``, unknown
keys are an error), ``commands/launch.py`` ``_validate_launch_command`` (explicit flags win over the file;
``num_processes: -1`` needs ``--num_processes``), ``utils/launch.py`` (``nproc_per_node = num_processes //
num_machines``: ``num_processes`` is the TOTAL over machines), ``utils/dataclasses.py`` ``DeepSpeedPlugin``
(inline keys -> a DeepSpeed dict; inline keys together with ``deepspeed_config_file`` are an error) and
``FullyShardedDataParallelPlugin`` (FSDP1/FSDP2 keys). FSDP via TrainingArguments follows transformers 5.23
``training_args.py`` (``fsdp_config`` keys with or without the ``fsdp_`` prefix, FSDP2 by default, legacy
``fsdp="full_shard auto_wrap offload"`` strings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import as_bool, as_int, as_str, as_str_list, load_mapping_file, where
from fitcheck.spec import FsdpSpec, MixedPrecision

# accelerate ClusterConfig + BaseConfig fields (accelerate 1.15), plus keys process_config converts.
CLUSTER_KEYS = frozenset(
    [
        "command_file",
        "commands",
        "compute_environment",
        "debug",
        "deepspeed_config",
        "distributed_type",
        "downcast_bf16",
        "dynamo_config",
        "enable_cpu_affinity",
        "fp8_config",
        "fsdp_config",
        "gpu_ids",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "main_training_function",
        "megatron_lm_config",
        "mixed_precision",
        "mpirun_config",
        "num_machines",
        "num_processes",
        "parallelism_config",
        "rdzv_backend",
        "same_network",
        "tpu_env",
        "tpu_name",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "tpu_vm",
        "tpu_zone",
        "use_cpu",
        "fp16",
        "dynamo_backend",
    ]
)
DISTRIBUTED_TYPES = (
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_XPU",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
    "MULTI_HPU",
    "MULTI_NEURON",
)
# accelerate DeepSpeedPlugin._deepspeed_config_checks: these inline keys may not accompany a config file.
DS_KEYS_CONFLICTING_WITH_FILE = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
)
DS_INLINE_KEYS = frozenset(
    (
        *DS_KEYS_CONFLICTING_WITH_FILE,
        "deepspeed_config_file",
        "zero3_init_flag",
        "deepspeed_multinode_launcher",
        "deepspeed_hostfile",
        "deepspeed_exclusion_filter",
        "deepspeed_inclusion_filter",
        "deepspeed_moe_layer_cls_names",
    )
)
FSDP_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
    "NO_SHARD",
    "HYBRID_SHARD",
    "HYBRID_SHARD_ZERO2",
)  # constants.py
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
# fsdp_config keys (without the fsdp_ prefix) read by accelerate's FSDP plugin and transformers.
FSDP_KEYS = frozenset(
    [
        "version",
        "sharding_strategy",
        "reshard_after_forward",
        "offload_params",
        "cpu_offload",
        "auto_wrap_policy",
        "transformer_layer_cls_to_wrap",
        "min_num_params",
        "backward_prefetch",
        "forward_prefetch",
        "state_dict_type",
        "use_orig_params",
        "cpu_ram_efficient_loading",
        "sync_module_states",
        "activation_checkpointing",
        "limit_all_gathers",
        "xla",
        "xla_fsdp_v2",
        "xla_fsdp_grad_ckpt",
        "xla_fsdp_settings",
        "ignored_modules",
        "mixed_precision_policy",
        "cpu_offload_pin_memory",
    ]
)


@dataclass(frozen=True)
class FsdpRead:
    """FSDP settings from one source.

    Attributes:
        spec: The memory-relevant settings.
        activation_checkpointing: ``fsdp_activation_checkpointing`` when set.
        provenance: Field -> where it was read.
        findings: Legacy keys read, unknown keys.
    """

    spec: FsdpSpec
    activation_checkpointing: bool | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class AccelerateRead:
    """An accelerate config file, read.

    Attributes:
        source: The file.
        distributed_type: NO, MULTI_GPU, DEEPSPEED, FSDP, ...
        num_processes: Total processes over all machines (None when the file leaves it to the launcher).
        num_machines: Nodes.
        mixed_precision: ``mixed_precision`` (None when absent).
        deepspeed: The DeepSpeed dict accelerate would build from inline keys (None when a file is named or
            DeepSpeed is not used).
        deepspeed_config_file: ``deepspeed_config.deepspeed_config_file``.
        zero3_init: ``zero3_init_flag``.
        fsdp: FSDP settings when ``distributed_type`` is FSDP.
        provenance: Field -> where it was read.
        findings: Not-modelled parallelism, legacy keys.
    """

    source: str
    distributed_type: str
    num_processes: int | None
    num_machines: int
    mixed_precision: MixedPrecision | None
    deepspeed: dict[str, object] | None = None
    deepspeed_config_file: str | None = None
    zero3_init: bool | None = None
    fsdp: FsdpRead | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


def default_config_path(env: Mapping[str, str]) -> str:
    """accelerate's default config file: ``$HF_HOME`` or ``$XDG_CACHE_HOME/huggingface`` (default
    ``~/.cache/huggingface``) + ``/accelerate/default_config.yaml`` (config_args.py).

    Args:
        env: Environment variables (``HF_HOME``, ``XDG_CACHE_HOME``, ``HOME``).

    Returns:
        The path (``~`` expanded with ``HOME`` when given).
    """
    home = env.get("HF_HOME") or f"{env.get('XDG_CACHE_HOME') or '~/.cache'}/huggingface"
    if home.startswith("~") and env.get("HOME"):
        home = env["HOME"] + home[1:]
    return f"{home}/accelerate/default_config.yaml"


def parse_mixed_precision(value: object, *, at: str) -> MixedPrecision:
    """``no``/``fp16``/``bf16`` (``fp8`` trains under bf16 autocast in accelerate; reported as bf16).

    Raises:
        ConfigError: Any other value.
    """
    text = str(value).strip().lower() if value is not None else "no"
    if text == "fp8":
        return MixedPrecision.BF16  # accelerate set_mixed_precision: fp8 "still rel[ies] on bf16 autocast"
    try:
        return MixedPrecision(text)
    except ValueError:
        raise ConfigError(f"{at}: mixed_precision must be no, fp16, bf16 or fp8, got {value!r}") from None


def read_accelerate_config(path: str) -> AccelerateRead:
    """Read an accelerate config YAML/JSON file.

    Args:
        path: The file (``--config_file`` or the default location).

    Returns:
        What the file says about processes, precision, DeepSpeed and FSDP.

    Raises:
        ConfigError: Missing/malformed file, unknown top-level keys (accelerate refuses them), bad values,
            a DeepSpeed config file together with inline DeepSpeed keys.
    """
    raw = load_mapping_file(path, what="accelerate config (--config_file)")
    prov: dict[str, str] = {}
    findings: list[Finding] = []
    unknown = sorted(set(raw) - CLUSTER_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown keys {unknown} (accelerate refuses them: 'The config "
            "file ... had unknown keys'); "
            "remove them or upgrade accelerate"
        )
    if "distributed_type" not in raw:
        raise ConfigError(f"{path}: A `distributed_type` must be specified in the config file (accelerate)")
    dist = as_str(raw["distributed_type"], at=where(path, "distributed_type")).strip().upper()
    if dist not in DISTRIBUTED_TYPES:
        raise ConfigError(
            f"{where(path, 'distributed_type')}: {dist!r} is not one of {', '.join(DISTRIBUTED_TYPES)}"
        )
    prov["distributed_type"] = where(path, "distributed_type")
    if dist in ("MEGATRON_LM", "XLA"):
        findings.append(
            Finding(
                "not-modelled",
                Severity.WARNING,
                f"{path}: distributed_type {dist} (tensor/pipeline parallel or TPU) is not modelled",
                "fitcheck models DDP, DeepSpeed ZeRO and FSDP data parallelism",
            )
        )
    num_machines = as_int(raw.get("num_machines", 1), at=where(path, "num_machines"), minimum=1)
    num_processes: int | None = None
    if raw.get("num_processes") is not None:
        num_processes = as_int(raw["num_processes"], at=where(path, "num_processes"), minimum=-1)
        if num_processes == 0:
            raise ConfigError(
                f"{where(path, 'num_processes')}: must be positive; set the total number of GPUs"
            )
        if num_processes == -1:
            num_processes = (
                None  # launch.py: "You need to manually pass in `--num_processes` using this config"
            )
        else:
            prov["num_processes"] = where(path, "num_processes")
    elif dist == "NO":
        num_processes = 1  # config_args.process_config: distributed_type NO without num_processes -> 1
        prov["num_processes"] = where(path, "distributed_type") + "=NO (accelerate sets num_processes 1)"
    prov["num_machines"] = where(path, "num_machines")
    mixed: MixedPrecision | None = None
    if raw.get("mixed_precision") is not None:
        mixed = parse_mixed_precision(raw["mixed_precision"], at=where(path, "mixed_precision"))
        prov["mixed_precision"] = where(path, "mixed_precision")
    elif raw.get("fp16") is not None and as_bool(raw["fp16"], at=where(path, "fp16")):
        mixed = MixedPrecision.FP16  # process_config converts the legacy fp16 key
        prov["mixed_precision"] = where(path, "fp16")
    findings.extend(_parallelism(raw.get("parallelism_config"), path))
    read = AccelerateRead(path, dist, num_processes, num_machines, mixed, provenance=prov)
    if dist == "DEEPSPEED":
        read = _with_deepspeed(read, raw, path)
    if dist == "FSDP":
        cfg = raw.get("fsdp_config") or {}
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"{where(path, 'fsdp_config')}: expected a mapping, got {cfg!r}")
        fs = fsdp_from_config(
            {str(k): v for k, v in cfg.items()}, source=f"{path}:fsdp_config", flavour="accelerate"
        )
        read = replace(read, fsdp=fs)
    return replace(read, findings=(*findings, *read.findings))


def _parallelism(cfg: object, path: str) -> list[Finding]:
    if not isinstance(cfg, Mapping):
        return []
    out = []
    for key in ("parallelism_config_tp_size", "parallelism_config_cp_size", "tp_size", "cp_size"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            out.append(
                Finding(
                    "not-modelled",
                    Severity.WARNING,
                    f"{path}: parallelism_config {key}={value} (tensor/context parallel) is not modelled",
                    "the estimate treats every process as a data-parallel rank",
                )
            )
    return out


def _with_deepspeed(read: AccelerateRead, raw: Mapping[str, object], path: str) -> AccelerateRead:
    cfg = raw.get("deepspeed_config") or {}
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{where(path, 'deepspeed_config')}: expected a mapping, got {cfg!r}")
    src = f"{path}:deepspeed_config"
    unknown = sorted(str(k) for k in cfg if k not in DS_INLINE_KEYS)
    findings = list(read.findings)
    if unknown:
        findings.append(
            Finding(
                "accelerate-unknown-key",
                Severity.WARNING,
                f"{src}: unknown key(s) {', '.join(unknown)} are not read by accelerate's DeepSpeed plugin",
                "check the spelling",
            )
        )
    zero3_init = None
    if cfg.get("zero3_init_flag") is not None:
        zero3_init = as_bool(cfg["zero3_init_flag"], at=where(src, "zero3_init_flag"))
    ds_file = cfg.get("deepspeed_config_file")
    if ds_file is not None:
        file_text = as_str(ds_file, at=where(src, "deepspeed_config_file"))
        inline = [k for k in DS_KEYS_CONFLICTING_WITH_FILE if cfg.get(k) is not None]
        if read.mixed_precision is not None:
            inline.append("mixed_precision")
        if inline:
            # accelerate DeepSpeedPlugin._deepspeed_config_checks raises for exactly this.
            raise ConfigError(
                f"{src}: When using `deepspeed_config_file`, the following "
                "accelerate config variables will be "
                f"ignored: {inline} (accelerate refuses to start); set them in "
                f"{file_text} and remove them from "
                f"{path}"
            )
        return replace(read, deepspeed_config_file=file_text, zero3_init=zero3_init, findings=tuple(findings))
    # DeepSpeedPlugin.__post_init__ without a file: zero_stage default 2, offload "none", GAS "auto",
    # micro/train batch "auto"; set_mixed_precision adds bf16/fp16 sections.
    stage = as_int(cfg.get("zero_stage", 2), at=where(src, "zero_stage"))
    gas: object = cfg.get("gradient_accumulation_steps", "auto")
    if gas != "auto":
        gas = as_int(gas, at=where(src, "gradient_accumulation_steps"), minimum=1)
    ds: dict[str, object] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": gas,
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": {
                "device": cfg.get("offload_optimizer_device") or "none",
                "nvme_path": cfg.get("offload_optimizer_nvme_path"),
            },
            "offload_param": {
                "device": cfg.get("offload_param_device") or "none",
                "nvme_path": cfg.get("offload_param_nvme_path"),
            },
        },
    }
    if read.mixed_precision in (MixedPrecision.BF16, MixedPrecision.FP16):
        ds[read.mixed_precision.value] = {"enabled": True}
    return replace(read, deepspeed=ds, zero3_init=zero3_init, findings=tuple(findings))


def fsdp_from_config(cfg: Mapping[str, object], *, source: str, flavour: str) -> FsdpRead:
    """Turn an ``fsdp_config`` mapping into an :class:`FsdpSpec`.

    Args:
        cfg: The mapping; keys with or without the ``fsdp_`` prefix.
        source: Where it came from.
        flavour: ``"accelerate"`` (accelerate config: FSDP1 unless ``fsdp_version: 2``, offload key
            ``offload_params``) or ``"trainer"`` (TrainingArguments: FSDP2 unless ``version: 1``, offload key
            ``cpu_offload``).

    Returns:
        The FSDP settings.

    Raises:
        ConfigError: Bad values, or a setting that version does not accept (as accelerate's plugin refuses).
    """
    c: dict[str, object] = {}
    spelled: dict[str, str] = {}
    for key, value in cfg.items():
        short = key[5:] if key.startswith("fsdp_") else key
        c[short] = value
        spelled[short] = key
    prov: dict[str, str] = {}
    findings: list[Finding] = []
    unknown = sorted(spelled[k] for k in c if k not in FSDP_KEYS)
    if unknown:
        findings.append(
            Finding(
                "fsdp-unknown-key",
                Severity.WARNING,
                f"{source}: unknown FSDP key(s) {', '.join(unknown)} were passed over",
                "check the spelling against accelerate's FullyShardedDataParallelPlugin",
            )
        )

    def at(short: str) -> str:
        return where(source, spelled.get(short, short))

    default_version = (
        2 if flavour == "trainer" else 1
    )  # training_args.py default 2; accelerate FSDP_VERSION "1"
    version = as_int(c.get("version", default_version), at=at("version"))
    if version not in (1, 2):
        raise ConfigError(f"{at('version')}: must be 1 or 2, got {version}")
    prov["version"] = at("version") if "version" in c else f"{flavour} default fsdp_version {default_version}"
    if version == 1:
        findings.append(
            Finding(
                "spelling-read",
                Severity.INFO,
                f"{source}: FSDP1 settings read (sharding_strategy / reshard_after_forward as a "
                "strategy name)",
                "",
            )
        )
    strategy, reshard = _strategy(c, version, at, prov, findings)
    offload_key = next((k for k in ("offload_params", "cpu_offload") if c.get(k) is not None), None)
    offload = as_bool(c[offload_key], at=at(offload_key)) if offload_key else False
    if offload_key:
        prov["offload_params"] = at(offload_key)
    policy = str(c.get("auto_wrap_policy") or "TRANSFORMER_BASED_WRAP").strip().upper()
    if policy not in WRAP_POLICIES:
        raise ConfigError(
            f"{at('auto_wrap_policy')}: must be one of {', '.join(WRAP_POLICIES)}, got {policy!r}"
        )
    min_params = 0
    if policy == "SIZE_BASED_WRAP":
        min_params = as_int(
            c.get("min_num_params", 100_000_000), at=at("min_num_params"), minimum=1
        )  # launch.py
    if c.get("transformer_layer_cls_to_wrap") is not None:
        as_str_list(c["transformer_layer_cls_to_wrap"], at=at("transformer_layer_cls_to_wrap"))
    use_orig = as_bool(c.get("use_orig_params", True), at=at("use_orig_params"))
    ac = (
        as_bool(c["activation_checkpointing"], at=at("activation_checkpointing"))
        if c.get("activation_checkpointing") is not None
        else None
    )
    try:
        spec = FsdpSpec(
            version=version,
            sharding_strategy=strategy,
            reshard_after_forward=reshard,
            offload_params=offload,
            use_orig_params=use_orig,
            auto_wrap_policy=policy,
            min_num_params=min_params,
        )
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return FsdpRead(spec, ac, prov, tuple(findings))


def _strategy(
    c: Mapping[str, object],
    version: int,
    at: Callable[[str], str],
    prov: dict[str, str],
    findings: list[Finding],
) -> tuple[str, bool]:
    raw_strategy = c.get("sharding_strategy")
    raw_reshard = c.get("reshard_after_forward")
    if version == 1:
        # Plugin: sharding_strategy wins (legacy, int 1-5 or a name); else reshard_after_forward as a name.
        chosen, key = (
            (raw_strategy, "sharding_strategy")
            if raw_strategy is not None
            else (raw_reshard, "reshard_after_forward")
        )
        if chosen is None:
            return "FULL_SHARD", True
        if isinstance(chosen, bool):
            raise ConfigError(
                f"{at(key)}: reshard_after_forward set to {chosen}. This is not supported with "
                "FSDP1, please set to a `str` (accelerate); use FULL_SHARD or SHARD_GRAD_OP"
            )
        name = _strategy_name(chosen, at(key))
        prov["sharding_strategy"] = at(key)
        return name, name in ("FULL_SHARD", "HYBRID_SHARD")
    if raw_strategy is not None:
        name = _strategy_name(raw_strategy, at("sharding_strategy"))
        findings.append(
            Finding(
                "deprecated-key",
                Severity.INFO,
                f"{at('sharding_strategy')}: sharding_strategy is deprecated in favor of "
                "reshard_after_forward (accelerate); read for FSDP2",
                "",
            )
        )
        if raw_reshard is None:
            if name not in ("FULL_SHARD", "SHARD_GRAD_OP"):
                raise ConfigError(f"{at('sharding_strategy')}: {name} is FSDP1-only; set fsdp_version 1")
            prov["sharding_strategy"] = at("sharding_strategy")
            return name, name == "FULL_SHARD"
    if raw_reshard is None:
        return "FULL_SHARD", True
    if isinstance(raw_reshard, str) and raw_reshard.strip().upper() in FSDP_STRATEGIES:
        raise ConfigError(
            f"{at('reshard_after_forward')}: reshard_after_forward set to {raw_reshard}. This is not "
            "supported with FSDP2, please set to a `bool` (accelerate)"
        )
    reshard = as_bool(raw_reshard, at=at("reshard_after_forward"))
    prov["reshard_after_forward"] = at("reshard_after_forward")
    return ("FULL_SHARD" if reshard else "SHARD_GRAD_OP"), reshard


def _strategy_name(value: object, at: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(FSDP_STRATEGIES):
        return FSDP_STRATEGIES[value - 1]  # accelerate: FSDP_SHARDING_STRATEGY.index(name) + 1
    text = str(value).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(FSDP_STRATEGIES):
        return FSDP_STRATEGIES[int(text) - 1]
    if text not in FSDP_STRATEGIES:
        raise ConfigError(f"{at}: {value!r} is not one of {', '.join(FSDP_STRATEGIES)}")
    return text


def fsdp_option_string(value: object, *, at: str, version: int = 2) -> dict[str, object]:
    """TrainingArguments' legacy ``fsdp`` value (``"full_shard auto_wrap offload"`` or a list) as
    fsdp_config keys.

    transformers ``TrainingArguments._apply_legacy_fsdp_to_config``: for FSDP2 ``full_shard`` ->
    ``reshard_after_forward: True``, ``shard_grad_op`` -> False, other strategies are FSDP1-only (an error);
    for FSDP1 the strategy name itself; ``offload`` -> ``cpu_offload``; ``auto_wrap`` -> nothing.

    Args:
        value: ``True``, a string or a list of options.
        at: Where it was read.
        version: The FSDP version from ``fsdp_config`` (transformers default 2).

    Returns:
        ``fsdp_config`` entries implied by the options.

    Raises:
        ConfigError: An unknown option, or an FSDP1-only strategy with FSDP2.
    """
    if value is True:
        return {}
    items = as_str_list(value, at=at)
    out: dict[str, object] = {}
    for item in items:
        low = item.lower()
        if low.upper() in FSDP_STRATEGIES:
            if version == 1:
                out.setdefault("reshard_after_forward", low.upper())
            elif low in ("full_shard", "shard_grad_op"):
                out.setdefault("reshard_after_forward", low == "full_shard")
            else:
                raise ConfigError(
                    f"{at}: `fsdp={low}` is only available with FSDP1 (transformers); set "
                    "fsdp_config version 1 or use full_shard / shard_grad_op"
                )
        elif low == "offload":
            out["cpu_offload"] = True
        elif low == "auto_wrap":
            continue
        else:
            raise ConfigError(
                f"{at}: Unknown `fsdp` option: {item} (transformers); use full_shard, shard_grad_op, "
                "hybrid_shard, hybrid_shard_zero2, no_shard, offload, auto_wrap"
            )
    return out
