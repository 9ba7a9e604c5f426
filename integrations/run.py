"""Zero-code hook: ``python -m fitcheck.run [--strict] [--record FILE] [--max_seq_length N] script.py [args]``.

Adds a :class:`~fitcheck.integrations.trainer.FitcheckCallback` to every ``transformers.Trainer`` (and
subclass: TRL's trainers call ``Trainer.__init__``) the script builds, then runs the script as ``__main__``
with its own arguments (``runpy``), so a script needs no change. Under accelerate every rank runs it:
``accelerate launch -m fitcheck.run train.py ...``; the report prints on the main process only. ``-m module``
runs a module instead of a file.

Options may also come from the environment (useful with launchers): ``FITCHECK_STRICT=1``,
``FITCHECK_RECORD=path``, ``FITCHECK_MAX_SEQ_LENGTH=n``, ``FITCHECK_GPU=name``.
"""

from __future__ import annotations

import functools
import inspect
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from typing import Any

_OPTIONS = {"--record": "record_path", "--max_seq_length": "max_seq_length", "--gpu": "gpu",
            "--gpu_memory": "gpu_memory"}
USAGE = "usage: python -m fitcheck.run [--strict] [--record FILE] [--max_seq_length N] (script.py | -m module) [args]"


def callback_options(argv: Sequence[str], env: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Split fitcheck's leading options from the script command line.

    Returns:
        ``FitcheckCallback`` keyword arguments, and the rest (``script.py args`` or ``-m module args``).
    """
    opts: dict[str, Any] = {}
    if env.get("FITCHECK_STRICT", "").lower() in ("1", "true", "yes"):
        opts["strict"] = True
    for var, key in (("FITCHECK_RECORD", "record_path"), ("FITCHECK_MAX_SEQ_LENGTH", "max_seq_length"),
                     ("FITCHECK_GPU", "gpu")):
        if env.get(var):
            opts[key] = env[var]
    rest = list(argv)
    while rest:
        head = rest[0]
        name, eq, inline = head.partition("=")
        if head == "--strict":
            opts["strict"] = True
            rest = rest[1:]
        elif name in _OPTIONS and (eq or len(rest) > 1):
            opts[_OPTIONS[name]] = inline if eq else rest[1]
            rest = rest[1:] if eq else rest[2:]
        else:
            break
    if "max_seq_length" in opts:
        opts["max_seq_length"] = int(opts["max_seq_length"])
    return opts, rest


def install(**callback_kwargs: Any) -> None:
    """Make every Trainer built from now on carry a FitcheckCallback (unless it already has one)."""
    from fitcheck.integrations.trainer import FitcheckCallback
    from transformers import Trainer

    original = Trainer.__init__
    if getattr(original, "_fitcheck_wrapped", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)
        callbacks = list(bound.arguments.get("callbacks") or [])
        if not any(isinstance(c, FitcheckCallback) or c is FitcheckCallback for c in callbacks):
            callbacks.append(FitcheckCallback(**callback_kwargs))
        bound.arguments["callbacks"] = callbacks
        original(*bound.args, **bound.kwargs)

    __init__._fitcheck_wrapped = True  # type: ignore[attr-defined]
    Trainer.__init__ = __init__  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> int:
    """Install the hook and run the script or module with its own arguments."""
    opts, rest = callback_options(list(sys.argv[1:] if argv is None else argv), os.environ)
    if not rest or rest[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or ""), file=sys.stderr)
        return 0 if rest else 2
    install(**opts)
    if rest[0] == "-m":
        if len(rest) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(rest)
        sys.path.insert(0, os.path.dirname(os.path.abspath(rest[0])))
        runpy.run_path(rest[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
