"""Registry of the pure-Python parameter inventories, by config.json ``model_type``.

Known families answer without importing torch or transformers, in well under a millisecond per model; every
other architecture goes through ``from_config`` on the meta device
(:mod:`fitcheck.torch_adapters.meta_device`). The tests prove both paths give the same entries for every
catalog model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fitcheck.readers import families_dense, families_other, families_recent
from fitcheck.readers.families_base import ConfigView, NotPureFamilyError
from fitcheck.spec import ModelShape, ParamEntry

Family = tuple[list[ParamEntry], ModelShape]

FAMILIES: dict[str, Callable[[ConfigView], Family]] = {
    "llama": families_dense.llama,
    "mistral": families_dense.mistral,
    "mixtral": families_dense.mixtral,
    "qwen2": families_dense.qwen2,
    "gemma": families_dense.gemma,
    "gemma2": families_dense.gemma2,
    "phi3": families_dense.phi3,
    "phi": families_other.phi,
    "gpt2": families_other.gpt2,
    "bert": families_other.bert,
    "falcon": families_other.falcon,
    "bloom": families_other.bloom,
    "qwen3": families_recent.qwen3,
    "qwen3_moe": families_recent.qwen3_moe,
    "gemma3_text": families_recent.gemma3_text,
    "olmo2": families_recent.olmo2,
    "gpt_oss": families_recent.gpt_oss,
    "deepseek_v3": families_recent.deepseek_v3,
}


def supported_families() -> tuple[str, ...]:
    """``model_type`` values with a pure-Python inventory."""
    return tuple(FAMILIES)


def family_inventory(config: Mapping[str, object]) -> Family | None:
    """Parameter entries and shape for a config of a known family.

    Args:
        config: The parsed config.json.

    Returns:
        ``(params, shape)``, or None when the family (or one of its options) has no pure-Python mirror.

    Raises:
        ConfigError: A key has a value of the wrong type, or a required key is missing.
    """
    family = FAMILIES.get(str(config.get("model_type", "")))
    if family is None:
        return None
    try:
        return family(ConfigView(config))
    except NotPureFamilyError:
        return None
