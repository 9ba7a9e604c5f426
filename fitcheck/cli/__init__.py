"""The ``fitcheck`` command: one module per subcommand (``estimate``, ``launch``, ``plot``), wired in :mod:`.main`.

Exit codes: 0 the run fits, 1 it does not, 2 bad input.

The surface (for scripts that drive the CLI in-process, e.g. ``benchmarks/``) is imported lazily (PEP 562), so
``python -m fitcheck.cli.main`` does not import its own module twice:

* :func:`cli_main` — ``fitcheck.cli.main.main`` (argv in, exit code out);
* :func:`add_estimate_arguments`, :func:`explicit_values`, :func:`spec_from_values` — the ``estimate``
  subcommand's parser, the values a user gave, and the spec they build (``fitcheck.cli.estimate``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fitcheck.cli.estimate import add_estimate_arguments, explicit_values, spec_from_args, spec_from_values
    from fitcheck.cli.main import build_parser
    from fitcheck.cli.main import main as cli_main

_WHERE = {
    "add_estimate_arguments": ("estimate", "add_estimate_arguments"),
    "explicit_values": ("estimate", "explicit_values"),
    "spec_from_values": ("estimate", "spec_from_values"),
    "spec_from_args": ("estimate", "spec_from_args"),
    "build_parser": ("main", "build_parser"),
    "cli_main": ("main", "main"),
}

__all__ = ["add_estimate_arguments", "build_parser", "cli_main", "explicit_values", "spec_from_args",
           "spec_from_values"]


def __getattr__(name: str) -> Any:
    """Import the subcommand module that defines ``name`` on first use."""
    if name in _WHERE:
        module, attr = _WHERE[name]
        return getattr(importlib.import_module(f"fitcheck.cli.{module}"), attr)
    raise AttributeError(f"module 'fitcheck.cli' has no attribute {name!r}")
