"""Small shared pieces of the readers: the ``"auto"`` marker, file loading and typed value checks.

Every reader turns raw input into typed values and says where each came from. Raw dicts stop in the
readers; what leaves them is typed and carries provenance (``"ds.json:zero_optimization.stage"``).
Nothing here reads environment variables; the only I/O is reading the file a caller names.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from enum import Enum
from pathlib import Path

import yaml

from fitcheck.errors import ConfigError


class Auto(Enum):
    """The ``"auto"`` placeholder of HF/DeepSpeed configs, kept distinct from every real value until
    resolved."""

    AUTO = "auto"

    def __repr__(self) -> str:
        return "AUTO"


AUTO = Auto.AUTO


def is_auto(value: object) -> bool:
    """True for the :data:`AUTO` marker and for the string ``"auto"`` in any case, as HF/DeepSpeed write it."""
    return value is AUTO or (isinstance(value, str) and value.strip().lower() == "auto")


_TRUE = (
    "y",
    "yes",
    "t",
    "true",
    "on",
    "1",
)  # transformers.training_args.str_to_bool / accelerate str_to_bool
_FALSE = ("n", "no", "f", "false", "off", "0")


def where(source: str, key: str) -> str:
    """Provenance text for one key of one source, e.g. ``"ds.json:zero_optimization.stage"``."""
    return f"{source}:{key}" if key else source


def load_mapping_file(path: str, *, what: str) -> dict[str, object]:
    """Read a JSON or YAML file whose top level is a mapping.

    Args:
        path: The file.
        what: What the file is for, used in messages (e.g. ``"DeepSpeed config (--deepspeed)"``).

    Returns:
        The mapping.

    Raises:
        ConfigError: If the file is missing, unreadable, malformed, or not a mapping.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what}: file {path!r} does not exist; check the path")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: cannot read {path!r} ({exc}); pass a readable UTF-8 text file") from None
    return parse_mapping_text(text, source=path, what=what, prefer_json=p.suffix.lower() == ".json")


def parse_mapping_text(text: str, *, source: str, what: str, prefer_json: bool) -> dict[str, object]:
    """Parse JSON (or YAML, a superset) text whose top level must be a mapping with string keys.

    Args:
        text: File contents.
        source: File name for messages.
        what: What the file is for.
        prefer_json: Parse as strict JSON (``.json`` files: DeepSpeed and transformers use ``json.load``).

    Returns:
        The mapping.

    Raises:
        ConfigError: If the text is malformed or not a mapping.
    """
    data: object
    if prefer_json:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ConfigError(f"{what}: {source} is not valid JSON ({exc}); fix the syntax") from None
    else:
        try:
            data = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{what}: {source} is not valid YAML ({first}); fix the syntax") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what}: {source} must contain a mapping of keys to values at the top level, "
            f"got {type(data).__name__}"
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{what}: {source} has non-string keys {bad[:3]!r}; quote them")
    return {str(k): v for k, v in data.items()}


def as_bool(value: object, *, at: str) -> bool:
    """A boolean, accepting the strings transformers/accelerate accept (``"true"``, ``"yes"``, ``"1"``...).

    Raises:
        ConfigError: If the value is not a boolean.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"{at}: expected true or false, got {value!r}")


def as_int(value: object, *, at: str, minimum: int | None = None) -> int:
    """An integer, accepting integral floats (JSON ``5e8``) and numeric strings (``"5e8"`` from a flag).

    Args:
        value: The raw value.
        at: Where it was read, for the message.
        minimum: Smallest allowed value, if any.

    Raises:
        ConfigError: If the value is not an integer or is below the minimum.
    """
    number: float
    if isinstance(value, bool):
        raise ConfigError(f"{at}: expected an integer, got {value!r}")
    if isinstance(value, (int, float)):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value.strip().replace("_", "")) if value.strip() else math.nan
        except ValueError:
            raise ConfigError(f"{at}: expected an integer, got {value!r}") from None
    else:
        raise ConfigError(f"{at}: expected an integer, got {value!r}")
    if not math.isfinite(number) or number != int(number):
        raise ConfigError(f"{at}: expected a whole number, got {value!r}")
    result = int(number)
    if minimum is not None and result < minimum:
        raise ConfigError(f"{at}: must be >= {minimum}, got {value!r}")
    return result


def as_float(value: object, *, at: str) -> float:
    """A finite float.

    Raises:
        ConfigError: If the value is not a finite number.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{at}: expected a number, got {value!r}")
    try:
        number = float(value) if isinstance(value, (int, float, str)) else math.nan
    except ValueError:
        raise ConfigError(f"{at}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigError(f"{at}: expected a finite number, got {value!r}")
    return number


def as_str(value: object, *, at: str) -> str:
    """A string (numbers are not silently turned into strings).

    Raises:
        ConfigError: If the value is not a string.
    """
    if not isinstance(value, str):
        raise ConfigError(f"{at}: expected a string, got {value!r}")
    return value


def as_str_list(value: object, *, at: str) -> tuple[str, ...]:
    """A list of strings; a comma/space separated string is split (accelerate and argparse forms).

    Raises:
        ConfigError: If the value is neither a string nor a list of strings.
    """
    if isinstance(value, str):
        return tuple(part for part in value.replace(",", " ").split() if part)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(str(v) for v in value)
    raise ConfigError(f"{at}: expected a list of names, got {value!r}")


def as_mapping(value: object, *, at: str) -> dict[str, object]:
    """A mapping with string keys; a JSON string is parsed (TrainingArguments accepts ``'{"k": 1}'``).

    Raises:
        ConfigError: If the value is not a mapping.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise ConfigError(f"{at}: expected a mapping (or its JSON text), got {value!r}") from None
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {str(k): v for k, v in value.items()}
    raise ConfigError(f"{at}: expected a mapping, got {value!r}")
