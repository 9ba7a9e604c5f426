"""``fitcheck launch`` in front of a framework's own entry point: estimate the framework's YAML, then run it.

Recognised commands (after fitcheck's own flags ``--check-only``, ``--strict``, ``--json``, ``--gpu``,
``--gpu_memory``, ``--host_memory``, ``--model_name_or_path``, ``--num_processes``):

* ``axolotl train CONFIG [--key value ...]``: axolotl's CLI (``cli/main.py``) merges ``--key value`` into the
  config, so the overrides replace the file's keys;
* ``[accelerate launch args] -m axolotl.cli.train CONFIG [--key value ...]``: run through ``accelerate launch``;
  its ``--num_processes`` counts the processes;
* ``llamafactory-cli train CONFIG [key=value ...]`` (also ``lmf``): LLaMA-Factory's ``read_args`` merges the
  ``key=value`` dot-list over the YAML (OmegaConf).

The config is read by :mod:`fitcheck.readers.axolotl` / :mod:`fitcheck.readers.llamafactory`; override values
are parsed as YAML scalars (``yaml.safe_load``), as the frameworks' parsers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from fitcheck.errors import ConfigError

_BOOL = {"--check-only": "check_only", "--check_only": "check_only", "--strict": "strict", "--json": "json"}
_VALUE = {
    f"--{spelling}": name
    for name in ("gpu", "gpu_memory", "host_memory", "model_name_or_path", "num_processes")
    for spelling in (name, name.replace("_", "-"))
}
_AXOLOTL_MODULE = "axolotl.cli.train"


@dataclass
class FrameworkLaunch:
    """A ``fitcheck launch`` command line whose command is a framework's entry point.

    Attributes:
        framework: ``axolotl`` or ``llamafactory`` (the estimate flag that reads the config).
        config: The YAML file.
        overrides: Keys given on the framework's command line.
        values: fitcheck's own value flags.
        command: What runs after the estimate, exactly as given (``accelerate`` arguments for ``-m``).
        through_accelerate: ``command`` holds ``accelerate launch`` arguments (``-m axolotl.cli.train``).
        check_only: Stop after the report.
        strict: Refuse to run a configuration that does not fit.
        json: Print the report as JSON.
    """

    framework: str
    config: str
    overrides: dict[str, object] = field(default_factory=dict)
    values: dict[str, object] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)
    through_accelerate: bool = False
    check_only: bool = False
    strict: bool = False
    json: bool = False


def split_framework_argv(argv: Sequence[str]) -> FrameworkLaunch | None:
    """The framework launch in ``argv``, or None when the command is no framework entry point.

    Raises:
        ConfigError: A fitcheck flag without its value, or a framework command without its config file.
    """
    tokens = list(argv)
    flags: dict[str, bool] = {}
    values: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        name, eq, inline = tokens[i].partition("=")
        if tokens[i] in _BOOL:
            flags[_BOOL[tokens[i]]] = True
            i += 1
        elif name in _VALUE:
            if not eq and i + 1 >= len(tokens):
                raise ConfigError(f"fitcheck launch {name}: expects a value")
            values[_VALUE[name]] = inline if eq else tokens[i + 1]
            i += 1 if eq else 2
        else:
            break
    rest = tokens[i:]
    found = _framework(rest)
    if found is None:
        return None
    framework, config, overrides, through = found
    if "num_processes" not in values and through:
        values.update(_accelerate_processes(rest))
    return FrameworkLaunch(framework, config, overrides, values, rest, through, **flags)


def _framework(rest: list[str]) -> tuple[str, str, dict[str, object], bool] | None:
    if rest[:2] == ["axolotl", "train"]:
        return "axolotl", _config(rest, 2, "axolotl train"), _flag_overrides(rest[3:]), False
    if rest[:1] in (["llamafactory-cli"], ["lmf"]) and rest[1:2] == ["train"]:
        return "llamafactory", _config(rest, 2, f"{rest[0]} train"), _dotlist(rest[3:]), False
    for j, tok in enumerate(rest):
        if tok in ("-m", "--module") and rest[j + 1 : j + 2] == [_AXOLOTL_MODULE]:
            return "axolotl", _config(rest, j + 2, f"-m {_AXOLOTL_MODULE}"), _flag_overrides(rest[j + 3 :]), True
    return None


def _config(rest: list[str], at: int, command: str) -> str:
    if at >= len(rest) or rest[at].startswith("-"):
        raise ConfigError(f"fitcheck launch: {command} needs its config file (the YAML) next")
    return rest[at]


def _scalar(text: str, at: str) -> object:
    try:
        return yaml.safe_load(text) if len(text) < 10_000 else text
    except yaml.YAMLError:
        raise ConfigError(f"{at}: {text!r} is not a YAML value") from None


def _flag_overrides(args: list[str]) -> dict[str, object]:
    """axolotl's ``--key value`` / ``--key=value`` / bare ``--flag`` (true) overrides."""
    out: dict[str, object] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--"):
            i += 1
            continue
        name, eq, inline = tok[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            out[key] = _scalar(inline, f"--{name}")
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[key] = _scalar(args[i + 1], f"--{name}")
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def _dotlist(args: list[str]) -> dict[str, object]:
    """LLaMA-Factory's ``key=value`` overrides."""
    out: dict[str, object] = {}
    for tok in args:
        key, eq, value = tok.partition("=")
        if not eq:
            raise ConfigError(f"llamafactory-cli train: {tok!r}: overrides are key=value")
        out[key.strip()] = _scalar(value, key)
    return out


def _accelerate_processes(rest: list[str]) -> dict[str, object]:
    """``--num_processes`` / ``--num_machines`` given to ``accelerate launch`` (before the module)."""
    out: dict[str, object] = {}
    for j, tok in enumerate(rest):
        if tok in ("-m", "--module"):
            break
        name, eq, inline = tok.partition("=")
        for flag, key in (("num_processes", "num_processes"), ("num_machines", "num_machines")):
            if name in (f"--{flag}", f"--{flag.replace('_', '-')}"):
                out[key] = inline if eq else (rest[j + 1] if j + 1 < len(rest) else None)
    return {k: v for k, v in out.items() if v is not None}
