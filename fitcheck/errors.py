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

from collections.abc import Sequence


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
