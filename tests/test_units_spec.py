"""Pure tests of byte parsing/formatting and the spec's own validation."""

from __future__ import annotations

import pytest

from fitcheck.errors import ConfigError
from fitcheck.spec import BatchSpec, DeepSpeedSpec, Dtype, LoraSpec, OffloadDevice, QuantSpec, ShardingSpec
from fitcheck.units import format_bytes, parse_bytes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("80GiB", 80 * 1024**3),
        ("24GB", 24 * 10**9),
        ("512MiB", 512 * 1024**2),
        ("1.5 TiB", int(1.5 * 1024**4)),
        ("1e9", 10**9),
        (4096, 4096),
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "-1GiB", "0", "12 parsecs", True])
def test_parse_bytes_rejects_with_the_flag_named(bad: object) -> None:
    with pytest.raises(ConfigError, match="--gpu_memory"):
        parse_bytes(bad, what="--gpu_memory")  # type: ignore[arg-type]


def test_format_bytes() -> None:
    assert format_bytes(80 * 1024**3) == "80.00 GiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(12) == "12 B"


def test_dtype_sizes() -> None:
    assert [d.nbytes for d in (Dtype.FLOAT32, Dtype.BFLOAT16, Dtype.FLOAT16, Dtype.UINT8)] == [4, 2, 2, 1]


@pytest.mark.parametrize(
    "make",
    [
        lambda: BatchSpec(micro_batch=0),
        lambda: BatchSpec(seq_len=-1),
        lambda: LoraSpec(r=0),
        lambda: LoraSpec(dropout=1.0),
        lambda: QuantSpec(bits=3),
        lambda: QuantSpec(quant_type="int4"),
        lambda: DeepSpeedSpec(stage=4),
        lambda: DeepSpeedSpec(stage=2, offload_param=OffloadDevice.CPU),
        lambda: ShardingSpec(num_processes=6, num_machines=4),
    ],
)
def test_spec_rejects_impossible_values(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_processes_per_machine_counts_like_accelerate() -> None:
    # accelerate/utils/launch.py: nproc_per_node = num_processes // num_machines (num_processes is the total)
    assert ShardingSpec(num_processes=16, num_machines=2).processes_per_machine == 8


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("bfloat16", Dtype.BFLOAT16),
        ("BF16", Dtype.BFLOAT16),
        ("torch.float32", Dtype.FLOAT32),
        ("float", Dtype.FLOAT32),
        ("half", Dtype.FLOAT16),
        ("fp16", Dtype.FLOAT16),
        ("torch.uint8", Dtype.UINT8),
        ("int8", Dtype.INT8),
        ("torch.float8_e4m3fn", None),
        ("int3", None),
        (None, None),
    ],
)
def test_dtype_names_as_configs_flags_and_torch_spell_them(name: object, expected: Dtype | None) -> None:
    assert Dtype.from_name(name) is expected
