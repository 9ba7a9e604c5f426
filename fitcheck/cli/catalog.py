"""``fitcheck models`` and ``fitcheck gpus``: what the built-in catalog knows, with "did you mean" on a typo.

``fitcheck models [TEXT]`` lists the Hub ids whose ``config.json`` ships with fitcheck (estimated offline);
``fitcheck gpus [TEXT]`` lists the GPU table (memory as torch reports it, dense bf16 peak). With TEXT only
the entries containing it are listed; when none does, the closest names are suggested and the exit code is 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fitcheck.cli.help_text import plain


def register(subparsers: Any) -> None:
    """Register ``fitcheck models`` and ``fitcheck gpus``."""
    models = subparsers.add_parser(
        "models", help="list the models of the built-in catalog (estimated offline, no download)",
        description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    models.add_argument("text", nargs="?", default=None, help="list only ids containing this text")
    models.set_defaults(func=run_models)
    gpus = subparsers.add_parser(
        "gpus", help="list the GPU table: memory and bf16 peak per card, with sources",
        description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gpus.add_argument("text", nargs="?", default=None, help="list only GPUs whose name or alias contains this")
    gpus.add_argument("--sources", action="store_true", help="also print where each number comes from")
    gpus.set_defaults(func=run_gpus)


def _norm(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def run_models(args: argparse.Namespace) -> int:
    """Print the catalog ids (filtered by ``text``); 2 with suggestions when nothing matches."""
    from fitcheck.catalog import catalog_ids, similar_catalog_ids

    ids = catalog_ids()
    text = args.text
    shown = [i for i in ids if text is None or _norm(text) in _norm(i)]
    if not shown:
        close = similar_catalog_ids(text)
        mean = f"; did you mean {' or '.join(close)}?" if close else ""
        print(f"fitcheck models: no catalog model matches {text[:80]!r}{mean} (a local config.json directory or "
              "a model in the Hugging Face cache works too)", file=sys.stderr)
        return 2
    sys.stdout.write("\n".join(shown) + "\n")
    return 0


def run_gpus(args: argparse.Namespace) -> int:
    """Print the GPU table (filtered by ``text``); 2 with suggestions when nothing matches."""
    from fitcheck.catalog import known_gpus, similar_gpus

    text = args.text
    rows = [g for g in known_gpus()
            if text is None or any(_norm(text) in _norm(n) for n in (g.name, *g.aliases))]
    if not rows:
        close = similar_gpus(text)
        mean = f"; did you mean {' or '.join(close)}?" if close else ""
        print(f"fitcheck gpus: no GPU matches {text[:80]!r}{mean} (for another card pass --gpu_memory SIZE)",
              file=sys.stderr)
        return 2
    width = max(len(g.name) for g in rows)
    for g in rows:
        peak = f"{g.peak_tflops_bf16:g} TFLOP/s bf16" if g.peak_tflops_bf16 else "no bf16"
        sys.stdout.write(f"{g.name:<{width}}  {g.memory_bytes / 2**30:7.2f} GiB  {peak}\n")
        if args.sources:
            sys.stdout.write(f"    {g.source}\n")
    return 0
