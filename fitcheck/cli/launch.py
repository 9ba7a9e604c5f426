"""``fitcheck launch``: print the estimate for an ``accelerate launch`` command, then run it untouched.

Usage: ``fitcheck launch [--check-only] [--strict] [--json] [--gpu NAME | --gpu_memory SIZE]
[--trainer sft|dpo|grpo|reward] [--max_prompt_length N] [accelerate launch args] script.py [script args]``.
A framework's entry point is estimated from its YAML (``fitcheck.cli.launch_frameworks``):
``fitcheck launch [--check-only] [--num_processes N] axolotl train cfg.yml``,
``fitcheck launch [accelerate launch args] -m axolotl.cli.train cfg.yml``,
``fitcheck launch llamafactory-cli train cfg.yaml``.
A TRL script's trainer and config flags are read with TRL's own parser (``fitcheck.cli.launch_trl``).
See :mod:`fitcheck.integrations.accelerate_launch`.
Exit codes with ``--check-only``: 0 fits, 1 does not fit, 2 bad input. Otherwise the exit code is
``accelerate launch``'s; ``--strict`` refuses (exit 1) to launch a run that will not fit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fitcheck.cli.help_text import plain
from fitcheck.errors import FitcheckError, bounded_message

Launcher = Callable[[Sequence[str]], int]

HELP = """usage: fitcheck launch [fitcheck options] [accelerate launch options] script.py [script arguments]

Estimate the run an `accelerate launch` command starts (the script's TrainingArguments/TRL flags, accelerate's
flags and config file, DeepSpeed/FSDP configs), print the report, then run the command untouched.
fitcheck's options come first, before the training script: after it every token is the script's own.

fitcheck options:
  -h, --help                show this help and exit
  --check-only              print the estimate and exit without launching (exit 0 fits, 1 does not fit or an
                            error finding stands, 2 bad input or a run a library refuses)
  --strict                  do not launch a run that does not fit or has an error finding (exit 1)
  --json                    print the report as JSON
  --gpu NAME                the GPU (e.g. H100-80GB, A100-40GB, RTX4090-24GB; `fitcheck gpus` lists them)
  --gpu_memory SIZE         the per-GPU memory instead of a named GPU (e.g. 24GiB)
  --host_memory SIZE        host RAM per machine, for CPU offload (e.g. 512GiB)
  --model_name_or_path ID   the model, when the script's arguments do not name it
  --max_seq_length N        the sequence length, when the script's arguments do not give it
  --trainer sft|dpo|grpo|reward|kto
                            which TRL trainer the script runs (default: read from the script)
  --max_prompt_length N     the prompt length of a DPO/GRPO/KTO run (TRL 1.16 has no config field for it)

Without --check-only the exit code is `accelerate launch`'s. A run a library refuses (an [error] finding such
as quantized-full-finetune or device-map-distributed) is not launched (exit 2).
Run `accelerate launch --help` for accelerate's own options."""


def register(subparsers: Any) -> None:
    """Register ``fitcheck launch`` (its arguments are parsed by :func:`main`, accelerate's parser included)."""
    parser = subparsers.add_parser(
        "launch",
        help="estimate an `accelerate launch` command, then run it with its arguments untouched",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER,
                        help="[fitcheck flags] [accelerate launch args] script.py ...")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run from a parsed namespace (``argv`` holds everything after ``launch``)."""
    return main(list(args.argv))


def _print(report: Any, as_json: bool) -> None:
    from fitcheck.cli.advice_extras import advice_extras, extras_renderables, extras_to_json

    extras = advice_extras(report, mfu=None)
    if as_json:
        from fitcheck.render import report_to_dict

        out = report_to_dict(report)
        out.update(extras_to_json(extras))
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    from fitcheck.render import make_console, print_report

    print_report(report, make_console(), extra=extras_renderables(extras))


def main(
    argv: Sequence[str],
    *,
    launcher: Launcher | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """``fitcheck launch`` with the arguments after ``launch``.

    Args:
        argv: ``[fitcheck flags] [accelerate launch args] script.py [script args]``.
        launcher: Runs the accelerate command (default: exec it); tests pass a stub.
        env: Environment (default ``os.environ``).

    Returns:
        The exit code (with a real launch, exec replaces this process and the code is the child's).
    """
    import fitcheck.integrations as al

    environ = dict(os.environ if env is None else env)
    if list(argv)[:1] in (["-h"], ["--help"]):
        print(HELP)
        return 0
    from fitcheck.cli.launch_frameworks import split_framework_argv

    try:
        framework = split_framework_argv(argv)
    except FitcheckError as exc:
        print(f"fitcheck: error: {exc}", file=sys.stderr)
        return 2
    if framework is not None:
        return _framework_main(framework, environ, launcher)
    try:
        plan = al.split_argv(argv)
        from fitcheck.cli.launch_trl import TrlLaunchHook

        report = al.launch_report(plan, environ, TrlLaunchHook())
    except FitcheckError as exc:
        print(f"fitcheck: error: {bounded_message(str(exc))}", file=sys.stderr)
        return 2
    _print(report, plan.json)
    if plan.check_only:
        checked: int = report.exit_code  # the exit codes of `fitcheck estimate`
        return checked
    if report.refused:
        print("fitcheck: not launching a run that a library refuses (see the [error] findings above)",
              file=sys.stderr)
        return 2
    if plan.strict and report.exit_code:
        print("fitcheck: --strict: not launching a run that will not fit (see the report above)", file=sys.stderr)
        return 1
    cmd = al.accelerate_command(plan.accelerate_argv, environ)
    if launcher is not None:
        return launcher(cmd)
    code: int = al.exec_command(cmd)
    return code


def _framework_main(fw: Any, environ: dict[str, str], launcher: Launcher | None) -> int:
    """Estimate a framework's YAML (``axolotl train``, ``-m axolotl.cli.train``, ``llamafactory-cli train``),
    then run the command as given."""
    import dataclasses

    import fitcheck.integrations as al
    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core import estimate

    try:
        spec, assumptions = spec_from_values({fw.framework: fw.config, **fw.values}, environ, fw.overrides)
        report = estimate(spec)
    except FitcheckError as exc:
        print(f"fitcheck: error: {exc}", file=sys.stderr)
        return 2
    report = dataclasses.replace(report, assumptions=(*report.assumptions, *assumptions))
    _print(report, fw.json)
    if fw.check_only:
        return 0 if report.fits else 1
    if fw.strict and (not report.fits or bool(report.errors)):
        print("fitcheck: --strict: not launching a run that will not fit (see the report above)", file=sys.stderr)
        return 1
    cmd = al.accelerate_command(fw.command, environ) if fw.through_accelerate else list(fw.command)
    if launcher is not None:
        return launcher(cmd)
    code: int = al.exec_command(cmd)
    return code
