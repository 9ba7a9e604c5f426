"""``fitcheck launch``: estimate an ``accelerate launch`` command, then run it with its arguments untouched.

``fitcheck launch [fitcheck flags] [accelerate launch args] script.py [script args]``

* fitcheck's own flags come first: ``--check-only``, ``--strict``, ``--json``, and what a script's flags may
  not say (``--gpu``, ``--gpu_memory``, ``--host_memory``, ``--model_name_or_path``, ``--max_seq_length``).
  The boolean ones are also recognised among the accelerate flags before the script.
* The accelerate arguments are parsed by accelerate's own ``launch_command_parser()``
  (accelerate/commands/launch.py; it accepts ``-`` and ``_`` spellings and records explicit flags in
  ``nondefault``) and validated by its ``_validate_launch_command`` when this accelerate has it (a private
  name: used only if present, on a copy). The config file (``--config_file``, else accelerate's default
  location when it exists and ``--cpu`` is not given, as ``_validate_launch_command`` does) is read by
  fitcheck's accelerate reader, and explicit flags win over it, as in accelerate.
* The script's arguments are read as TrainingArguments/TRL flags; its other flags are passed over.
* Then ``accelerate launch`` runs with exactly the arguments given (``os.execvp``: its exit code is the
  child's). ``--check-only`` stops after the report (exit 0 fits / 1 does not fit / 2 bad input);
  ``--strict`` refuses to launch a run that will not fit.
"""

from __future__ import annotations

import argparse
import copy
import io
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from typing import Any

from fitcheck.integrations.launch_plan import started_processes, unknown_flags_finding, with_cpu_budget

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.torch_adapters import meta_inventory

BOOL_FLAGS = {"--check-only": "check_only", "--check_only": "check_only", "--strict": "strict", "--json": "json"}
VALUE_FLAGS = {
    "--gpu": "gpu",
    "--gpu_memory": "gpu_memory",
    "--gpu-memory": "gpu_memory",
    "--host_memory": "host_memory",
    "--host-memory": "host_memory",
    "--model_name_or_path": "model_name_or_path",
    "--model-name-or-path": "model_name_or_path",
    "--max_seq_length": "max_seq_length",
    "--max-seq-length": "max_seq_length",
    # a TRL script (fitcheck.cli.launch_trl): which trainer, and the prompt length TRL has no config field for
    "--trainer": "trainer",
    "--max_prompt_length": "max_prompt_length",
}
# accelerate launch flag (dest) -> fitcheck value name, for explicitly passed flags (launch.py argument names).
_DIRECT = {
    "num_processes": "num_processes",
    "num_machines": "num_machines",
    "zero_stage": "zero_stage",
    "offload_optimizer_device": "offload_optimizer",
    "offload_param_device": "offload_param",
    "deepspeed_config_file": "deepspeed",
}
# accelerate launch --parallelism_config_<name> (commands/launch.py parallelism_config_args); exported to the
# PARALLELISM_CONFIG_* environment only with --use_parallelism_config (utils/launch.py).
_PARALLELISM = {
    f"parallelism_config_{k}": k
    for k in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "sp_backend", "cp_comm_strategy")
}
_FSDP_FLAGS = (
    "fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_offload_params",
    "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
    "fsdp_use_orig_params", "fsdp_activation_checkpointing", "fsdp_cpu_ram_efficient_loading",
)


@dataclass
class LaunchPlan:
    """A ``fitcheck launch`` command line, split.

    Attributes:
        accelerate_argv: Everything that goes after ``accelerate launch``, exactly as given.
        check_only: Stop after the report.
        strict: Refuse to launch a run that does not fit.
        json: Print the report as JSON.
        values: fitcheck's own value flags (``gpu``, ``model_name_or_path`` ...).
    """

    accelerate_argv: list[str]
    check_only: bool = False
    strict: bool = False
    json: bool = False
    values: dict[str, object] = field(default_factory=dict)


