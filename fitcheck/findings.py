"""Findings: what fitcheck wants the user to know, each with a stable code.

"Does not fit" is a finding, not an exception. Readers, the core and the adapters all produce them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# Error findings that mean a library refuses the run outright (it raises before or at the first step): the CLI
# exits 2 for them, as for any other input that cannot run. Every other error finding (a run that is very slow
# or fails later, such as trainable-offloaded) exits 1 even when the memory fits: an error is never exit 0.
REFUSED_CODES: frozenset[str] = frozenset(
    {
        "quantized-full-finetune",  # transformers Trainer: "You cannot perform fine-tuning on purely quantized models"
        "quantized-offload-refused",  # transformers' bitsandbytes quantizer refuses the placement
        "device-map-distributed",  # accelerate prepare_model: device_map='auto' in a distributed mode
        "peft-refuses-config",  # peft raises on the LoRA config
        "lora-no-targets",  # peft: "Target modules ... not found"
        "fp16-gradscaler",  # torch GradScaler: "Attempting to unscale FP16 gradients"
        "layerwise-grad-accum",  # transformers: layer-wise GaLore refuses gradient accumulation
        "layerwise-distributed",  # transformers: layer-wise GaLore refuses DDP
        "deepspeed-trainer-mismatch",  # transformers' HfTrainerDeepSpeedConfig raises on the mismatch
        "precision-conflict",  # DeepSpeed config precision against the Trainer's
        "grpo-batch-refused",  # trl GRPOConfig.__post_init__ raises ValueError
        "trl-config-refused",  # a TRL config class's own validation raises
    }
)


class Severity(str, Enum):
    """How much a finding matters."""

    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    """One thing to tell the user.

    Attributes:
        code: Stable kebab-case identifier (e.g. ``"does-not-fit"``, ``"trainable-offloaded"``).
        severity: How much it matters.
        message: What is the matter, naming the file/flag and key where there is one.
        hint: What to change, in the user's own terms (flag, TrainingArguments field, DeepSpeed key).
    """

    code: str
    severity: Severity
    message: str
    hint: str = ""

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "message": self.message,
            "hint": self.hint,
        }
