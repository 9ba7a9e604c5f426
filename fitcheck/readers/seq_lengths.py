"""``--seq_lengths``: the padded lengths of the user's successive batches, for the caching-allocator replay.

A dataloader that pads each micro-batch to its longest sequence (transformers ``DataCollatorWithPadding``, TRL's
``DataCollatorForLanguageModeling`` without packing) hands every step a different length. Each length allocates
differently sized activations, and blocks cached for one length are not always reusable by the next: what stays
reserved depends on the sequence of lengths. ``fitcheck.torch_adapters.allocator_replay.replay_step`` replays the
traced step at each length, in order, on one caching allocator.

Two forms, both in tokens:

- ``512,1024,768,2048``: the padded lengths of successive steps, replayed in that order (at most
  :data:`MAX_LENGTHS`);
- ``MIN:MAX`` or ``MIN:MAX:N``: N (default :data:`DEFAULT_STEPS`) lengths evenly spaced from MIN to MAX (each a
  multiple of 8 where the range allows), replayed shortest first, longest last.
"""

from __future__ import annotations

from fitcheck.errors import ConfigError

FLAG = "--seq_lengths"
MAX_LENGTHS = 16  # each length is one traced step (two layer groups): a sample of the batches, not the dataset
DEFAULT_STEPS = 4
_FORMS = "a comma list of padded batch lengths such as 512,1024,768,2048, or MIN:MAX[:STEPS] such as 256:4096:6"


def parse_seq_lengths(text: str) -> tuple[int, ...]:
    """Read ``--seq_lengths``.

    Args:
        text: The flag's value.

    Returns:
        The lengths of successive steps, in replay order.

    Raises:
        ConfigError: Not one of the two forms, a length below 1, MIN > MAX, or more than :data:`MAX_LENGTHS`
            lengths.
    """
    raw = str(text).strip()
    if not raw:
        raise ConfigError(f"{FLAG} is empty: give {_FORMS}")
    if ":" in raw:
        return _range(raw)
    parts = [p.strip() for p in raw.replace(" ", ",").split(",") if p.strip()]
    lengths = tuple(_length(p, raw) for p in parts)
    if not lengths:
        raise ConfigError(f"{FLAG} {raw!r} has no lengths: give {_FORMS}")
    if len(lengths) > MAX_LENGTHS:
        raise ConfigError(
            f"{FLAG} {raw!r} gives {len(lengths)} lengths; give at most {MAX_LENGTHS} (a sample of your batches' "
            f"padded lengths, or MIN:MAX:{MAX_LENGTHS})"
        )
    return lengths


def _range(raw: str) -> tuple[int, ...]:
    parts = raw.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"{FLAG} {raw!r} is not MIN:MAX or MIN:MAX:STEPS: give {_FORMS}")
    low, high = _length(parts[0], raw), _length(parts[1], raw)
    steps = _length(parts[2], raw) if len(parts) == 3 else DEFAULT_STEPS
    if low > high:
        raise ConfigError(f"{FLAG} {raw!r}: MIN {low} is above MAX {high}; write {high}:{low}")
    if not 2 <= steps <= MAX_LENGTHS:
        raise ConfigError(f"{FLAG} {raw!r}: STEPS must be 2 to {MAX_LENGTHS}, got {steps}; e.g. {low}:{high}:4")
    if low == high:
        return (low,) * steps
    out = []
    for k in range(steps):
        length = low + (high - low) * k // (steps - 1)
        if 0 < k < steps - 1 and high - low >= 8 * steps:  # padding to a multiple of 8 (pad_to_multiple_of)
            length = max(low, min(high, -(-length // 8) * 8))
        out.append(length)
    return tuple(out)


def _length(part: str, raw: str) -> int:
    try:
        value = int(part.strip())
    except ValueError:
        raise ConfigError(f"{FLAG} {raw!r}: {part.strip()!r} is not a whole number of tokens; give {_FORMS}") from None
    if value < 1:
        raise ConfigError(f"{FLAG} {raw!r}: lengths are tokens per sequence, at least 1 (got {value})")
    return value


def check_seq_lengths(lengths: tuple[int, ...], max_seq_length: int) -> None:
    """Refuse lengths above the run's ``max_seq_length`` (the collator truncates to it; no batch is longer).

    Args:
        lengths: Parsed ``--seq_lengths``.
        max_seq_length: The spec's sequence length.

    Raises:
        ConfigError: A length above ``max_seq_length``.
    """
    longest = max(lengths)
    if longest > max_seq_length:
        raise ConfigError(
            f"{FLAG}: the length {longest} is above max_seq_length {max_seq_length}, to which every batch is "
            f"truncated; lower it, or pass --max_seq_length {longest} if your batches are that long"
        )