def _launch_parser() -> argparse.ArgumentParser:
    from accelerate.commands.launch import launch_command_parser

    parser: argparse.ArgumentParser = launch_command_parser()
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str], known: bool) -> Any:
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stderr(err), redirect_stdout(out):
            return parser.parse_known_args(list(argv)) if known else parser.parse_args(list(argv))
    except SystemExit:
        msg = (err.getvalue().strip().splitlines() or ["invalid arguments"])[-1]
        raise ConfigError(f"accelerate launch arguments: {msg}") from None


def split_argv(argv: Sequence[str]) -> LaunchPlan:
    """Separate fitcheck's flags from the ``accelerate launch`` command line (which is kept verbatim).

    Raises:
        ConfigError: A fitcheck flag without its value, or no training script.
    """
    tokens = list(argv)
    plan = LaunchPlan(accelerate_argv=[])
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        name, eq, inline = tok.partition("=")
        if tok in BOOL_FLAGS:
            setattr(plan, BOOL_FLAGS[tok], True)
            i += 1
        elif name in VALUE_FLAGS:
            if eq:
                plan.values[VALUE_FLAGS[name]] = inline
                i += 1
            elif i + 1 < len(tokens):
                plan.values[VALUE_FLAGS[name]] = tokens[i + 1]
                i += 2
            else:
                raise ConfigError(f"fitcheck launch {name}: expects a value")
        else:
            break
    rest = tokens[i:]
    if rest == [] or (rest[0] == "--" and len(rest) == 1):
        raise ConfigError("fitcheck launch: no training script given; usage: fitcheck launch [--check-only] "
                          "[accelerate launch args] script.py [script args]")
    if rest and rest[0] == "--":
        rest = rest[1:]
    # fitcheck's boolean flags written among accelerate's flags (before the script) are recognised too.
    ns, extras = _parse(_launch_parser(), rest, known=True)
    script_at = _script_index(rest, ns)
    keep: list[str] = []
    for j, tok in enumerate(rest):
        if j < script_at and tok in BOOL_FLAGS and tok in extras:
            setattr(plan, BOOL_FLAGS[tok], True)
            continue
        keep.append(tok)
    misplaced = [tok for tok in rest[script_at + 1 :] if tok.partition("=")[0] in ("--check-only", "--check_only")]
    if misplaced:
        # After the script a token is the script's own argument (the script's --json, --strict pass through), but
        # `fitcheck launch train.py --check-only` would launch the very run the user asked only to check, and hand
        # --check-only to train.py: refused (exit 2), nothing launched.
        raise ConfigError(
            f"fitcheck launch: {' '.join(dict.fromkeys(misplaced))} comes after the training script "
            f"{rest[script_at] if script_at < len(rest) else ''}, where it is the script's own argument; nothing "
            "was launched. Put fitcheck's flags before the script: fitcheck launch --check-only [accelerate "
            "args] script.py [script args]"
        )
    plan.accelerate_argv = keep
    return plan


def _script_index(tokens: Sequence[str], ns: Any) -> int:
    """Index of the training script in the tokens (everything after it belongs to the script)."""
    script = getattr(ns, "training_script", None)
    tail = list(getattr(ns, "training_script_args", None) or [])
    for j in range(len(tokens)):
        if tokens[j] == script and list(tokens[j + 1 :]) == tail:
            return j
    return len(tokens)


def parse_accelerate_args(accelerate_argv: Sequence[str]) -> Any:
    """Parse with accelerate's own parser; validate with ``_validate_launch_command`` when available.

    Raises:
        ConfigError: accelerate would refuse these arguments.
    """
    ns = _parse(_launch_parser(), accelerate_argv, known=False)
    _check_config_file(ns)
    try:
        from accelerate.commands import launch as acc_launch
    except ImportError:  # pragma: no cover - accelerate is needed for the parser already
        return ns
    validate: Callable[[Any], Any] | None = getattr(acc_launch, "_validate_launch_command", None)
    if validate is not None:
        try:
            with redirect_stderr(io.StringIO()):
                validate(copy.deepcopy(ns))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"accelerate launch: {exc}") from None
        except Exception:  # a private function's other changes: skip its validation, keep our own reading
            pass
    return ns


