"""``PYTORCH_CUDA_ALLOC_CONF``: the caching allocator's settings, parsed from a string the caller passes in.

The core reads no environment: the CLI and the integrations read ``PYTORCH_CUDA_ALLOC_CONF`` and pass its text.

Source: torch ``c10/core/AllocatorConfig.cpp`` (pytorch/pytorch, the snapshot read for this module; torch 2.13
ships the same parser): ``lexArgs`` splits on ``,`` ``:`` ``[`` ``]`` and drops spaces; ``parseArgs`` accepts
``max_split_size_mb`` (MiB, ``>= kLargeBuffer / kMB`` = 20), ``max_non_split_rounding_mb`` (MiB, >= 20),
``garbage_collection_threshold`` (in (0, 1)), ``roundup_power2_divisions`` (one power of two for every size, or
``[MB:divisions, ..., >:divisions]`` per power-of-two interval from 1 MiB to 64 GiB: 16 intervals),
``expandable_segments`` (``True``/``False``), ``backend`` (``native`` / ``cudaMallocAsync``) and the pinned-memory
and lock options (no effect on device memory). Any other key: "Unrecognized CachingAllocator option".
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1024**2
K_LARGE_BUFFER = 20 * MIB  # CUDACachingAllocator.cpp kLargeBuffer
ROUNDUP_INTERVALS = 16  # AllocatorConfig.cpp kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB

_NO_EFFECT = frozenset({
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
})


@dataclass(frozen=True)
class AllocatorConf:
    """The caching allocator settings that change device memory.

    Attributes:
        max_split_size: Blocks at least this large are never split (bytes; None: unlimited, the default).
        max_non_split_rounding: An oversize cached block serves a request at most this much smaller (bytes;
            default ``kLargeBuffer``).
        roundup_power2_divisions: Divisions per power-of-two interval (16 entries, 1 MiB .. 64 GiB; 0 = off).
        garbage_collection_threshold: Fraction of the allowed memory above which unsplit cached blocks are
            released (0 = off; only acts with ``torch.cuda.set_per_process_memory_fraction``).
        expandable_segments: One segment per pool and stream, grown by pages.
        backend: ``native`` or ``cudaMallocAsync`` (the latter is not simulated).
    """

    max_split_size: int | None = None
    max_non_split_rounding: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = field(default=(0,) * ROUNDUP_INTERVALS)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    backend: str = "native"


def _lex(text: str) -> list[str]:
    """AllocatorConfig::lexArgs: tokens split on , : [ ] (kept as tokens), spaces dropped."""
    out: list[str] = []
    buf = ""
    for ch in text:
        if ch in ",:[]":
            if buf:
                out.append(buf)
                buf = ""
            out.append(ch)
        elif ch != " ":
            buf += ch
    if buf:
        out.append(buf)
    return out


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class AllocConfError(ValueError):
    """A ``PYTORCH_CUDA_ALLOC_CONF`` string torch would refuse (the message says which key and why)."""


def _int(tok: str, key: str) -> int:
    try:
        return int(tok)
    except ValueError:
        raise AllocConfError(f"{key}: expected an integer, got {tok!r}") from None


def _roundup(tokens: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """parseRoundUpPower2Divisions: one value for all intervals, or ``[MB:div, ..., >:div]``."""
    key = "roundup_power2_divisions"
    divisions = [0] * ROUNDUP_INTERVALS
    if i >= len(tokens):
        raise AllocConfError(f"{key}: expecting a value")
    if tokens[i] != "[":
        val = _int(tokens[i], key)
        if not _power_of_two(val):
            raise AllocConfError(f"{key}: the divisions have to be a power of 2, got {val}")
        return (val,) * ROUNDUP_INTERVALS, i
    first, last = True, 0
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        interval = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise AllocConfError(f"{key}: expected 'MB:divisions' pairs in [...]")
        val = _int(tokens[i + 2], key)
        if val != 0 and not _power_of_two(val):
            raise AllocConfError(f"{key}: the divisions have to be a power of 2 or 0, got {val}")
        if interval == ">":
            divisions[last:] = [val] * (ROUNDUP_INTERVALS - last)
        else:
            mb = _int(interval, key)
            if not _power_of_two(mb):
                raise AllocConfError(f"{key}: the intervals have to be powers of 2 (MiB), got {mb}")
            index = min(mb.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                divisions[:index] = [val] * index
                first = False
            divisions[index] = val
            last = index
        i += 3
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    if i >= len(tokens):
        raise AllocConfError(f"{key}: missing ']'")
    return tuple(divisions), i


def parse_alloc_conf(text: str) -> AllocatorConf:
    """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` value as torch's ``AllocatorConfig::parseArgs`` does.

    Args:
        text: The variable's value (empty: the defaults).

    Returns:
        The settings.

    Raises:
        AllocConfError: A key or value torch refuses (unknown key, max_split_size_mb < 20, a threshold outside
            (0, 1), divisions that are not powers of two, a boolean other than True/False).
    """
    tokens = _lex(text)
    values: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if i + 2 > len(tokens) or tokens[i + 1] != ":":
            raise AllocConfError(f"{key}: expected '{key}:VALUE'")
        i += 2
        if key == "roundup_power2_divisions":
            values[key], i = _roundup(tokens, i)
        else:
            if i >= len(tokens):
                raise AllocConfError(f"{key}: expecting a value")
            tok = tokens[i]
            if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                mb = _int(tok, key)
                if mb < K_LARGE_BUFFER // MIB:
                    raise AllocConfError(f"{key} too small, must be >= {K_LARGE_BUFFER // MIB}, got {mb}")
                values[key] = mb * MIB
            elif key == "garbage_collection_threshold":
                try:
                    t = float(tok)
                except ValueError:
                    raise AllocConfError(f"{key}: expected a number, got {tok!r}") from None
                if not 0.0 < t < 1.0:
                    raise AllocConfError(f"{key} is invalid, set it in (0.0, 1.0), got {t}")
                values[key] = t
            elif key == "expandable_segments" or key in _NO_EFFECT:
                if key != "pinned_num_register_threads" and tok not in ("True", "False"):
                    raise AllocConfError(f"expected a single True/False argument for {key}, got {tok!r}")
                values[key] = tok == "True"
            elif key == "backend":
                if tok not in ("native", "cudaMallocAsync"):
                    raise AllocConfError(f"unknown allocator backend {tok!r}: options are native and cudaMallocAsync")
                values[key] = tok
            else:
                raise AllocConfError(f"unrecognized CachingAllocator option: {key}")
        i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise AllocConfError(f"expected ',' after {key}")
            i += 1
    split = values.get("max_split_size_mb")
    rounding = values.get("max_non_split_rounding_mb", K_LARGE_BUFFER)
    divisions = values.get("roundup_power2_divisions", (0,) * ROUNDUP_INTERVALS)
    assert isinstance(rounding, int) and isinstance(divisions, tuple)
    return AllocatorConf(
        max_split_size=split if isinstance(split, int) else None,
        max_non_split_rounding=rounding,
        roundup_power2_divisions=divisions,
        garbage_collection_threshold=float(str(values.get("garbage_collection_threshold", 0.0))),
        expandable_segments=bool(values.get("expandable_segments", False)),
        backend=str(values.get("backend", "native")),
    )
