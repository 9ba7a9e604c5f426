"""Which of a layer's linear modules peft wraps with LoRA: one home for the activation formulas.

peft 0.21.2 ``tuners/tuners_utils.py`` (``check_target_module_exists``: a module is targeted when its name ends
with one of ``target_modules``; ``INCLUDE_LINEAR_LAYERS_SHORTHAND`` ``"all-linear"``: every ``nn.Linear`` but the
output head, ``_maybe_include_all_linear_layers``). The formulas ask about a layer's own linears by their short
names, so a suffix match is membership of the short name. Parameter counts (``core/states/lora.py``) match full
parameter names on their own.
"""

from __future__ import annotations

from collections.abc import Iterable

from fitcheck.spec import LoraSpec


def wrapped_linears(lora: LoraSpec | None, names: Iterable[str]) -> frozenset[str]:
    """The linears among ``names`` (a layer's short module names) that LoRA wraps.

    Args:
        lora: The adapter config (None: no adapters).
        names: The layer's linear modules, by short name.

    Returns:
        All of ``names`` for ``all-linear``, else those listed in ``target_modules``; empty without adapters.
    """
    if lora is None:
        return frozenset()
    names = tuple(names)
    if "all-linear" in lora.target_modules:
        return frozenset(names)
    return frozenset(n for n in names if n in lora.target_modules)
