"""Read an accelerate config YAML as accelerate does: processes, machines, precision, DeepSpeed, FSDP.

Sources: accelerate 1.15 ``commands/config/config_args.py`` (default location, ``process_config``, unknown
keys are an error), ``commands/launch.py`` ``_validate_launch_command`` (explicit flags win over the file;
``num_processes: -1`` needs ``--num_processes``), ``utils/launch.py`` (``nproc_per_node = num_processes //
num_machines``: ``num_processes`` is the TOTAL over machines), ``utils/dataclasses.py`` ``DeepSpeedPlugin``
(inline keys -> a DeepSpeed dict; inline keys together with ``deepspeed_config_file`` are an error) and
``FullyShardedDataParallelPlugin`` (its ``fsdp_config`` section is read by
:func:`fitcheck.readers.fsdp_config.fsdp_from_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.deepspeed import ACCELERATE_ZERO_STAGE, accelerate_deepspeed_config
from fitcheck.readers.fsdp_config import FsdpRead, fsdp_from_config
from fitcheck.readers.sources import as_bool, as_int, as_str, load_mapping_file, where
from fitcheck.spec import MixedPrecision

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
        parallelism: The ``parallelism_config`` section (read by ``fitcheck.readers.parallelism``).
        provenance: Field -> where it was read.
        findings: Not-modelled parallelism, legacy keys.
        use_cpu: ``use_cpu`` (``accelerate config`` writes true for MULTI_CPU): the script trains on the CPU.
        mpirun_hostfile: ``mpirun_config.mpirun_hostfile`` (the simple launcher then starts ``num_processes``
            through mpirun; :mod:`fitcheck.readers.accelerate_processes`).
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
    parallelism: Mapping[str, object] | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    use_cpu: bool = False
    mpirun_hostfile: str | None = None


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
    section = raw.get("parallelism_config")
    if section is not None and not isinstance(section, Mapping):
        raise ConfigError(f"{where(path, 'parallelism_config')}: expected a mapping, got {section!r}")
    read = AccelerateRead(
        path, dist, num_processes, num_machines, mixed, provenance=prov,
        parallelism={str(k): v for k, v in section.items()} if section else None,
    )
    use_cpu, hostfile = _cpu_keys(raw, path, prov)
    read = replace(read, use_cpu=use_cpu, mpirun_hostfile=hostfile)
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


def _cpu_keys(raw: Mapping[str, object], path: str, prov: dict[str, str]) -> tuple[bool, str | None]:
    """``use_cpu`` and ``mpirun_config.mpirun_hostfile`` (accelerate 1.15 ClusterConfig)."""
    use_cpu = False
    if raw.get("use_cpu") is not None:
        use_cpu = as_bool(raw["use_cpu"], at=where(path, "use_cpu"))
        prov["use_cpu"] = where(path, "use_cpu")
    mpirun = raw.get("mpirun_config") or {}
    if not isinstance(mpirun, Mapping):
        raise ConfigError(f"{where(path, 'mpirun_config')}: expected a mapping, got {mpirun!r}")
    hostfile = mpirun.get("mpirun_hostfile")
    return use_cpu, as_str(hostfile, at=where(path, "mpirun_config.mpirun_hostfile")) if hostfile else None


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
    stage = as_int(cfg.get("zero_stage", ACCELERATE_ZERO_STAGE), at=where(src, "zero_stage"))
    gas: object = cfg.get("gradient_accumulation_steps", "auto")
    if gas != "auto":
        gas = as_int(gas, at=where(src, "gradient_accumulation_steps"), minimum=1)
    offload = {
        name: {"device": cfg.get(f"{name}_device") or "none", "nvme_path": cfg.get(f"{name}_nvme_path")}
        for name in ("offload_optimizer", "offload_param")
    }
    save16 = None
    if cfg.get("zero3_save_16bit_model") is not None:
        save16 = as_bool(cfg["zero3_save_16bit_model"], at=where(src, "zero3_save_16bit_model"))
    ds = accelerate_deepspeed_config(stage, gas, offload, save16)
    if read.mixed_precision in (MixedPrecision.BF16, MixedPrecision.FP16):
        ds[read.mixed_precision.value] = {"enabled": True}
    return replace(read, deepspeed=ds, zero3_init=zero3_init, findings=tuple(findings))
