"""The ``zero_optimization`` section of a DeepSpeed config: key checks, offload, bucket sizes -> DeepSpeedSpec.

Key tables and defaults are DeepSpeed 0.19's (``deepspeed/runtime/zero/config.py``, ``offload_config.py``,
``deepspeed/runtime/config.py`` ``_REMOVED_ZERO_CONFIG_KEYS``). Hidden-size based ``"auto"`` values follow
transformers 5.23 ``HfTrainerDeepSpeedConfig.trainer_config_finalize``: ``reduce_bucket_size`` = hidden²; for
ZeRO-3 ``stage3_prefetch_bucket_size`` = int(0.9·hidden²) and ``stage3_param_persistence_threshold`` =
10·hidden.
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import as_bool, as_int, as_str, is_auto, where
from fitcheck.spec import DeepSpeedSpec, OffloadDevice

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


_DS = DeepSpeedSpec()  # DeepSpeed's defaults (deepspeed/runtime/zero/config.py), written once on the spec
_SEC = "zero_optimization"


def zero_spec(
    zero: Mapping[str, object],
    *,
    source: str,
    hidden: int | None,
    prov: dict[str, str],
    findings: list[Finding],
) -> DeepSpeedSpec:
    """Check a ``zero_optimization`` mapping and read the memory-relevant ZeRO settings.

    Args:
        zero: The ``zero_optimization`` section (empty when the file has none).
        source: The file name, for provenance and messages.
        hidden: The model's hidden size (fills the hidden-size based ``"auto"`` keys), if known.
        prov: Provenance, filled in place (field -> where it was read or what filled it).
        findings: Findings, appended to in place (unknown and deprecated keys, ignored offload).

    Returns:
        The ZeRO settings.

    Raises:
        ConfigError: A removed key, a bad type or range, or an ``"auto"`` that cannot be resolved.
    """
    _check_keys(zero, source, findings)
    z = _ZeroSection(zero, source, hidden, prov)
    stage = z.stage()
    h = hidden or 0
    z3_rule = stage == 3  # transformers fills the stage-3 keys only for ZeRO-3; DeepSpeed ignores them below 3
    # DeepSpeedZeroConfig: reduce_bucket_size gt=0, others ge=0 (deepspeed/runtime/zero/config.py).
    reduce_bucket = z.size(("reduce_bucket_size",), _DS.reduce_bucket_size, ("hidden_size²", h * h), 1)
    allgather_bucket = z.size(("allgather_bucket_size",), _DS.allgather_bucket_size, None, 0)
    prefetch = z.size(
        ("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
        _DS.prefetch_bucket_size,
        ("0.9·hidden_size²", int(0.9 * h * h)) if z3_rule else ("unused below ZeRO-3", 0),
        0,
    )
    persistence = z.size(
        ("stage3_param_persistence_threshold", "param_persistence_threshold"),
        _DS.param_persistence_threshold,
        ("10·hidden_size", 10 * h) if z3_rule else ("unused below ZeRO-3", 0),
        0,
    )
    max_live = z.size(("stage3_max_live_parameters", "max_live_parameters"), _DS.max_live_parameters, None, 0)
    max_reuse = z.size(("stage3_max_reuse_distance", "max_reuse_distance"), _DS.max_reuse_distance, None, 0)
    sub_group = z.size(("sub_group_size",), _DS.sub_group_size, None, 0)
    overlap = z.flag("overlap_comm", _DS.overlap_comm)
    contiguous = z.flag("contiguous_gradients", _DS.contiguous_gradients)
    off_opt, off_par, pin = _offloads(z, stage, findings)
    gather = _gather_on_save(z)
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
        max_reuse_distance=max_reuse,
        param_persistence_threshold=persistence,
        sub_group_size=sub_group,
        zero3_init=_DS.zero3_init,
        pin_memory=pin,
        gather_16bit_on_save=bool(gather) and stage == 3,
    )


_GATHER_KEYS = ("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                "stage3_gather_fp16_weights_on_model_save")


def _gather_on_save(z: _ZeroSection) -> bool:
    """``stage3_gather_16bit_weights_on_model_save`` (deepspeed 0.19.8 zero/config.py, default False; aliases read).
    ``"auto"`` is filled by accelerate 1.15 from ``zero3_save_16bit_model`` (utils/dataclasses.py; its env default
    ``ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL`` false): read as False."""
    item = z.get(*_GATHER_KEYS)
    if item is None:
        return False
    z.prov["gather_16bit_on_save"] = z.at(item[0])
    return False if is_auto(item[1]) else as_bool(item[1], at=z.at(item[0]))


def _check_keys(zero: Mapping[str, object], source: str, findings: list[Finding]) -> None:
    removed = sorted(REMOVED_ZERO_KEYS & zero.keys())
    if removed:
        raise ConfigError(
            f"{source}: {_SEC}.{removed[0]} was removed from DeepSpeed (0.19 "
            "refuses to start with it); delete it"
        )
    unknown = sorted(set(zero) - ZERO_KEYS)
    if unknown:
        findings.append(
            Finding(
                "deepspeed-unknown-key",
                Severity.WARNING,
                f"{source}: unknown key(s) in {_SEC}: {', '.join(unknown)} (DeepSpeed 0.19's config model "
                "forbids extra keys and will refuse them)",
                "check the spelling against the DeepSpeed ZeRO config docs",
            )
        )


class _ZeroSection:
    """Typed reads of one ``zero_optimization`` section, recording where each value came from."""

    def __init__(self, zero: Mapping[str, object], source: str, hidden: int | None, prov: dict[str, str]) -> None:
        self.zero, self.source, self.hidden, self.prov = zero, source, hidden, prov

    def get(self, *names: str) -> tuple[str, object] | None:
        """The first of ``names`` that is set, with its value."""
        for name in names:
            if name in self.zero and self.zero[name] is not None:
                return name, self.zero[name]
        return None

    def at(self, key: str) -> str:
        """Where a key of the section is, for messages."""
        return where(self.source, f"{_SEC}.{key}")

    def stage(self) -> int:
        """``stage`` (DeepSpeed default 0)."""
        item = self.get("stage")
        if item is None:
            return _DS.stage
        if is_auto(item[1]):
            raise ConfigError(f'{self.at("stage")}: "auto" is not resolvable; set 0, 1, 2 or 3')
        stage = as_int(item[1], at=self.at("stage"))
        if stage not in (0, 1, 2, 3):
            raise ConfigError(f"{self.at('stage')}: must be 0, 1, 2 or 3, got {stage}")
        self.prov["stage"] = self.at("stage")
        return stage

    def size(
        self, field_names: tuple[str, ...], default: int, hidden_rule: tuple[str, int] | None, minimum: int
    ) -> int:
        """A byte/element count; ``"auto"`` filled by transformers' hidden-size rule where it has one."""
        item = self.get(*field_names)
        if item is None:
            return default
        at = self.at(item[0])
        if is_auto(item[1]):
            if hidden_rule is None:
                raise ConfigError(f'{at}: "auto" is not filled by transformers; set a number')
            if self.hidden is None:
                raise ConfigError(
                    f'{at}: "auto" is filled from the model\'s hidden_size '
                    "(transformers trainer_config_finalize), which fitcheck does not know here; "
                    'give the model or replace "auto" with an integer'
                )
            rule, value = hidden_rule
            self.prov[item[0]] = f"{at}=auto <- {rule} (hidden_size {self.hidden})"
            return value
        self.prov[item[0]] = at
        return as_int(item[1], at=at, minimum=minimum)

    def flag(self, name: str, default: bool | None) -> bool | None:
        """A boolean (``"auto"`` is not resolvable)."""
        item = self.get(name)
        if item is None:
            return default
        if is_auto(item[1]):
            raise ConfigError(f'{self.at(name)}: "auto" is not resolvable; set true or false')
        self.prov[name] = self.at(name)
        return as_bool(item[1], at=self.at(name))


