"""Model families: one module per family, each declaring its parameter inventory and its traits, in one registry.

Ground floor (imports only :mod:`fitcheck.spec`, :mod:`fitcheck.errors`): the readers fill
``ModelShape.traits`` from here, and the core reads those typed traits, never a ``model_type`` name (the model
of litgpt's ``Config`` traits and peft's one-place method registry).

- :mod:`.llama`, :mod:`.granite`, :mod:`.mistral`, :mod:`.mixtral`, :mod:`.qwen2`, :mod:`.qwen3`, :mod:`.qwen_moe`,
  :mod:`.gemma`, :mod:`.phi3`, :mod:`.olmo2`, :mod:`.gpt_oss`, :mod:`.deepseek_v3`: the RMSNorm decoders;
- :mod:`.phi`, :mod:`.gpt2`, :mod:`.bert` (with the RoBERTa-like encoders), :mod:`.falcon`, :mod:`.bloom`: the
  LayerNorm families; :mod:`.qwen2_5_vl`: a vision-language family (traits only);
- :mod:`.base` (``ConfigView``, ``InventoryBuilder``, the :class:`Family` record), :mod:`.decoder_blocks`,
  :mod:`.layernorm_blocks`, :mod:`.tp_plans`, :mod:`.peft_moe`: what the family modules share.

Where a new family goes: one module here declaring ``FAMILY = Family(model_type, traits, inventory)`` (traits
built with ``dataclasses.replace`` from the config-wide ones), listed in :data:`_MODULES`; a catalog config;
tests (tests/test_inventory_meta.py checks the inventory against the meta device).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from fitcheck.families import (
    bert,
    bloom,
    deepseek_v3,
    falcon,
    gemma,
    gpt2,
    gpt_oss,
    granite,
    llama,
    mistral,
    mixtral,
    olmo2,
    phi,
    phi3,
    qwen2,
    qwen2_5_vl,
    qwen3,
    qwen_moe,
)
from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder, NotPureFamilyError, mlp_kind
from fitcheck.families.peft_moe import MOE_CONVERSION
from fitcheck.spec import FamilyTraits, MoeConversion, VisionConfig

__all__ = [
    "FAMILIES",
    "ConfigView",
    "Family",
    "Inventory",
    "InventoryBuilder",
    "NotPureFamilyError",
    "family_inventory",
    "family_of",
    "mlp_kind",
    "supported_families",
    "traits_of",
    "traits_of_type",
]

_MODULES: tuple[tuple[Family, ...], ...] = (
    (llama.FAMILY,),
    (mistral.FAMILY,),
    (mixtral.FAMILY,),
    (qwen2.FAMILY,),
    gemma.GEMMA_1_2,
    (phi3.FAMILY,),
    (phi.FAMILY,),
    (gpt2.FAMILY,),
    bert.FAMILIES,
    (falcon.FAMILY,),
    (bloom.FAMILY,),
    (qwen3.FAMILY,),
    qwen_moe.FAMILIES[:1],
    gemma.GEMMA_3,
    (olmo2.FAMILY,),
    (gpt_oss.FAMILY,),
    (deepseek_v3.FAMILY,),
    (qwen2_5_vl.FAMILY,),
    qwen_moe.FAMILIES[1:],
    (granite.FAMILY,),
)
# The one registry: model_type -> family (in this order: ``supported_families`` lists them in error messages).
FAMILIES: dict[str, Family] = {f.model_type: f for group in _MODULES for f in group}


def family_of(model_type: str) -> Family | None:
    """The declared family of a ``model_type`` (a later Gemma falls back to Gemma's), or None."""
    found = FAMILIES.get(model_type)
    if found is None and model_type.startswith(gemma.DESCENDANT_PREFIX):
        return gemma.DESCENDANT
    return found


def supported_families() -> tuple[str, ...]:
    """``model_type`` values with a pure-Python inventory."""
    return tuple(t for t, f in FAMILIES.items() if f.inventory is not None)


def _vision(cfg: ConfigView) -> VisionConfig | None:
    """``vision_config`` widths, ``Qwen2_5_VLVisionConfig`` defaults for absent keys (None: no vision config)."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, Mapping):
        return None

    def num(*keys: str, default: int) -> int:
        for key in keys:
            value = vc.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return default

    patch = num("patch_size", "spatial_patch_size", default=14)
    return VisionConfig(
        hidden=num("hidden_size", "embed_dim", default=1280),
        heads=num("num_heads", "num_attention_heads", default=16),
        intermediate=num("intermediate_size", default=3420),
        depth=num("depth", "num_hidden_layers", default=32),
        patch_in=num("in_channels", "in_chans", default=3) * num("temporal_patch_size", default=2) * patch * patch,
        spatial_merge_size=num("spatial_merge_size", default=2),
    )


def _classifier_dropout(cfg: ConfigView) -> float:
    """The dropout before a classifier head; 0.1 when the config names none (GenericForTokenClassification,
    BERT's ``hidden_dropout_prob`` default)."""
    for key in ("classifier_dropout", "hidden_dropout", "hidden_dropout_prob"):
        value = cfg.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 0.1


def _num_labels(cfg: ConfigView) -> int:
    """``num_labels`` as ``int(str(value or 1))`` (1 when absent or not a whole number)."""
    try:
        return int(str(cfg.get("num_labels", 1) or 1))
    except ValueError:
        return 1


def _config_wide(cfg: ConfigView) -> FamilyTraits:
    """The traits every config has, whatever its family (the start of each family's traits)."""
    return FamilyTraits(
        moe_conversion=MOE_CONVERSION.get(cfg.model_type, MoeConversion.NONE),
        classifier_dropout=_classifier_dropout(cfg),
        logit_softcapping=bool(cfg.get("final_logit_softcapping")),
        config_num_labels=_num_labels(cfg),
        vision=_vision(cfg),
    )


def traits_of(config: Mapping[str, object]) -> FamilyTraits:
    """The traits of a config: its family's, filled from config.json (config-wide ones for an undeclared family).

    Args:
        config: The parsed config.json.

    Raises:
        ConfigError: A key the traits read has a value of the wrong type.
    """
    cfg = ConfigView(config)
    base = _config_wide(cfg)
    family = family_of(cfg.model_type)
    return base if family is None else family.traits(cfg, base)


def traits_of_type(model_type: str) -> FamilyTraits:
    """The traits of a family at its config class's defaults (tests and hand-built shapes)."""
    return traits_of({"model_type": model_type})


def family_inventory(config: Mapping[str, object]) -> Inventory | None:
    """Parameter entries and shape (with its traits) for a config of a family with a pure-Python inventory.

    Args:
        config: The parsed config.json.

    Returns:
        ``(params, shape)``, or None when the family (or one of its options) has no pure-Python mirror.

    Raises:
        ConfigError: A key has a value of the wrong type, or a required key is missing.
    """
    family = FAMILIES.get(str(config.get("model_type", "")))
    if family is None or family.inventory is None:
        return None
    try:
        params, shape = family.inventory(ConfigView(config))
    except NotPureFamilyError:
        return None
    return params, replace(shape, traits=traits_of(config))
