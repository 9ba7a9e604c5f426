"""FSDP settings from an accelerate config's ``fsdp_config`` or from TrainingArguments, as each library reads them.

Sources: accelerate 1.15 ``utils/dataclasses.py`` ``FullyShardedDataParallelPlugin`` (FSDP1/FSDP2 keys, which
strategy spelling each version accepts) and ``utils/constants.py`` (strategy names); transformers 5.23
``training_args.py`` (``fsdp_config`` keys with or without the ``fsdp_`` prefix, FSDP2 by default, legacy
``fsdp="full_shard auto_wrap offload"`` strings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import get_args

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import as_bool, as_int, as_str_list, where
from fitcheck.spec import SHARDING_STRATEGIES, AutoWrapPolicy, BackwardPrefetchPolicy, FsdpSpec, ShardingStrategy

FSDP_STRATEGIES = SHARDING_STRATEGIES  # accelerate utils/constants.py FSDP_SHARDING_STRATEGY, in its order
WRAP_POLICIES: tuple[AutoWrapPolicy, ...] = get_args(AutoWrapPolicy)
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

    version = _version(c, flavour, at, prov, source, findings)
    strategy, reshard = _strategy(c, version, at, prov, findings)
    offload_key = next((k for k in ("offload_params", "cpu_offload") if c.get(k) is not None), None)
    offload = as_bool(c[offload_key], at=at(offload_key)) if offload_key else False
    if offload_key:
        prov["offload_params"] = at(offload_key)
    policy, min_params = _wrap_policy(c, at)
    if c.get("transformer_layer_cls_to_wrap") is not None:
        as_str_list(c["transformer_layer_cls_to_wrap"], at=at("transformer_layer_cls_to_wrap"))
    use_orig = as_bool(c.get("use_orig_params", True), at=at("use_orig_params"))
    # accelerate 1.15 plugin default False (env FSDP_CPU_RAM_EFFICIENT_LOADING); transformers fsdp_config too
    ram_efficient = as_bool(c.get("cpu_ram_efficient_loading", False), at=at("cpu_ram_efficient_loading"))
    if c.get("cpu_ram_efficient_loading") is not None:
        prov["cpu_ram_efficient_loading"] = at("cpu_ram_efficient_loading")
    ac = (
        as_bool(c["activation_checkpointing"], at=at("activation_checkpointing"))
        if c.get("activation_checkpointing") is not None
        else None
    )
    if ac is not None:
        prov["activation_checkpointing"] = at("activation_checkpointing")
    state_dict_type = _state_dict_type(c, version, flavour, at, prov)
    prefetch = _backward_prefetch(c, version, at, prov)
    forward_prefetch, limit = _fsdp1_flags(c, version, flavour, at, prov, findings)
    try:
        spec = FsdpSpec(
            version=version,
            sharding_strategy=strategy,
            reshard_after_forward=reshard,
            offload_params=offload,
            use_orig_params=use_orig,
            auto_wrap_policy=policy,
            min_num_params=min_params,
            cpu_ram_efficient_loading=ram_efficient,
            state_dict_type=state_dict_type,
            backward_prefetch=prefetch,
            forward_prefetch=forward_prefetch,
            limit_all_gathers=limit,
        )
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return FsdpRead(spec, ac, prov, tuple(findings))


# accelerate 1.15 utils/constants.py FSDP_BACKWARD_PREFETCH; a digit is torch's BackwardPrefetch value (1, 2)
_PREFETCH: tuple[BackwardPrefetchPolicy, ...] = get_args(BackwardPrefetchPolicy)


def _backward_prefetch(c: Mapping[str, object], version: int, at: Callable[[str], str],
                       prov: dict[str, str]) -> BackwardPrefetchPolicy:
    """``backward_prefetch`` as accelerate 1.15's plugin reads it (``utils/dataclasses.py``
    ``FullyShardedDataParallelPlugin.__post_init__``: a name of ``FSDP_BACKWARD_PREFETCH`` or torch's
    ``BackwardPrefetch`` value 1 / 2; ``NO_PREFETCH`` and absent are None; FSDP2: set to None with a warning).
    Absent: NO_PREFETCH, the default of both accelerate's plugin and transformers 5.23's ``fsdp_config``."""
    value = c.get("backward_prefetch")
    if value is None or version == 2:
        return "NO_PREFETCH"
    text = str(value).strip().upper()
    if text.isdigit() and int(text) in (1, 2):
        text = _PREFETCH[int(text) - 1]
    if text not in _PREFETCH:
        raise ConfigError(f"{at('backward_prefetch')}: expected one of {', '.join(_PREFETCH)}, got {value!r} "
                          "(accelerate's FullyShardedDataParallelPlugin refuses it)")
    prov["backward_prefetch"] = at("backward_prefetch")
    return next(p for p in _PREFETCH if p == text)


def _fsdp1_flags(c: Mapping[str, object], version: int, flavour: str, at: Callable[[str], str],
                 prov: dict[str, str], findings: list[Finding]) -> tuple[bool, bool]:
    """FSDP1's ``forward_prefetch`` (default False) and ``limit_all_gathers`` (default True), booleans, as they reach
    FSDP1's constructor (accelerate 1.15 ``accelerator.py`` l.1953-1957).

    Neither reaches FSDP2: accelerate reads ``FSDP_FORWARD_PREFETCH`` for ``fsdp_version`` 1 only
    (``utils/dataclasses.py``; ``accelerate to-fsdp2`` marks it NOT_YET_IMPLEMENTED) and transformers 5.23 passes
    both in its FSDP1 branch only (``training_args.py`` l.2872-2883). An accelerate config's
    ``fsdp_limit_all_gathers`` is never applied: ``accelerate launch`` exports no ``FSDP_LIMIT_ALL_GATHERS``
    (``utils/launch.py`` ``prepare_multi_gpu_env``) and the plugin reads none, so its default True stands. Such a key
    is read (a bad value is an error) and noted as not applied."""
    out = [False, True]
    ignored = []
    for i, key in enumerate(("forward_prefetch", "limit_all_gathers")):
        if c.get(key) is None:
            continue
        value = as_bool(c[key], at=at(key))
        if version == 2 or (flavour == "accelerate" and key == "limit_all_gathers"):
            ignored.append(at(key))
            continue
        out[i] = value
        prov[key] = at(key)
    if ignored:
        findings.append(Finding(
            "fsdp-key-ignored", Severity.INFO,
            f"{', '.join(ignored)}: not applied (FSDP2 has no such setting; accelerate 1.15 launch does not pass an "
            "accelerate config's fsdp_limit_all_gathers): nothing to model",
            "set it in TrainingArguments' fsdp_config with fsdp_config version 1 to apply it"))
    return out[0], out[1]


_STATE_DICT_TYPES = {"1": "FULL_STATE_DICT", "2": "LOCAL_STATE_DICT", "3": "SHARDED_STATE_DICT"}  # torch StateDictType


def _state_dict_type(c: Mapping[str, object], version: int, flavour: str, at: Callable[[str], str],
                     prov: dict[str, str]) -> str:
    """``state_dict_type``, or the default: transformers 5.23 training_args.py ``fsdp_config.get("state_dict_type",
    "FULL_STATE_DICT")`` for the Trainer's fsdp_config; accelerate 1.15 ``set_state_dict_type`` (FULL for FSDP1,
    SHARDED for FSDP2) for an accelerate config."""
    raw = c.get("state_dict_type")
    if raw is None:
        default = "FULL_STATE_DICT" if flavour == "trainer" or version == 1 else "SHARDED_STATE_DICT"
        prov["state_dict_type"] = f"{flavour} default {default}"
        return default
    text = str(raw).strip().upper()
    text = _STATE_DICT_TYPES.get(text, text)
    if text not in _STATE_DICT_TYPES.values():
        raise ConfigError(f"{at('state_dict_type')}: {raw!r} is not a state dict type; use FULL_STATE_DICT, "
                          "SHARDED_STATE_DICT or LOCAL_STATE_DICT")
    if version == 2 and text == "LOCAL_STATE_DICT":
        raise ConfigError(f"{at('state_dict_type')}: FSDP2 does not support LOCAL_STATE_DICT (accelerate 1.15 "
                          "refuses it); use SHARDED_STATE_DICT or FULL_STATE_DICT")
    prov["state_dict_type"] = at("state_dict_type")
    return text


def _version(
    c: Mapping[str, object],
    flavour: str,
    at: Callable[[str], str],
    prov: dict[str, str],
    source: str,
    findings: list[Finding],
) -> int:
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
    return version


def _wrap_policy(c: Mapping[str, object], at: Callable[[str], str]) -> tuple[AutoWrapPolicy, int]:
    text = str(c.get("auto_wrap_policy") or "TRANSFORMER_BASED_WRAP").strip().upper()
    policy = next((p for p in WRAP_POLICIES if p == text), None)
    if policy is None:
        raise ConfigError(
            f"{at('auto_wrap_policy')}: must be one of {', '.join(WRAP_POLICIES)}, got {text!r}"
        )
    min_params = 0
    if policy == "SIZE_BASED_WRAP":
        min_params = as_int(
            c.get("min_num_params", 100_000_000), at=at("min_num_params"), minimum=1
        )  # launch.py
    return policy, min_params


def _strategy(
    c: Mapping[str, object],
    version: int,
    at: Callable[[str], str],
    prov: dict[str, str],
    findings: list[Finding],
) -> tuple[ShardingStrategy, bool]:
    raw_strategy = c.get("sharding_strategy")
    raw_reshard = c.get("reshard_after_forward")
    if version == 1:
        # Plugin: sharding_strategy wins (legacy, int 1-5 or a name); reshard_after_forward never reaches FSDP1
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
        if key == "reshard_after_forward":
            return _fsdp1_reshard_ignored(name, at(key), findings)
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


def _fsdp1_reshard_ignored(name: ShardingStrategy, at: str, findings: list[Finding]) -> tuple[ShardingStrategy, bool]:
    """FSDP1 with a strategy given only as ``reshard_after_forward`` (transformers 5.23 writes ``fsdp="shard_grad_op"``
    there, ``training_args.py`` ``_apply_legacy_fsdp_to_config``; so does accelerate 1.15's config): FULL_SHARD.

    accelerate 1.15 ``FullyShardedDataParallelPlugin.__post_init__`` (``utils/dataclasses.py``) sets an FSDP1
    plugin's ``sharding_strategy`` from the environment when it is None (``FSDP_SHARDING_STRATEGY``, default
    ``FULL_SHARD``; ``accelerate launch`` exports its ``--fsdp_sharding_strategy``, default FULL_SHARD), and
    ``Accelerator.prepare_model`` passes ``sharding_strategy or reshard_after_forward`` to FSDP (``accelerator.py``):
    the strategy is never the ``reshard_after_forward`` one. The real Trainer (``benchmarks/fsdp_kinds_cpu.py``
    ``sgo-fsdp1-*``, ``fsdp="shard_grad_op auto_wrap"``, FSDP1, 2 gloo ranks) runs ``ShardingStrategy.FULL_SHARD``:
    its peaks equal the FULL_SHARD run's byte for byte (``accumulation_engines_cpu.json`` ``fsdp1-2ranks``).
    """
    if name != "FULL_SHARD":
        findings.append(
            Finding(
                "fsdp1-reshard-ignored",
                Severity.WARNING,
                f"{at}: {name} is not what FSDP1 runs: accelerate 1.15 gives FSDP1 the plugin's sharding_strategy "
                "(FSDP_SHARDING_STRATEGY, default FULL_SHARD) over reshard_after_forward; estimated as FULL_SHARD",
                "set fsdp_sharding_strategy in the accelerate config (or FSDP_SHARDING_STRATEGY) to run "
                f"{name} under FSDP1",
            )
        )
    return "FULL_SHARD", True


def _strategy_name(value: object, at: str) -> ShardingStrategy:
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= len(FSDP_STRATEGIES):
        return FSDP_STRATEGIES[value - 1]  # accelerate: FSDP_SHARDING_STRATEGY.index(name) + 1
    text = str(value).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(FSDP_STRATEGIES):
        return FSDP_STRATEGIES[int(text) - 1]
    name = next((s for s in FSDP_STRATEGIES if s == text), None)
    if name is None:
        raise ConfigError(f"{at}: {value!r} is not one of {', '.join(FSDP_STRATEGIES)}")
    return name


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