def _offloads(z: _ZeroSection, stage: int, findings: list[Finding]) -> tuple[OffloadDevice, OffloadDevice, bool]:
    """``offload_optimizer``/``offload_param`` devices (deprecated booleans read too; what the stage ignores is
    dropped with a finding) and whether the host buffers are pinned."""
    source = z.source
    off_opt, pin_opt = _offload(z.zero, "offload_optimizer", OFFLOAD_OPTIMIZER_KEYS, source, z.prov, findings)
    off_par, pin_par = _offload(z.zero, "offload_param", OFFLOAD_PARAM_KEYS, source, z.prov, findings)
    # Deprecated booleans (DeepSpeedZeroConfig cpu_offload / cpu_offload_param, "new_param" offload_*).
    for old, new in (("cpu_offload", "offload_optimizer"), ("cpu_offload_param", "offload_param")):
        item = z.get(old)
        if item is not None and as_bool(item[1], at=z.at(old)):
            findings.append(
                Finding(
                    "deprecated-key",
                    Severity.INFO,
                    f"{source}: {_SEC}.{old} is deprecated; read as {new}.device=cpu",
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
                f"{source}: {_SEC}.offload_param is only used by ZeRO-3 (stage3.py); stage {stage} ignores it",
                "use stage 3 to offload parameters, or remove offload_param",
            )
        )
        off_par = OffloadDevice.NONE
    if off_opt is not OffloadDevice.NONE and stage == 0:
        findings.append(
            Finding(
                "offload-optimizer-ignored",
                Severity.WARNING,
                f"{source}: {_SEC}.offload_optimizer is done by the ZeRO optimizer "
                "(stage >= 1); stage 0 ignores it",
                "use stage 1, 2 or 3 to offload the optimizer",
            )
        )
        off_opt = OffloadDevice.NONE
    return off_opt, off_par, pin_opt or pin_par


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
    if is_auto(device_raw):
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


def not_modelled_findings(raw: Mapping[str, object], source: str) -> list[Finding]:
    """Tensor/pipeline/sequence parallel and ZeRO++ features that change memory but are not modelled.

    Args:
        raw: The whole parsed DeepSpeed config.
        source: The file name, for messages.

    Returns:
        One ``not-modelled`` warning per such feature.
    """
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
