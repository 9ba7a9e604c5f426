"""``fitcheck`` command line: argparse subcommands, one module each (``register`` + ``run``).

Exit codes: 0 the run fits, 1 it does not fit (or an error finding stands), 2 bad input or a run a library
refuses (a message on stderr, never a traceback). Any exception that escapes a subcommand is caught here as a
last resort and answered with exit 2 and a bounded message: exit 1 keeps meaning "does not fit".
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator, Sequence
from types import ModuleType

from fitcheck.errors import FitcheckError, bounded_message

# subcommand -> the module under fitcheck.cli that registers it, in the order ``fitcheck --help`` lists them
_REGISTERED_BY = {"estimate": "estimate", "launch": "launch", "plot": "plot", "models": "catalog", "gpus": "catalog"}


def _subcommands(command: str | None = None) -> list[ModuleType]:
    """The modules that register ``command`` (only its own), or every subcommand's where it is none of them."""
    names = [_REGISTERED_BY[command]] if command in _REGISTERED_BY else list(dict.fromkeys(_REGISTERED_BY.values()))
    return [importlib.import_module(f"fitcheck.cli.{name}") for name in names]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered, or only ``command``'s.

    Args:
        command: The first word of a command line. When it names a subcommand, only that one is registered:
            argparse hands everything after it to that subparser alone, so parsing, ``--help`` and every error
            message are those of the full parser, without building (and importing) the others' arguments
            (``plot`` repeats all of ``estimate``'s: half of the parser's cost for a formula answer). Anything
            else (None, ``--help``, a typo) gets every subcommand, for the top-level help and "invalid choice".
    """
    parser = argparse.ArgumentParser(
        prog="fitcheck",
        description="Will this training run fit on these GPUs, and if not, what should I change?",
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(_REGISTERED_BY) + "}")
    sub.required = True
    for module in _subcommands(command):
        module.register(sub)
    return parser


@functools.cache
def _parser(command: str | None, _handlers: tuple[object, ...]) -> argparse.ArgumentParser:
    """One parser per command and set of subcommand handlers, for :func:`main`: building it is a few ms of argparse
    (2.4 ms for ``estimate`` alone, 4.6 ms with every subcommand, measured after the imports on the 2-core
    development machine: each ``add_argument`` formats its metavar with a new ``HelpFormatter``), and nothing in it
    depends on the call: ``parse_args`` leaves the parser as it was (a new ``Namespace`` each time) and ``--help``
    formats with the terminal's width at that moment. A process that calls ``main`` many times (tests, integrations, the
    hostile-input driver) pays it once. The key is every subcommand's ``register`` and ``run*`` function, so a
    caller that replaces one (a test's monkeypatch) gets a parser built with it, as before. ``command``: as in
    :func:`build_parser` (a subcommand's name, else None)."""
    return build_parser(command)


def _handlers(command: str | None) -> tuple[object, ...]:
    return tuple(f for m in _subcommands(command) for name, f in sorted(vars(m).items())
                 if callable(f) and (name == "register" or name.startswith("run")))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        with quiet_third_parties():
            return _dispatch(args_list)
    except FitcheckError as exc:
        print(f"fitcheck: error: {bounded_message(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (`fitcheck ... | head`): no message, no traceback
        _silence_stdout()
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe
    except KeyboardInterrupt:
        print("fitcheck: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return last_resort(exc)


# Loggers of libraries fitcheck runs (tracing, meta-device builds) that print to stderr on their own: the report
# says what matters. bitsandbytes 0.50 backends/cpu/ops.py warns "Failed to load CPU gemm_4bit_forward from
# kernels-community" on import on CPUs with AVX512-BF16; transformers/peft/accelerate log load-time notes.
_QUIET_LOGGERS = ("bitsandbytes", "transformers", "peft", "accelerate", "torch", "trl", "deepspeed", "datasets")


@contextlib.contextmanager
def quiet_third_parties() -> Iterator[None]:
    """Silence other libraries' warnings and log records below ERROR for one CLI run (restored afterwards)."""
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft RuntimeWarnings, torch UserWarnings, transformers FutureWarnings
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def _silence_stdout() -> None:
    import os

    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def last_resort(exc: BaseException) -> int:
    """Answer an exception nothing else caught: exit 2 with a bounded one-line message, never a traceback."""
    text = bounded_message(f"{type(exc).__name__}: {exc}", 500)
    print(
        f"fitcheck: error: unexpected failure on this input ({text}). Check the flags and files given; if they "
        "are right, please report this with the command line",
        file=sys.stderr,
    )
    return 2


def _dispatch(args_list: list[str]) -> int:
    if args_list and args_list[0] == "launch":
        # launch passes everything after its own flags through to accelerate untouched.
        from fitcheck.cli import launch

        return launch.main(args_list[1:])
    command = args_list[0] if args_list and args_list[0] in _REGISTERED_BY else None
    parser = _parser(command, _handlers(command))
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse: bad flags -> exit 2 (its own message already printed)
        return 2 if exc.code not in (0, None) else 0
    code: int = args.func(args)
    return code


# Libraries whose interpreter teardown (module and object finalisation, not their atexit handlers) costs seconds:
# after a traced answer that imported torch, transformers and peft, exiting through ``sys.exit`` took 3.4-3.5 CPU-s
# more than ``os._exit`` after the atexit handlers (0.02 CPU-s), measured on the 2-core development machine.
_SLOW_TEARDOWN = ("torch",)


def console() -> None:
    """The ``fitcheck`` console script: :func:`main`, then exit without the interpreter's slow teardown.

    When a run imported torch (a traced answer), the atexit handlers run (logging's flush, the libraries' own
    clean-ups), stdout and stderr are flushed, and the process ends with ``os._exit``. Everything fitcheck writes
    (the report, the trace cache) is written and closed inside :func:`main`. Otherwise this is ``sys.exit(main())``.
    """
    code = main()
    if not any(name in sys.modules for name in _SLOW_TEARDOWN):
        sys.exit(code)
    import atexit
    import os

    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)  # CPython's own; absent elsewhere: skip the shortcut
    if run_exitfuncs is None:
        sys.exit(code)
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    console()
