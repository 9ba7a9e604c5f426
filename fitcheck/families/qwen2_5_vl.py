"""Qwen2.5-VL (``model_type`` qwen2_5_vl): traits (its inventory is counted on the meta device).

The vision-tower recipe (``fitcheck.core.activations.vision``) was checked against a trace of this family.
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family
from fitcheck.spec import FamilyTraits


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """Qwen2.5-VL's traits: the vision recipe is pinned for it."""
    return replace(base, vision_pinned=True)


FAMILY = Family("qwen2_5_vl", traits)
