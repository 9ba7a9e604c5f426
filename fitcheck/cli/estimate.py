"""``fitcheck estimate``: per-GPU peak memory of one training step, from config.json, offline.

Flag names are those of ``transformers.TrainingArguments`` and TRL's ``ModelConfig``/``SFTConfig`` so users can
paste what they already pass to their training script (``-`` and ``_`` spellings both work, as in
HfArgumentParser). Booleans take an optional value: ``--bf16``, ``--bf16 true``, ``--gradient_checkpointing
false``. Only flags the user passed reach the readers, so files (``--training_args``, ``--deepspeed``,
``--config_file``) fill the rest and explicit flags win.

Semantics: ``--max_seq_length`` is the length of every sequence in the micro-batch (padded or packed to it:
the worst case a dataloader can produce). ``fits`` means ``device_used_bytes <= budget_bytes``, where the
budget is the GPU's memory (or ``--gpu_memory``) and ``device_used_bytes`` = peak reserved by the caching
allocator + CUDA context and library workspaces (what nvidia-smi would show).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fitcheck.cli.advice_extras import advice_extras, extras_renderables, extras_to_json
from fitcheck.cli.help_text import plain
from fitcheck.core.trainers import REFUSED
from fitcheck.errors import ConfigError
from fitcheck.findings import Finding
from fitcheck.report import Report
from fitcheck.spec import ModelInventory, TrainingSpec

if TYPE_CHECKING:
    from fitcheck.readers import FrameworkRun

FILE_FLAGS = ("training_args", "deepspeed", "config_file", "fsdp", "fsdp_config")
TASK_FLAGS = ("task", "num_labels", "image_tokens")  # read by readers/task_heads.py, not by the merge
LENGTH_FILES = ("training_args", "axolotl", "llamafactory")  # files that may set max_seq_length themselves


def meta_inventory(config: Mapping[str, object], model_id: str, source: str, task: str | None = None) -> ModelInventory:
    """``torch_adapters.meta_inventory``, imported only for a config that needs the meta device."""
    from fitcheck.torch_adapters import meta_inventory as build

    return build(config, model_id, source, task)


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every estimate flag to a parser (used by ``estimate`` and ``plot``).

    Unpassed flags are absent from the namespace (``argparse.SUPPRESS``), so readers can tell explicit values
    from defaults.
    """
    from fitcheck.readers import cli_flags

    for flag in cli_flags():
        kwargs: dict[str, Any] = {"dest": flag.name, "default": argparse.SUPPRESS, "help": plain(flag.help)}
        if flag.kind == "bool":
            kwargs.update(nargs="?", const=True, metavar="true|false")
        elif flag.kind == "list":
            kwargs.update(nargs="+")
        if flag.choices:
            kwargs.update(choices=list(flag.choices))
            shown = [c for c in flag.choices if c not in REFUSED]  # accepted only to be refused with the reason
            if len(shown) < len(flag.choices):
                kwargs.update(metavar="{" + ",".join(shown) + "}")
        parser.add_argument(*flag.spellings, **kwargs)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--brief", action="store_true",
        help="print only the verdict, the peak, the headroom and the best fix (at most 8 lines)",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="trace one training step of the real model on fake tensors for activations (needs torch); "
        "by default runs outside the formulas' checked envelope are traced when torch is installed",
    )
    parser.add_argument(
        "--no_trace",
        "--no-trace",
        dest="no_trace",
        action="store_true",
        help="never trace: answer from the formulas (a not-pinned warning outside the checked envelope)",
    )
    parser.add_argument(
        "--no_cache",
        "--no-cache",
        dest="no_cache",
        action="store_true",
        help="neither read nor write fitcheck's cache of traces and allocator replays ($FITCHECK_CACHE_DIR, else "
        "$XDG_CACHE_HOME/fitcheck, else ~/.cache/fitcheck; FITCHECK_CACHE_DIR=off turns it off for good)",
    )
    parser.add_argument(
        "--reserved_replay",
        "--reserved-replay",
        dest="reserved_replay",
        action="store_true",
        help="replay the whole run (every layer, the optimizer, warm-up steps) through torch's caching allocator "
        "for the reserved figure even where the answer comes from the checked formulas (needs torch; a traced "
        "answer replays it by default, a formula answer keeps a published 11 %% gap)",
    )
    parser.add_argument(
        "--mfu", type=_mfu, default=None, metavar="FRACTION",
        help="assumed model FLOPs utilisation for timing, a number in (0, 1] such as 0.4",
    )
    parser.add_argument("--plot", default=None, metavar="FILE", help="also draw the memory plot (PNG or SVG)")


