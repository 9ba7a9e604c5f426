"""Parse and format byte sizes.

Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB) are powers of 1000,
as in the SI and in GPU marketing names ("80GB" cards have 80 GiB-ish of usable HBM; see the GPU table).
A bare number is bytes.
"""

from __future__ import annotations

import math
import re

from fitcheck.errors import ConfigError, short_repr

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

GIB = 1024**3
MIB = 1024**2


def parse_bytes(text: str | int | float, *, what: str = "size") -> int:
    """Parse a size such as ``"80GiB"``, ``"24GB"``, ``"512MiB"`` or ``1e9`` into bytes.

    Args:
        text: The size. Numbers are bytes.
        what: Where the value came from (a flag or key), used in the error message.

    Returns:
        The size in bytes.

    Raises:
        ConfigError: If the text is not a positive size.
    """
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a size such as 80GiB, got {short_repr(text)}")
    if isinstance(text, (int, float)):
        value = float(text)
        unit = ""
    else:
        # a size is a few characters; a long value is refused before the regex (which backtracks on it)
        match = _SIZE_RE.match(text) if len(text) <= 64 else None
        if match is None or match.group(2).lower() not in _UNITS:
            raise ConfigError(
                f"{what}: cannot read {short_repr(text)} as a size; write it like 80GiB, 24GB or 512MiB"
            )
        value = float(match.group(1))
        unit = match.group(2).lower()
    if not math.isfinite(value) or not math.isfinite(value * _UNITS[unit]):
        raise ConfigError(f"{what}: size must be a finite number of bytes, got {short_repr(text)}")
    if value <= 0:
        raise ConfigError(f"{what}: size must be positive, got {short_repr(text)}")
    return int(value * _UNITS[unit])


def format_bytes(n: int | float) -> str:
    """Format bytes in binary units with two decimals, e.g. ``"14.96 GiB"``."""
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, scale in (("TiB", 1024**4), ("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if value >= scale:
            return f"{sign}{value / scale:.2f} {unit}"
    return f"{sign}{int(value)} B"
