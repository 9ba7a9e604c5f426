"""``fitcheck`` command line: argparse subcommands, one module each (``register`` + ``run``).

Exit codes: 0 the run fits, 1 it does not fit, 2 bad input (a message on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from fitcheck.errors import FitcheckError


def _subcommands() -> list[ModuleType]:
    from fitcheck.cli import estimate, launch, plot

    return [estimate, launch, plot]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="fitcheck",
        description="Will this training run fit on these GPUs, and if not, what should I change?",
    )
    sub = parser.add_subparsers(dest="command", metavar="{estimate,launch,plot}")
    sub.required = True
    for module in _subcommands():
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "launch":
        # launch passes everything after its own flags through to accelerate untouched.
        from fitcheck.cli import launch

        return launch.main(args_list[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse: bad flags -> exit 2 (its own message already printed)
        return 2 if exc.code not in (0, None) else 0
    try:
        code: int = args.func(args)
    except FitcheckError as exc:
        print(f"fitcheck: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
