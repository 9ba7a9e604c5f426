"""The transformers class of a task for a config (``--task`` on a config whose ``architectures`` names another).

transformers 5.23 ``models/auto/modeling_auto.py``: ``MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES``,
``MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES``, ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`` map a
``model_type`` to the class ``AutoModelFor...`` would build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.errors import UnsupportedModelError


def task_class(config: Mapping[str, Any], task: str) -> Any:
    """The concrete transformers class for ``task`` and the config's ``model_type``.

    Raises:
        UnsupportedModelError: transformers has no class of that task for the model type.
    """
    import transformers
    from transformers.models.auto import modeling_auto as auto

    mapping = {
        "seq-cls": auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
        "token-cls": auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
        "image-text-to-text": auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    }.get(task, auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    model_type = str(config.get("model_type", ""))
    name = mapping.get(model_type)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    if cls is None:
        raise UnsupportedModelError(f"transformers has no {task} class for model_type {model_type!r}")
    return cls
