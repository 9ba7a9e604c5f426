"""``fitcheck plot``: the memory picture of a run (same flags as ``fitcheck estimate``) to PNG or SVG.

Draws device memory vs micro-batch and vs sequence length with the GPU's capacity line, and the component
stack at the run's own setting (``fitcheck.render.plot``). Exit codes as ``estimate``: 0 fits, 1 does not
fit, 2 bad input (including matplotlib missing: install ``fitcheck[plot]``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fitcheck.cli.help_text import plain


def register(subparsers: Any) -> None:
    """Register ``fitcheck plot``."""
    from fitcheck.cli.estimate import add_estimate_arguments

    parser = subparsers.add_parser(
        "plot",
        help="draw peak memory vs micro-batch and sequence length, and what fills it (PNG or SVG)",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_estimate_arguments(parser)
    parser.add_argument("--output", "-o", required=True, metavar="FILE", help="FILE.png or FILE.svg")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Estimate the run (as ``fitcheck estimate`` does), draw the figure; 0 fits, 1 does not fit."""
    from fitcheck.cli.estimate import build_report
    from fitcheck.render import plot_report

    report, extras = build_report(args)
    max_fit = extras.get("max_micro_batch")
    path = plot_report(report, args.output, max_fit=max_fit if isinstance(max_fit, int) else None)
    verdict = "fits" if report.fits else "does not fit"
    sys.stdout.write(f"wrote {path} ({verdict}; curves from the formula estimate)\n")
    return report.exit_code