def _mfu(text: str) -> float:
    """``--mfu``: a fraction in (0, 1] (argparse reports the ValueError as a bad value for --mfu, exit 2)."""
    value = float(text) if len(text) <= 32 else float("nan")
    if not 0.0 < value <= 1.0:  # also false for nan
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1] such as 0.4, got {text[:32]!r}")
    return value


def register(subparsers: Any) -> None:
    """Register ``fitcheck estimate``."""
    parser = subparsers.add_parser(
        "estimate",
        help="estimate per-GPU peak memory of one training step",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_estimate_arguments(parser)
    parser.set_defaults(func=run)


def explicit_values(args: argparse.Namespace) -> dict[str, object]:
    """The flags the user passed, by canonical name."""
    from fitcheck.readers import cli_flags

    names = {flag.name for flag in cli_flags()}
    return {k: v for k, v in vars(args).items() if k in names}


def spec_from_values(
    values: Mapping[str, object], env: Mapping[str, str], framework_overrides: Mapping[str, object] | None = None
) -> tuple[TrainingSpec, tuple[str, ...]]:
    """Build the spec from explicit flag values (plus the files they name).

    Args:
        values: Explicit flags, canonical names.
        env: Environment (for the HF cache and accelerate's default config location).
        framework_overrides: Keys of an ``--axolotl``/``--llamafactory`` file given on the framework's own
            command line.

    Returns:
        The spec and the assumptions made.

    Raises:
        FitcheckError: Bad input (exit 2).
    """
    from fitcheck.readers import load_inventory, merge_sources, spec_from_settings

    values, framework = framework_values(values, os.getcwd(), framework_overrides)
    from fitcheck.integrations import with_cpu_budget

    values = dict(values)
    cpu_note = with_cpu_budget(values)
    model = values.get("model_name_or_path")
    if not model:
        raise ConfigError(
            "--model_name_or_path is required: a Hub id such as meta-llama/Meta-Llama-3-8B, a directory with "
            "config.json, or a config.json path"
        )
    from fitcheck.readers import resolve_image_tokens, spec_for_task

    inventory = load_inventory(
        str(model), env=env, meta_fallback=meta_inventory, task=_opt_str(values.get("task")),
        num_labels=_opt_int(values.get("num_labels")),
    )
    inventory = resolve_image_tokens(inventory, values.get("image_tokens"))
    if framework is not None:
        from fitcheck.readers import resolve_freeze

        values = resolve_freeze(values, inventory.shape.num_layers)
    length_note = _lengths_set_max(values)
    cli = {k: v for k, v in values.items()
           if (k not in FILE_FLAGS or k == "fsdp_config") and k not in TASK_FLAGS and k != "seq_lengths"}
    alloc_conf = env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF")
    if alloc_conf and "cuda_alloc_conf" not in cli:  # the caching allocator's settings of the launching shell
        cli["cuda_alloc_conf"] = alloc_conf
    merged = merge_sources(
        cli,
        training_args_file=_opt_str(values.get("training_args")),
        deepspeed_file=_opt_str(values.get("deepspeed")),
        accelerate_config_file=_opt_str(values.get("config_file")),
        fsdp=_opt_str(values.get("fsdp")),
        env=env,
        hidden_size=inventory.shape.hidden_size,
        where_read=framework.where if framework is not None else None,
    )
    settings = merged.settings
    if cpu_note is None and settings.device_type.value == "cpu" and settings.gpu is None \
            and settings.gpu_memory is None and settings.host_memory is None:  # CPU from a file (accelerate use_cpu)
        from fitcheck.integrations import machine_ram_bytes

        ram = machine_ram_bytes()
        if ram is not None:
            settings = dataclasses.replace(settings, host_memory=ram)
            cpu_note = f"CPU run with no --host_memory: the budget is this machine's RAM, {ram / 2**30:.2f} GiB"
    spec, assumptions = spec_from_settings(
        settings, inventory=inventory, sharding=merged.sharding, findings=merged.findings
    )
    if "adapter_config" in values:
        from fitcheck.readers import read_adapter_config
        from fitcheck.spec import LoraSpec

        adapter = read_adapter_config(str(values["adapter_config"]))  # LoRA, or another PEFT method (spec.peft)
        spec = dataclasses.replace(spec, lora=adapter if isinstance(adapter, LoraSpec) else None,
                                   peft=None if isinstance(adapter, LoraSpec) else adapter)
    spec = spec_for_task(spec)
    from fitcheck.readers import TRL_FLAG_NAMES
    from fitcheck.torch_adapters import check_trl_config

    # TRL's own config class validates its fields (when TRL is installed)
    check_trl_config(spec, {k: v for k, v in values.items() if k in TRL_FLAG_NAMES})
    notes = tuple(n for n in (cpu_note, length_note) if n)
    if framework is None:
        return spec, (*assumptions, *notes)
    spec = dataclasses.replace(spec, findings=(*spec.findings, *framework.findings))
    return spec, (*assumptions, *framework.notes, *notes)


def _lengths_set_max(values: dict[str, object]) -> str | None:
    """With ``--seq_lengths`` and no ``--max_seq_length`` (nor a file that may give it), the longest of the
    lengths is the run's ``max_seq_length``; returns the assumption said, or None."""
    if "seq_lengths" not in values or "max_seq_length" in values or any(f in values for f in LENGTH_FILES):
        return None
    from fitcheck.readers import parse_seq_lengths

    longest = max(parse_seq_lengths(str(values["seq_lengths"])))
    values["max_seq_length"] = longest
    return f"max_seq_length {longest}: the longest of --seq_lengths (pass --max_seq_length to set it)"


def framework_values(
    values: Mapping[str, object], cwd: str, overrides: Mapping[str, object] | None = None
) -> tuple[dict[str, object], FrameworkRun | None]:
    """The flags with an ``--axolotl`` / ``--llamafactory`` file's settings under them (flags given win).

    Args:
        values: Explicit flags, canonical names.
        cwd: Working directory (where the frameworks open the files a config names).
        overrides: Framework keys given on the framework's own command line (``fitcheck launch``).

    Returns:
        The combined values and the framework read (None without a framework file); its ``where`` says where
        each value that no flag gave was read.

    Raises:
        ConfigError: Both files given, or what the framework reader refuses.
    """
    given = [k for k in ("axolotl", "llamafactory") if values.get(k)]
    rest = {k: v for k, v in values.items() if k not in ("axolotl", "llamafactory")}
    if not given:
        return rest, None
    if len(given) > 1:
        raise ConfigError("--axolotl and --llamafactory are both given; pass the config of the framework you run")
    from fitcheck.readers import read_axolotl, read_llamafactory

    reader = read_axolotl if given[0] == "axolotl" else read_llamafactory
    run = reader(str(values[given[0]]), cwd=cwd, overrides=overrides)
    where = {k: w for k, w in run.where.items() if k not in rest}
    combined = {**run.values, **rest}
    return combined, dataclasses.replace(run, where=where)


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def _opt_int(v: object) -> int | None:
    if v is None:
        return None
    try:
        return int(str(v))
    except ValueError:
        raise ConfigError(f"expected an integer, got {v!r}") from None


def spec_from_args(args: argparse.Namespace) -> tuple[TrainingSpec, tuple[str, ...]]:
    """Build the spec from a parsed namespace (reads the process environment: CLI boundary)."""
    return spec_from_values(explicit_values(args), dict(os.environ))


def build_report(
    args: argparse.Namespace,
) -> tuple[Report, dict[str, object]]:
    """Estimate for parsed flags: the report (with device-map findings) and the advisor/compute extras."""
    spec, assumptions = spec_from_args(args)
    from fitcheck.torch_adapters import PinnedPath

    if args.trace and getattr(args, "no_trace", False):
        raise ConfigError("--trace and --no_trace contradict each other; pass one of them")
    lengths: tuple[int, ...] = ()
    if getattr(args, "seq_lengths", None):
        from fitcheck.readers import check_seq_lengths, parse_seq_lengths

        if getattr(args, "no_trace", False):
            raise ConfigError("--seq_lengths replays the traced step through the caching allocator and --no_trace "
                              "forbids tracing: drop one of them")
        lengths = parse_seq_lengths(str(args.seq_lengths))
        check_seq_lengths(lengths, spec.batch.seq_len)
    replay_all = bool(getattr(args, "reserved_replay", False))
    if replay_all and (getattr(args, "no_trace", False) or lengths):
        raise ConfigError("--reserved_replay traces the whole run for the caching allocator: it cannot be combined "
                          f"with {'--no_trace' if getattr(args, 'no_trace', False) else '--seq_lengths'}; drop one")
    path = PinnedPath("always" if args.trace else "never" if getattr(args, "no_trace", False) else "auto",
                      seq_lengths=lengths, reserved_replay=replay_all, cache=_trace_cache(args))
    extra_findings: tuple[Finding, ...] = ()
    if getattr(args, "device_map", None):
        from fitcheck.torch_adapters import device_map_findings

        extra_findings = device_map_findings(spec, str(args.device_map), getattr(args, "max_memory", None))
    if extra_findings:
        spec = dataclasses.replace(spec, findings=(*spec.findings, *extra_findings))
    report = path(spec)
    gpus: tuple[Any, ...] = ()
    if getattr(args, "device_map", None):
        from fitcheck.advice import weights_only_finding
        from fitcheck.torch_adapters import multi_gpu_shares

        gpus = multi_gpu_shares(spec, str(args.device_map), getattr(args, "max_memory", None))
        if gpus:
            report = _busiest_gpu_report(report, gpus)
        note = weights_only_finding(report, str(args.device_map)) if not gpus else None
        if note is not None:
            report = dataclasses.replace(report, findings=(*report.findings, note))
    report = dataclasses.replace(report, assumptions=(*report.assumptions, *assumptions))
    extras = advice_extras(report, mfu=args.mfu, estimate_fn=path.following(report),
                           device_map=getattr(args, "device_map", None))
    if gpus:
        extras["device_map_gpus"] = [g.to_dict() for g in gpus]
    return report, extras


def _trace_cache(args: argparse.Namespace) -> Any:
    """fitcheck's on-disk cache of traces and replays (``torch_adapters.trace_cache``) for these flags: None with
    ``--no_cache`` or ``FITCHECK_CACHE_DIR=off`` (reads the process environment: CLI boundary)."""
    if getattr(args, "no_cache", False):
        return None
    from fitcheck.torch_adapters import cache_from_environment

    return cache_from_environment(os.environ)


def _busiest_gpu_report(whole: Report, gpus: tuple[Any, ...]) -> Report:
    """The headline report of a multi-GPU device map: the busiest GPU's, with the whole model's counts and
    findings, and a verdict that needs every GPU to fit (advice/device_map_gpus.py)."""
    from fitcheck.advice import busiest
    from fitcheck.core.activations import in_envelope, not_pinned_finding
    from fitcheck.findings import Severity
    from fitcheck.units import format_bytes

    top = busiest(gpus)
    lines = ", ".join(
        f"GPU {g.device} (layers {min(g.layers)}-{max(g.layers)}{', head' if g.holds_head else ''}): "
        f"{format_bytes(g.report.device_used_bytes)} of {format_bytes(g.report.budget_bytes)}"
        if g.layers else f"GPU {g.device}: {format_bytes(g.report.device_used_bytes)}"
        for g in gpus
    )
    note = Finding(
        "device-map-per-gpu",
        Severity.INFO,
        f"naive model parallelism over {len(gpus)} GPUs: {lines}; the headline numbers are GPU {top.device}'s",
    )
    keep = [f for f in whole.findings if f.code not in ("fits", "does-not-fit")]
    verdict = [f for f in top.report.findings if f.code in ("fits", "does-not-fit")]
    # pinned as the whole run's answer says (the per-GPU estimates take the formula's activations as given, which
    # would read as traced); a traced whole run does not pin the per-GPU formula split outside the envelope
    pinned = whole.pinned
    if pinned and any(c.name == "activations.traced" for c in whole.components) and not in_envelope(whole.spec):
        pinned = False
        keep.append(not_pinned_finding(whole.spec))
    return dataclasses.replace(
        top.report,
        findings=(*keep, note, *verdict),
        pinned=pinned,
        fits=all(g.report.fits for g in gpus),
        total_params=whole.total_params,
        trainable_params=whole.trainable_params,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``fitcheck estimate``; exit 0 fits, 1 does not fit or an error finding stands, 2 a library refuses
    the run (``Report.exit_code``; bad input is raised as FitcheckError, exit 2)."""
    from fitcheck.render import report_to_dict

    report, extras = build_report(args)
    if args.plot:
        from fitcheck.render import plot_report

        plot_report(report, args.plot)
    if args.json:
        out = report_to_dict(report)
        out.update(extras_to_json(extras))
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif getattr(args, "brief", False):
        from fitcheck.render import brief_lines

        lines = brief_lines(report, extras["suggestions"], extras["max_micro_batch"],  # type: ignore[arg-type]
                            extras.get("max_micro_batch_if_reserved_high"))
        sys.stdout.write("\n".join(lines) + "\n")
    else:
        from fitcheck.render import make_console, print_report

        print_report(report, make_console(), extra=extras_renderables(extras))
    return report.exit_code
