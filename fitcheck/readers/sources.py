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
from typing import TYPE_CHECKING

from fitcheck.errors import ConfigError, short_repr

# Bounds on what a reader reads. A config file (config.json, TrainingArguments, DeepSpeed, accelerate, TRL YAML)
# is a few kB; 16 MiB leaves room for any real one. A YAML document may share nodes through anchors and aliases:
# a 200-byte "billion laughs" document expands to ~10^9 values when walked (repr, str, deepcopy, json.dumps), so
# a document whose expansion exceeds MAX_YAML_VALUES is refused before it is built. Nesting deeper than
# MAX_NESTING is refused too (json/yaml recurse per level).
MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_YAML_VALUES = 100_000
MAX_NESTING = 200

if TYPE_CHECKING:
    import yaml


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
    text = read_text_file(path, what=what)
    return parse_mapping_text(text, source=path, what=what, prefer_json=Path(path).suffix.lower() == ".json")


def read_text_file(path: str | Path, *, what: str, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes.

    A FIFO, a device or a directory is refused without opening it (opening a FIFO blocks until a writer comes).

    Raises:
        ConfigError: Missing, not a regular file, too large, or unreadable.
    """
    p = Path(path)
    shown = short_repr(str(path))
    if not p.is_file():
        kind = "is not a regular file" if p.exists() else "does not exist"
        raise ConfigError(f"{what}: {shown} {kind}; check the path")
    try:
        with p.open("rb") as fh:
            raw = fh.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {shown} ({exc.strerror or exc}); pass a readable file") from None
    if len(raw) > limit:
        raise ConfigError(f"{what}: {shown} is larger than {limit // 2**20} MiB; this is not a config file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what}: {shown} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def safe_yaml_load(text: str, *, source: str, what: str) -> object:
    """``yaml.safe_load`` that refuses alias expansion beyond :data:`MAX_YAML_VALUES` values and nesting deeper
    than :data:`MAX_NESTING` (checked on the composed node graph, before any Python object is built).

    Raises:
        ConfigError: Malformed YAML, an alias bomb, or too deep.
    """
    import yaml  # here, not at the top: a JSON-only run does not import PyYAML (issue 20's 0.3 s formula answer)

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{what}: {source} is not valid YAML ({short_repr(first)}); fix the syntax") from None
    if node is None:
        return None
    _check_yaml_size(node, source=source, what=what)
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    except (yaml.YAMLError, RecursionError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{what}: {source} is not valid YAML ({short_repr(first)}); fix the syntax") from None
    finally:
        loader.dispose()


def _check_yaml_size(root: yaml.Node, *, source: str, what: str) -> None:
    """Count the values the document expands to (aliases counted at every use) without recursion."""
    expanded: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _children(node)
            expanded[key] = 1 + sum(expanded[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if expanded[key] > MAX_YAML_VALUES:
                raise ConfigError(
                    f"{what}: {source} expands to more than {MAX_YAML_VALUES:,} values through YAML anchors and "
                    "aliases (&name / *name); write the values out, or drop the aliases"
                )
            if depth[key] > MAX_NESTING:
                raise ConfigError(f"{what}: {source} nests deeper than {MAX_NESTING} levels; this is no config")
            continue
        if key in expanded:
            continue
        if key in on_path:
            raise ConfigError(f"{what}: {source} has a recursive YAML alias; write the values out")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in expanded)


def _children(node: yaml.Node) -> list[yaml.Node]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


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
        data = safe_json_load(text, source=source, what=what)
    else:
        data = safe_yaml_load(text, source=source, what=what)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what}: {source} must contain a mapping of keys to values at the top level, "
            f"got {type(data).__name__}"
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{what}: {source} has non-string keys {short_repr(bad[:3])}; quote them")
    return {str(k): v for k, v in data.items()}


def safe_json_load(text: str, *, source: str, what: str) -> object:
    """``json.loads`` that refuses nesting deeper than :data:`MAX_NESTING` (json recurses per level: a
    200k-deep document would raise RecursionError, or exhaust the C stack) and non-finite or oversized numbers.

    Raises:
        ConfigError: Malformed JSON or nested too deep.
    """
    if _max_bracket_depth(text) > MAX_NESTING:
        raise ConfigError(f"{what}: {source} nests deeper than {MAX_NESTING} levels; this is no config")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ConfigError(f"{what}: {source} is not valid JSON ({short_repr(str(exc))}); fix the syntax") from None


def _max_bracket_depth(text: str) -> int:
    """An upper bound of a JSON document's nesting (brackets inside strings counted too: conservative only
    for documents with thousands of brackets in strings)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


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
