"""Bounded, safe reading of a training framework's YAML (axolotl, LLaMA-Factory) and what a reader of one returns.

A framework file describes the whole run; its readers (:mod:`.axolotl`, :mod:`.llamafactory`) translate it into
the settings ``fitcheck estimate`` flags name (``readers/settings_table.py``), each with where it was read
(``"cfg.yml:micro_batch_size"``), so the estimate of a file equals the estimate of the same run written as flags.

Reading is bounded and never executes anything: ``yaml.safe_load`` semantics (``SafeLoader``: no Python tags),
a size cap, and a cap on alias references (an "alias bomb" of nested anchors expands exponentially when walked).
Files the YAML names (a DeepSpeed JSON) are looked for next to the YAML, then in the directories above it (the
frameworks' examples name them from the repository root: LLaMA-Factory ``examples/deepspeed/ds_z3_config.json``,
axolotl ``deepspeed_configs/zero3_bf16.json``), then in the working directory (where the frameworks open them).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding

MAX_YAML_BYTES = 1 << 20  # 1 MiB: framework configs are a few KiB
MAX_ALIASES = 200  # alias references per file; real configs use a handful


@dataclass(frozen=True)
class FrameworkRun:
    """A framework file read as ``fitcheck estimate`` settings.

    Attributes:
        values: Canonical setting name -> value, as the same flag would give it.
        where: Canonical setting name -> where it was read (``"cfg.yml:micro_batch_size"``).
        findings: What the reader wants the user to know (unknown keys, approximations).
        notes: Assumptions (the framework's defaults that were applied).
    """

    values: dict[str, object]
    where: dict[str, str]
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = field(default=())


@functools.cache
def _bounded_loader() -> Any:
    """``SafeLoader`` that refuses more than :data:`MAX_ALIASES` alias references (built on first use, so that
    importing this module does not import PyYAML)."""
    import yaml

    class _BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.aliases_seen = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases_seen += 1
                if self.aliases_seen > MAX_ALIASES:
                    raise ConfigError(
                        f"more than {MAX_ALIASES} YAML alias references (*name); write the values out"
                    )
            return super().compose_node(parent, index)

    return _BoundedLoader


def load_framework_yaml(path: str, *, what: str) -> dict[str, object]:
    """Read a framework's YAML file: a mapping with string keys, bounded and safe.

    Args:
        path: The file.
        what: What it is, for messages (``"axolotl config (--axolotl)"``).

    Returns:
        The top-level mapping.

    Raises:
        ConfigError: Missing, too large, not YAML, too many aliases, or not a mapping.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what}: file {path!r} does not exist; check the path")
    if p.stat().st_size > MAX_YAML_BYTES:
        raise ConfigError(f"{what}: {path} is larger than {MAX_YAML_BYTES} bytes; pass the training config itself")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: cannot read {path!r} ({exc}); pass a readable UTF-8 text file") from None
    import yaml

    loader = _bounded_loader()(text)
    try:
        data = loader.get_single_data()
    except ConfigError as exc:
        raise ConfigError(f"{what}: {path}: {exc}") from None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{what}: {path} is not valid YAML ({first}); fix the syntax") from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {path} must hold a mapping of keys to values, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{what}: {path} has non-string keys {bad[:3]!r}; quote them")
    return {str(k): v for k, v in data.items()}


def resolve_named_file(name: str, yaml_path: str, cwd: str, *, at: str) -> str:
    """The file a framework YAML names: next to the YAML, in a directory above it, or in ``cwd``.

    Raises:
        ConfigError: Found nowhere (the message lists where it was looked for).
    """
    named = Path(name)
    if named.is_absolute():
        if named.is_file():
            return str(named)
        raise ConfigError(f"{at}: file {name!r} does not exist; fix the path")
    base = Path(yaml_path).resolve().parent
    tried = [base, *base.parents, Path(cwd)]
    for folder in tried:
        candidate = folder / named
        if candidate.is_file():
            return str(candidate)
    raise ConfigError(
        f"{at}: file {name!r} not found next to {yaml_path}, in a directory above it, or in {cwd}; "
        "give its path relative to the YAML or an absolute path"
    )


class Collected:
    """Values with where each was read, findings, notes and refusals, collected while reading."""

    def __init__(self, path: str) -> None:
        """Args:
        path: The framework file being read.
        """
        self.path = path
        self.values: dict[str, object] = {}
        self.where: dict[str, str] = {}
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        self.problems: list[str] = []

    def set(self, name: str, value: object, key: str) -> None:
        """Record setting ``name`` read from the file's ``key``."""
        self.values[name] = value
        self.where[name] = f"{self.path}:{key}"

    def refuse(self, key: str, reason: str) -> None:
        """Record a key that changes memory and is not modelled (reported together, exit 2)."""
        self.problems.append(f"{self.path}: {key}: not modelled: {reason}")
