"""Findings: what fitcheck wants the user to know, each with a stable code.

"Does not fit" is a finding, not an exception. Readers, the core and the adapters all produce them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


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
