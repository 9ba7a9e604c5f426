"""The GPU table: names, aliases, unknown names, and sanity of every row's numbers."""

from __future__ import annotations

import pytest

from fitcheck.catalog.gpus import gpu_names, known_gpus, lookup_gpu, resolve_gpu
from fitcheck.errors import ConfigError

MIB = 1 << 20

# Issue 2's list (H100-PCIe is an extra row: its peak is 24% lower than the SXM part).
REQUIRED = [
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H200-141GB",
    "L4-24GB",
    "A10G-24GB",
    "L40S-48GB",
    "RTX3090-24GB",
    "RTX4090-24GB",
    "V100-16GB",
    "V100-32GB",
    "T4-16GB",
    "MI300X-192GB",
]


# Issue 12: current data-centre and workstation cards.
REQUIRED_2025 = [
    "B200-180GB", "B300-288GB", "GB200-186GB", "RTX5090-32GB", "RTX-PRO-6000-Blackwell-96GB", "H20-96GB",
    "H200-NVL-141GB", "GH200-96GB", "GH200-144GB", "H100-NVL-94GB", "RTX6000-Ada-48GB", "L40-48GB", "A40-48GB",
    "RTXA6000-48GB", "MI325X-256GB",
]


def test_table_covers_issue_list() -> None:
    assert set(REQUIRED) | set(REQUIRED_2025) <= set(gpu_names())


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("h100", "H100-80GB"),
        ("H100-80GB", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("h100-pcie", "H100-PCIe-80GB"),
        ("4090", "RTX4090-24GB"),
        ("rtx4090", "RTX4090-24GB"),
        ("RTX4090-24GB", "RTX4090-24GB"),
        ("NVIDIA GeForce RTX 3090", "RTX3090-24GB"),
        ("a100", "A100-40GB"),
        ("A100-80GB", "A100-80GB"),
        ("a100_80gb", "A100-80GB"),
        ("A100-80", "A100-80GB"),
        ("a100-sxm4-80gb", "A100-80GB"),
        ("h200", "H200-141GB"),
        ("L4", "L4-24GB"),
        ("a10g", "A10G-24GB"),
        ("l40s", "L40S-48GB"),
        ("v100", "V100-16GB"),
        ("V100-32GB", "V100-32GB"),
        ("Tesla T4", "T4-16GB"),
        ("mi300x", "MI300X-192GB"),
    ],
)
def test_lookup_aliases(typed: str, name: str) -> None:
    assert lookup_gpu(typed).name == name


def test_unknown_gpu_lists_names_and_suggests_gpu_memory() -> None:
    with pytest.raises(ConfigError) as err:
        lookup_gpu("B100")
    message = str(err.value)
    assert "B100" in message and "--gpu_memory" in message
    for name in REQUIRED:
        assert name in message


def test_a10_is_not_silently_an_a10g() -> None:
    with pytest.raises(ConfigError):
        lookup_gpu("a10")


def test_memory_is_what_torch_reports_not_the_marketing_number() -> None:
    # torch printouts cited in gpus.json (total_memory=...MB is totalGlobalMem // 2**20).
    assert lookup_gpu("h100").memory_bytes == 81089 * MIB
    assert lookup_gpu("h200").memory_bytes == 143156 * MIB
    assert lookup_gpu("a100-80gb").memory_bytes == 81049 * MIB
    assert lookup_gpu("a100-40gb").memory_bytes == 42_298_834_944  # deviceQuery, exact bytes
    assert lookup_gpu("l4").memory_bytes == 23_612_293_120
    assert lookup_gpu("4090").memory_bytes == 24563 * MIB


@pytest.mark.parametrize("info", known_gpus(), ids=lambda g: g.name)
def test_every_row_is_plausible_and_sourced(info: object) -> None:
    from fitcheck.catalog.gpus import GpuInfo

    assert isinstance(info, GpuInfo)
    nominal_gb = int(info.name.rsplit("-", 1)[1].removesuffix("GB"))
    # Usable memory is below the nominal size in binary units and above 90% of it in decimal units.
    assert info.memory_basis in ("deviceQuery", "torch-total_memory", "nvidia-smi", "datasheet")
    if info.memory_basis == "datasheet":  # vendor capacity, GB read as GiB: the note says torch reports less
        assert info.memory_bytes == nominal_gb * 2**30 and "--gpu_memory" in info.note
    else:
        assert 0.9 * nominal_gb * 1e9 < info.memory_bytes < nominal_gb * 2**30
    assert "memory:" in info.source and "Peak:" in info.source
    if info.name.startswith(("V100", "T4")):
        assert info.peak_tflops_bf16 is None  # Volta / Turing have no bf16 tensor cores
        assert info.peak_tflops_fp16 is not None and info.peak_tflops_fp16 > 0
    else:
        assert info.peak_tflops_bf16 is not None and 50 < info.peak_tflops_bf16 <= 2500


