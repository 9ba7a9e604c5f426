"""Errors raised by fitcheck.

Every user-facing error names the file (or flag), the key and the fix. The CLI turns any
:class:`FitcheckError` into a message on stderr and exit code 2; it never shows a traceback.

The tree::

    FitcheckError
     ├── ConfigError(ValueError)        a config file or flag is malformed, missing or inconsistent
     ├── UnsupportedModelError           the model cannot be resolved or has no inventory
     └── NotModelledError                a setting fitcheck cannot model yet (never silently defaulted)
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence

# The longest message the CLI prints for one error (characters): an error about a hostile value (a 5,000-digit
# version, a 200-byte YAML alias bomb) must not print or build something unbounded.
MAX_MESSAGE_CHARS = 2000

_SHORT = reprlib.Repr()
_SHORT.maxstring = 80
_SHORT.maxother = 80
_SHORT.maxlong = 40
_SHORT.maxlist = _SHORT.maxdict = _SHORT.maxtuple = _SHORT.maxset = 6
_SHORT.maxlevel = 3


def exception_line(exc: BaseException) -> str:
    """An exception as one short line for a finding: its type and the first line of its message (200 chars)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def short_repr(value: object) -> str:
    """``repr(value)`` bounded in length and depth (for error messages about user-supplied values).

    ``reprlib`` never walks more than a few items per level and a few levels, so a deeply nested or
    alias-expanded value costs no more to describe than a small one.
    """
    try:
        return _SHORT.repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def bounded_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... ({len(text) - limit:,} more characters)"


class FitcheckError(Exception):
    """Base class of every error fitcheck raises on purpose."""


class ConfigError(FitcheckError, ValueError):
    """One or more problems in the user's configuration.

    Args:
        problems: One message per problem. Each names the source (file or flag), the key and the fix.
    """

    def __init__(self, *problems: str) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("\n".join(self.problems) if self.problems else "invalid configuration")

    @classmethod
    def collect(cls, problems: Sequence[str]) -> ConfigError:
        """Build one error from several collected problems."""
        return cls(*problems)


class UnsupportedModelError(FitcheckError):
    """The model could not be resolved offline or its architecture cannot be inventoried."""


class NotModelledError(FitcheckError):
    """A setting that fitcheck does not model yet (for example an unknown optimizer)."""
