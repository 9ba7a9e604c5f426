"""DeepSpeed's batch-size rules: each batch key a positive integer, a missing one derived from the other two.

Follows DeepSpeed 0.19 ``deepspeed/runtime/config.py``: ``_set_batch_related_parameters`` derives a missing
``train_batch_size`` / ``train_micro_batch_size_per_gpu`` / ``gradient_accumulation_steps`` from the others,
and ``_batch_assertion`` asserts ``train_batch_size == micro_batch * grad_acc * world_size``; the messages are
DeepSpeed's own, with the fix appended.
"""

from __future__ import annotations

from fitcheck.errors import ConfigError
from fitcheck.readers.sources import as_int, where


def batch_int(value: object, source: str, key: str, problems: list[str]) -> int | None:
    """A resolved batch key as a positive integer, or None when absent.

    Args:
        value: The value after ``"auto"`` resolution (None when the key is absent).
        source: The file name, for messages.
        key: The DeepSpeed key.
        problems: Collects the message for a bad value (the caller raises them together).

    Returns:
        The integer, or None when absent or bad.
    """
    if value is None:
        return None
    try:
        # DeepSpeed _batch_assertion: each "has to be greater than 0"
        return as_int(value, at=where(source, key), minimum=1)
    except ConfigError as exc:
        problems.append(exc.problems[0] + '; set a positive integer or "auto"')
        return None


def set_batch_related(
    micro: int | None, gas: int | None, tbs: int | None, world: int, source: str
) -> tuple[int, int, int]:
    """deepspeed/runtime/config.py ``_set_batch_related_parameters`` + ``_batch_assertion``.

    Args:
        micro: ``train_micro_batch_size_per_gpu`` (None when absent).
        gas: ``gradient_accumulation_steps`` (None when absent).
        tbs: ``train_batch_size`` (None when absent).
        world: Data-parallel world size.
        source: The file name, for messages.

    Returns:
        ``(micro, gas, train_batch_size)`` with the missing ones derived.

    Raises:
        ConfigError: Neither train_batch_size nor the micro batch given, a derived zero batch, or the
            three not multiplying out (DeepSpeed's assertion).
    """
    if micro is not None and gas is not None and tbs is not None:
        m, g, t = micro, gas, tbs
    elif tbs is not None and micro is not None:
        m, g, t = micro, tbs // micro // world, tbs
    elif tbs is not None and gas is not None:
        m, g, t = tbs // world // gas, gas, tbs
    elif micro is not None and gas is not None:
        m, g, t = micro, gas, micro * gas * world
    elif tbs is not None:
        m, g, t = tbs // world, 1, tbs
    elif micro is not None:
        m, g, t = micro, 1, micro * world
    else:
        raise ConfigError(
            f"{source}: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided "
            '(DeepSpeed\'s message); set train_micro_batch_size_per_gpu to "auto"'
        )
    micro, gas, tbs = m, g, t
    if micro <= 0 or gas <= 0:
        raise ConfigError(
            f"{source}: train_batch_size {tbs} is smaller than world_size {world} x the other batch keys, "
            f'so DeepSpeed derives a zero batch; set train_batch_size to "auto"'
        )
    if tbs != micro * gas * world:
        raise ConfigError(
            f"{source}: Check batch related parameters. train_batch_size is not equal to "
            f"micro_batch_per_gpu * gradient_acc_step * world_size {tbs} != {micro} * {gas} * {world} "
            '(DeepSpeed\'s assertion); set train_batch_size to "auto" or make it equal that product'
        )
    return micro, gas, tbs
