"""Read the parallelism layout (accelerate ``ParallelismConfig``) from every place it can come from.

Precedence, highest first, per size (accelerate 1.15 ``ParallelismConfig.__post_init__`` fills a field left
``None`` from the ``PARALLELISM_CONFIG_*`` environment that ``accelerate launch`` exports from its flags and
config file, ``utils/launch.py`` ``prepare_extend_env_parallelism_config``):

1. ``fitcheck estimate`` flags ``--dp_replicate_size --dp_shard_size --tp_size --cp_size --sp_size
   --sp_backend --cp_comm_strategy`` (accelerate's names; ``--parallelism_config_<name>`` also accepted);
2. ``parallelism_config`` in the TrainingArguments / TRL config (``--training_args``): a mapping of
   ``ParallelismConfig`` fields, passed to ``Accelerator(parallelism_config=...)``;
3. the accelerate config YAML's ``parallelism_config`` section (``parallelism_config_dp_shard_size: 4``... as
   ``accelerate config`` writes it, ``commands/config/cluster.py``; unprefixed names also read);
4. DeepSpeed's ``sequence_parallel_size`` (DeepSpeed 0.19.8 ``runtime/config.py``) for ``sp_size``.

:func:`check_layout` then applies accelerate's checks (:mod:`fitcheck.core.parallelism.layout`) and raises
them as one :class:`ConfigError` naming the sizes, where each was read and the process count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fitcheck.core.parallelism import layout_problems
from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.readers.sources import as_int, as_mapping, as_str
from fitcheck.spec import ParallelismSpec, TrainingSpec

SIZE_KEYS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
TEXT_KEYS = ("sp_backend", "cp_comm_strategy")
PARALLELISM_FLAGS = (*SIZE_KEYS, *TEXT_KEYS)
_PREFIX = "parallelism_config_"
# ParallelismConfig fields / handler fields accepted in a mapping (accelerate 1.15), besides the sizes.
_OTHER_KEYS = frozenset(
    {"cp_backend", "tp_handler", "cp_handler", "sp_handler", "sp_seq_length", "sp_seq_length_is_variable",
     "sp_attn_implementation"}
)


@dataclass(frozen=True)
class ParallelismRead:
    """The layout as read, or None when no source sets one.

    Attributes:
        spec: The sizes (None: no source configures parallelism).
        provenance: Field (``tp_size``...) -> where it was read.
        findings: Conflicts between sources.
    """

    spec: ParallelismSpec | None
    provenance: dict[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()


def _mapping_values(raw: Mapping[str, object], source: str) -> dict[str, tuple[object, str]]:
    out: dict[str, tuple[object, str]] = {}
    for key, value in raw.items():
        name = str(key).removeprefix(_PREFIX)
        if name in PARALLELISM_FLAGS:
            out[name] = (value, f"{source}:{key}")
        elif name == "cp_handler" and isinstance(value, Mapping) and "cp_comm_strategy" in value:
            out["cp_comm_strategy"] = (value["cp_comm_strategy"], f"{source}:{key}.cp_comm_strategy")
        elif name not in _OTHER_KEYS:
            raise ConfigError(
                f"{source}:{key}: not a ParallelismConfig field (accelerate 1.15 knows "
                f"{', '.join(PARALLELISM_FLAGS)}); fix the spelling"
            )
    return out


def _object_fields(value: object) -> object:
    """A live ``accelerate.ParallelismConfig`` (``TrainingArguments.parallelism_config``) as a mapping of the
    fields it was given; other values pass through unchanged."""
    if isinstance(value, Mapping) or not hasattr(value, "dp_shard_size"):
        return value
    out: dict[str, object] = {}
    for key in (*SIZE_KEYS, "sp_backend"):
        if getattr(value, key, None) is not None:
            out[key] = getattr(value, key)
    handler = getattr(value, "cp_handler", None)
    if getattr(handler, "cp_comm_strategy", None) is not None:
        out["cp_comm_strategy"] = handler.cp_comm_strategy  # type: ignore[union-attr]
    return out


def read_parallelism(
    cli: Mapping[str, object],
    training_args: object,
    training_args_where: str,
    accelerate_section: object,
    accelerate_source: str,
    deepspeed: Mapping[str, object] | None,
    deepspeed_source: str,
) -> ParallelismRead:
    """Merge the layout from flags, TrainingArguments, the accelerate YAML and DeepSpeed's JSON.

    Args:
        cli: Explicit flags (canonical names, with or without the ``parallelism_config_`` prefix).
        training_args: ``parallelism_config`` from the TrainingArguments file (a mapping), or None.
        training_args_where: Where it was read.
        accelerate_section: The accelerate YAML's ``parallelism_config`` section, or None.
        accelerate_source: The YAML's path.
        deepspeed: The DeepSpeed config, or None.
        deepspeed_source: Its path.

    Returns:
        The layout (None when no source sets one), its provenance and conflict findings.

    Raises:
        ConfigError: Non-integer or non-positive sizes, unknown keys.
    """
    layers: list[dict[str, tuple[object, str]]] = []
    flags = {
        str(k).removeprefix(_PREFIX): (v, f"--{k}")
        for k, v in cli.items()
        if str(k).removeprefix(_PREFIX) in PARALLELISM_FLAGS and v is not None
    }
    layers.append(flags)
    if training_args is not None:
        raw = _object_fields(training_args)
        layers.append(_mapping_values(as_mapping(raw, at=training_args_where), training_args_where))
    if accelerate_section is not None:
        src = f"{accelerate_source}:parallelism_config"
        layers.append(_mapping_values(as_mapping(accelerate_section, at=src), src))
    if deepspeed is not None and deepspeed.get("sequence_parallel_size") is not None:
        layers.append(
            {"sp_size": (deepspeed["sequence_parallel_size"], f"{deepspeed_source}:sequence_parallel_size")}
        )
    chosen: dict[str, tuple[object, str]] = {}
    findings: list[Finding] = []
    for layer in layers:  # highest precedence first
        for key, (value, where) in layer.items():
            if key not in chosen:
                chosen[key] = (value, where)
            elif str(chosen[key][0]) != str(value):
                findings.append(
                    Finding(
                        "conflicting-sources",
                        Severity.WARNING,
                        f"{key}: {chosen[key][1]}={chosen[key][0]!r} overrides {where}={value!r}",
                        "remove one of them",
                    )
                )
    if not chosen:
        return ParallelismRead(None)
    sizes = {k: as_int(chosen[k][0], at=chosen[k][1], minimum=1) for k in SIZE_KEYS if k in chosen}
    texts = {k: as_str(chosen[k][0], at=chosen[k][1]).strip().lower() for k in TEXT_KEYS if k in chosen}
    spec = ParallelismSpec(
        dp_replicate=sizes.get("dp_replicate_size", 1),
        dp_shard=sizes.get("dp_shard_size", 1),
        tp=sizes.get("tp_size", 1),
        cp=sizes.get("cp_size", 1),
        sp=sizes.get("sp_size", 1),
        sp_backend=texts.get("sp_backend", "deepspeed"),
        cp_comm_strategy=texts.get("cp_comm_strategy", "allgather"),
    )
    return ParallelismRead(spec, {k: w for k, (_, w) in chosen.items()}, tuple(findings))


def check_layout(spec: TrainingSpec) -> None:
    """Refuse a layout accelerate, transformers or DeepSpeed would refuse (exit 2), naming sizes and processes.

    Args:
        spec: The built spec (its ``sharding.parallelism`` and provenance).

    Raises:
        ConfigError: One problem per line, each with the sizes as read and a fix.
    """
    problems = layout_problems(spec)
    if not problems:
        return
    par = spec.sharding.parallelism
    assert par is not None
    prov = spec.provenance
    where = ", ".join(
        f"{name}_size={size} ({prov.get(f'parallelism.{name}_size', 'default')})"
        for name, size in par.as_dict().items()
    )
    head = (
        f"invalid parallelism layout: {where}; num_processes={spec.sharding.num_processes} "
        f"({prov.get('num_processes', 'default 1')}), strategy {spec.sharding.strategy.value}"
    )
    raise ConfigError(head, *problems)