def _check_config_file(ns: Any) -> None:
    """Read ``--config_file`` with fitcheck's bounded reader before accelerate's parser reads it.

    accelerate 1.15 ``commands/config/config_args.py`` loads it with ``yaml.safe_load`` and then walks and
    prints its values: a 200-byte alias bomb grows without bound there. fitcheck's reader refuses it (exit 2).
    """
    from fitcheck.readers import read_text_file, safe_yaml_load

    path = getattr(ns, "config_file", None)
    if path is None:  # accelerate reads its default file then (commands/config/__init__.py default_config_file)
        try:
            from accelerate.commands.config import default_config_file
        except ImportError:  # pragma: no cover - accelerate's parser is needed already
            return
        path = default_config_file if os.path.isfile(default_config_file) else None
    if path is None:
        return
    what = "accelerate config (accelerate launch --config_file)"
    text = read_text_file(str(path), what=what)
    if str(path).lower().endswith(".json"):
        from fitcheck.readers import safe_json_load

        safe_json_load(text, source=str(path), what=what)
    else:
        safe_yaml_load(text, source=str(path), what=what)


def launch_values(
    ns: Any, plan: LaunchPlan, env: Mapping[str, str]
) -> tuple[dict[str, object], dict[str, str], list[Finding]]:
    """Flat values for the estimate: script flags, explicit accelerate flags, the accelerate config file.

    Precedence: fitcheck's own flags > the script's TrainingArguments flags > explicit accelerate flags > the
    accelerate config file (read by the merge step).
    """
    from fitcheck.readers import ACCELERATE_ZERO_STAGE, default_config_path, read_script_argv

    script = str(ns.training_script)
    read = read_script_argv(list(ns.training_script_args or []), source=f"{os.path.basename(script)} arguments")
    values: dict[str, object] = {}
    prov: dict[str, str] = {}
    findings: list[Finding] = [f for f in read.findings if f.code != "script-flags-passed-over"]
    unknown = unknown_flags_finding(read.ignored, f"{os.path.basename(script)} arguments")
    if unknown is not None:  # only what is no TrainingArguments/TRL field (launch_plan.known_script_flags)
        findings.append(unknown)
    explicit = set(getattr(ns, "nondefault", set()) or set())
    for dest, name in _DIRECT.items():
        if dest in explicit and getattr(ns, dest, None) is not None:
            values[name] = getattr(ns, dest)
            prov[name] = f"accelerate launch --{dest}"
    par = {name: getattr(ns, dest) for dest, name in _PARALLELISM.items() if dest in explicit}
    if par and getattr(ns, "use_parallelism_config", False):
        values.update(par)
        prov.update({name: f"accelerate launch --{dest}" for dest, name in _PARALLELISM.items() if name in par})
    elif par:
        findings.append(Finding(
            "parallelism-flags-ignored", Severity.WARNING,
            "accelerate launch exports --parallelism_config_* only with --use_parallelism_config (utils/launch.py "
            "prepare_extend_env_parallelism_config): these flags have no effect and are not estimated",
            "add --use_parallelism_config (with --use_fsdp --fsdp_version 2), or set them in the config file",
        ))
    if "gradient_accumulation_steps" in explicit and ns.gradient_accumulation_steps is not None:
        values["gradient_accumulation_steps"] = ns.gradient_accumulation_steps
        prov["gradient_accumulation_steps"] = "accelerate launch --gradient_accumulation_steps"
    if "mixed_precision" in explicit and ns.mixed_precision in ("bf16", "fp16"):
        values[str(ns.mixed_precision)] = True
        prov[str(ns.mixed_precision)] = "accelerate launch --mixed_precision"
    if getattr(ns, "use_deepspeed", False) and "zero_stage" not in values and "deepspeed" not in values:
        values["zero_stage"] = ACCELERATE_ZERO_STAGE  # accelerate DeepSpeedPlugin default (utils/dataclasses.py)
        prov["zero_stage"] = "accelerate launch --use_deepspeed (DeepSpeedPlugin default stage 2)"
    fsdp = {k[len("fsdp_"):]: getattr(ns, k) for k in _FSDP_FLAGS if k in explicit and getattr(ns, k) is not None}
    if getattr(ns, "use_fsdp", False) or fsdp:
        values["fsdp_config"] = fsdp
        values["fsdp"] = "full_shard"
        prov["fsdp"] = "accelerate launch --use_fsdp"
    if getattr(ns, "cpu", False):
        values["device_type"] = "cpu"
        prov["device_type"] = "accelerate launch --cpu"
    config_file = ns.config_file
    if config_file is None and not getattr(ns, "cpu", False) and os.path.isfile(default_config_path(env)):
        config_file = default_config_path(env)  # _validate_launch_command reads the default file the same way
        findings.append(Finding("accelerate-default-config", Severity.INFO,
                                f"read accelerate's default config {config_file}"))
    if config_file is not None:
        values["config_file"] = str(config_file)
    for key, value in read.values.items():
        values[key] = value
        src, spelled = read.provenance.get(key, (script, key))
        prov[key] = f"{src}: --{spelled}"
    started = started_processes(ns)
    if started.count is not None and "simple launcher" in started.launcher:
        values["num_processes"] = started.count
        prov["num_processes"] = f"accelerate launch starts {started.count}: {started.launcher}"
    if started.cpu:
        values["device_type"] = "cpu"
        prov["device_type"] = "accelerate launch --cpu / config use_cpu"
    if values.get("use_cpu") is True:
        values["device_type"] = "cpu"
        prov["device_type"] = prov.get("use_cpu", "the script's --use_cpu")
    for key, value in plan.values.items():
        values[key] = value
        prov[key] = f"fitcheck launch --{key}"
    with_cpu_budget(values, prov)
    if not values.get("model_name_or_path"):
        raise ConfigError(
            f"{script}: its arguments do not name the model (--model_name_or_path); pass it to the script or "
            "to fitcheck: fitcheck launch --model_name_or_path ID [accelerate args] script.py ..."
        )
    return values, prov, findings


