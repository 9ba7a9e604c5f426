"""Checks of a loaded model against what the estimate models (the callback and preflight call them).

* :func:`architecture_finding`: the estimate describes the class its inventory names (``ModelInventory.shape.
  architecture``: ``LlamaForCausalLM`` for a Llama config, ``BertForMaskedLM`` for BERT). A live model of
  another class sharing that config — a custom module wrapping ``LlamaModel`` with a ``.config``, a
  ``LlamaForSequenceClassification`` — has other heads and other activations, so its estimate is refused with
  an error finding instead of being made silently for the config's class.
* :func:`pending_lora`: a LoRA spec from ``peft_config`` for a loaded model that has no adapters yet (the
  ``SFTTrainer(model=..., peft_config=...)`` pattern: TRL applies ``get_peft_model`` inside the trainer,
  trl/trainer/sft_trainer.py 1.16), which the live facts must not overwrite with full fine-tuning.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fitcheck.findings import Finding, Severity
from fitcheck.spec import ModelInventory, TrainingSpec


def architecture_finding(model: Any, inventory: ModelInventory) -> Finding | None:
    """An error finding when the loaded model's class is not the class the estimate models."""
    from fitcheck.torch_adapters import unwrap_model

    live = type(unwrap_model(model)).__name__
    if live == inventory.shape.architecture:
        return None
    return Finding(
        "model-class-not-modelled", Severity.ERROR,
        f"the loaded model is a {live}, but its config describes {inventory.shape.architecture} and fitcheck's "
        f"estimate models {inventory.shape.architecture} (its heads, logits and activations); the numbers below are "
        f"for {inventory.shape.architecture}, not for {live}",
        f"estimate the transformers class you train ({inventory.shape.architecture}) or pass its model id to "
        "preflight(); a custom module around a transformers model is not modelled",
    )


def with_pending_lora(spec: TrainingSpec, flag_spec: TrainingSpec, facts: Any) -> tuple[TrainingSpec, list[str]]:
    """Keep the LoRA of ``peft_config`` (in ``flag_spec``) when the loaded model has no adapters yet.

    Args:
        spec: The spec after the live facts were applied (full fine-tuning for a model without adapters).
        flag_spec: The spec built from the flags, ``peft_config`` included.
        facts: The live model's facts.

    Returns:
        The spec with the pending LoRA (no partial-freeze guess) and a note, or ``spec`` unchanged.
    """
    if flag_spec.lora is None or facts.lora is not None:
        return spec, []
    note = ("peft_config given with a model that has no adapters yet: estimated as the trainer will train it, "
            "with get_peft_model applied (LoRA from peft_config), not as full fine-tuning")
    return dataclasses.replace(spec, lora=flag_spec.lora, freeze=None), [note]