def test_dense_not_sparse_peaks() -> None:
    assert lookup_gpu("h100").peak_tflops_bf16 == 989.5  # 1,979 is the 2:4-sparsity figure
    assert lookup_gpu("a100").peak_tflops_bf16 == 312.0
    assert lookup_gpu("mi300x").peak_tflops_bf16 == 1307.4


@pytest.mark.parametrize(
    ("device_name", "name"),
    [  # torch.cuda.get_device_properties(i).name strings, as printed in the sources cited in gpus.json
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIe-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA L4", "L4-24GB"),
        ("NVIDIA A10G", "A10G-24GB"),
        ("NVIDIA L40S", "L40S-48GB"),
        ("NVIDIA GeForce RTX 3090", "RTX3090-24GB"),
        ("NVIDIA GeForce RTX 4090", "RTX4090-24GB"),
        ("Tesla V100-SXM2-16GB", "V100-16GB"),
        ("Tesla V100-PCIE-32GB", "V100-32GB"),
        ("Tesla T4", "T4-16GB"),
        ("AMD Instinct MI300X", "MI300X-192GB"),
    ],
)
def test_torch_device_names_resolve(device_name: str, name: str) -> None:
    assert lookup_gpu(device_name).name == name


@pytest.mark.parametrize(
    ("smi_name", "name"),
    [  # `nvidia-smi --query-gpu=name` output, as quoted in the sources cited in gpus.json
        ("NVIDIA B200", "B200-180GB"),
        ("NVIDIA GB200", "GB200-186GB"),
        ("NVIDIA GeForce RTX 5090", "RTX5090-32GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX-PRO-6000-Blackwell-96GB"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000-Blackwell-96GB"),
        ("NVIDIA H20", "H20-96GB"),
        ("NVIDIA H200 NVL", "H200-NVL-141GB"),
        ("NVIDIA H100 NVL", "H100-NVL-94GB"),
        ("NVIDIA GH200 480GB", "GH200-96GB"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX6000-Ada-48GB"),
        ("NVIDIA L40", "L40-48GB"),
        ("NVIDIA A40", "A40-48GB"),
        ("NVIDIA RTX A6000", "RTXA6000-48GB"),
    ],
)
def test_nvidia_smi_names_resolve_without_assumption(smi_name: str, name: str) -> None:
    info, assumed = resolve_gpu(smi_name)
    assert info.name == name and assumed is None


@pytest.mark.parametrize(
    ("typed", "name", "alternatives"),
    [
        ("A100", "A100-40GB", ["A100-80GB"]),
        ("h100", "H100-80GB", ["H100-PCIe-80GB", "H100-NVL-94GB"]),
        ("v100", "V100-16GB", ["V100-32GB"]),
        ("GH200", "GH200-96GB", ["GH200-144GB"]),
    ],
)
def test_ambiguous_names_resolve_with_an_assumed_line(typed: str, name: str, alternatives: list[str]) -> None:
    info, assumed = resolve_gpu(typed)
    assert info.name == name and assumed is not None
    assert f"assumed {name}" in assumed and all(a in assumed for a in alternatives)


def test_ambiguous_gpu_reaches_the_report_assumptions() -> None:
    from fitcheck.cli.estimate import spec_from_values

    _, assumptions = spec_from_values({"model_name_or_path": "gpt2", "gpu": "A100"}, env={})
    assert any("assumed A100-40GB" in line for line in assumptions)
    _, exact = spec_from_values({"model_name_or_path": "gpt2", "gpu": "NVIDIA A100-SXM4-40GB"}, env={})
    assert not any("ambiguous" in line for line in exact)


def test_blackwell_peaks_are_dense() -> None:
    assert lookup_gpu("b200").peak_tflops_bf16 == 2250.0  # 4.5 PFLOPS is the 2:4-sparsity figure
    assert lookup_gpu("5090").peak_tflops_bf16 == 209.5  # FP32 accumulate; 838 TFLOPS is sparse FP16-acc
    assert lookup_gpu("b200").memory_bytes == 182631 * MIB  # torch printout cited in gpus.json


@pytest.mark.parametrize(
    "other", ["NVIDIA A10", "Tesla V100S-PCIE-32GB", "NVIDIA B100"]
)
def test_different_cards_are_not_mapped_to_a_neighbour(other: str) -> None:
    with pytest.raises(ConfigError):
        lookup_gpu(other)