def launch_report(plan: LaunchPlan, env: Mapping[str, str], trainer_hook: Any | None = None) -> Any:
    """The report for a launch command line.

    ``trainer_hook`` (``fitcheck.cli.launch_trl.TrlLaunchHook``): ``split(ns, values)`` returns the values with the
    TRL trainer's fields read from the script's arguments with TRL's parser (run settings like any other: the
    readers build the spec's trainer from them).
    """
    import dataclasses

    from fitcheck.integrations.spec_build import build_spec, field_findings

    from fitcheck.core import estimate
    from fitcheck.readers import TRL_FLAG_NAMES, load_inventory

    ns = parse_accelerate_args(plan.accelerate_argv)
    values, prov, findings = launch_values(ns, plan, env)
    if trainer_hook is not None:
        values = trainer_hook.split(ns, values)
    if values.get("trainer") is not None:  # a TRL script: its TRL fields were read as flags by TRL's own parser
        prov = {k: w for k, w in prov.items() if k not in TRL_FLAG_NAMES}
    inventory = load_inventory(str(values.pop("model_name_or_path")), env=env, meta_fallback=meta_inventory)
    spec, assumptions = build_spec(inventory, values, prov, findings, env)
    report = estimate(spec)
    more = field_findings(spec, values, env,
                          device_used_fraction=report.device_used_bytes / max(1, report.budget_bytes),
                          existing=report.findings)
    return dataclasses.replace(report, findings=(*report.findings, *more),
                               assumptions=(*report.assumptions, *assumptions))


def accelerate_command(accelerate_argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The command that runs ``accelerate launch`` with these arguments.

    ``$FITCHECK_ACCELERATE_LAUNCHER`` (a command prefix) replaces ``python -m accelerate.commands.launch``
    (= ``accelerate launch``), for wrappers and tests.
    """
    prefix = env.get("FITCHECK_ACCELERATE_LAUNCHER")
    head = shlex.split(prefix) if prefix else [sys.executable, "-m", "accelerate.commands.launch"]
    return [*head, *accelerate_argv]


def exec_command(cmd: Sequence[str]) -> int:
    """Replace this process with the command (POSIX ``execvp``: exit code and signals are the child's)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if hasattr(os, "execvp"):
        os.execvp(cmd[0], list(cmd))
    import subprocess  # pragma: no cover - platforms without exec

    return subprocess.call(list(cmd))  # pragma: no cover
