"""A PEFT method other than LoRA, as peft builds it: its config and the wrapped model (no fitcheck tracer here).

peft 0.21.2: ``config.py`` ``PeftConfigMixin.from_peft_type`` picks the config class from
``mapping.py`` ``PEFT_TYPE_TO_CONFIG_MAPPING`` by ``peft_type`` (and drops keys an older peft does not know, with a
warning); ``mapping_func.py`` ``get_peft_model`` wraps the model (``PeftModelForCausalLM`` for ``task_type:
CAUSAL_LM``: prompt tuning / p-tuning prepend the virtual tokens' embeddings and pad the labels, prefix tuning
passes its ``past_key_values``: ``peft_model.py`` ``PeftModelForCausalLM.forward``). The keys a prompt-learning
config derives from the model (``num_layers``, ``token_dim``, ``num_attention_heads``:
``utils/other.py`` ``_prepare_prompt_learning_config`` fills them when None) are dropped, so the model at the
traced depth gets its own. The tensor inventory built from it is :mod:`.peft_adapters`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from fitcheck.spec import PeftAdapterSpec

# keys of a saved config that describe its file or the model it was made for, not the adapter
_DROPPED = ("peft_version", "auto_mapping", "base_model_name_or_path", "revision", "num_layers", "token_dim",
            "num_attention_heads")

def peft_config(adapter: PeftAdapterSpec) -> Any:
    """peft's own config object for the adapter (``PeftConfigMixin.from_peft_type``)."""
    from peft import PeftConfig

    raw = {k: v for k, v in adapter.config.items() if k not in _DROPPED}
    raw["inference_mode"] = False
    return PeftConfig.from_peft_type(**raw)  # type: ignore[no-untyped-call]


def wrap_adapter(model: Any, adapter: PeftAdapterSpec) -> Any:
    """``get_peft_model`` of the adapter's config on ``model``."""
    from peft import get_peft_model

    return get_peft_model(model, peft_config(adapter))


# peft 0.21.2 tuners/loha/layer.py LoHaLayer.forward and tuners/lokr/layer.py LoKrLayer.forward draw
# ``torch.rand(1) > module_dropout`` to skip the whole adapter with probability module_dropout: a Python bool of a
# tensor, which a fake tensor cannot give


class _ScalarDrawsReal:
    """The ``torch`` module, but ``rand(1)`` is drawn as a real number (outside the fake mode)."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def rand(self, *size: Any, **kwargs: Any) -> Any:
        if size in ((1,), ((1,),)) and not kwargs:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():
                return float(self._torch.rand(1))
        return self._torch.rand(*size, **kwargs)


@contextlib.contextmanager
def module_dropout_drawn() -> Iterator[None]:
    """On fake tensors: LoHa's and LoKr's module-dropout draw made real, the rest of the step unchanged (the draw
    keeps the adapter with probability 1 - module_dropout, 1 at the rows' module_dropout 0)."""
    import peft.tuners.loha.layer as loha
    import peft.tuners.lokr.layer as lokr
    import torch

    modules: list[Any] = [loha, lokr]
    for m in modules:
        m.torch = _ScalarDrawsReal(torch)
    try:
        yield
    finally:
        for m in modules:
            m.torch = torch
