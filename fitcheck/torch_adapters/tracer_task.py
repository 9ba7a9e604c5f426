"""The head, labels and config of a traced step for each task (causal LM, sequence / token classification).

* causal LM: labels = input ids (``loss_utils.ForCausalLMLoss`` shifts them), the head is the output embeddings.
* seq-cls: one label per sequence, ``(batch,)`` int64 in ``[0, num_labels)``; the head is ``score`` /
  ``classifier``. transformers 5.23 ``modeling_layers.py GenericForSequenceClassification.forward`` raises for a
  batch > 1 without ``pad_token_id`` (it pools the last non-pad token), so a missing one is set to 0, as a
  training script sets ``model.config.pad_token_id = tokenizer.pad_token_id``.
* token-cls: one label per token, ``(batch, seq)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def task_trace_config(config: Mapping[str, Any], task: str) -> dict[str, Any]:
    """The config with what the task's forward needs (``pad_token_id`` for decoder seq-cls)."""
    out = dict(config)
    if task == "seq-cls" and out.get("pad_token_id") is None:
        out["pad_token_id"] = 0
    return out


def task_labels(model: Any, ids: Any, task: str) -> Any:
    """Labels of the task's loss (the ids themselves for a causal LM)."""
    import torch

    n = int(getattr(model.config, "num_labels", 2) or 2)
    if task == "seq-cls":
        return torch.randint(0, n, (ids.shape[0],))
    if task == "token-cls":
        return torch.randint(0, n, tuple(ids.shape))
    return ids


def task_head(model: Any) -> Any:
    """The module whose forward opens the loss region: output embeddings, else ``score`` / ``classifier``."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        return head
    base = getattr(model, "base_model", model)
    inner = getattr(base, "model", base)  # peft: PeftModel.base_model (LoraModel).model
    for owner in (model, inner):
        for name in ("score", "classifier"):
            mod = getattr(owner, name, None)
            if mod is not None:
                return mod
    raise ValueError(f"{type(model).__name__}: no output embeddings, score or classifier head to trace")
