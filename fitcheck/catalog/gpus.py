"""The GPU table: memory as torch reports it, dense bf16 peak, and where each number comes from.

The data lives in ``gpus.json`` beside this module (each row cites its source). Names are matched
case-insensitively, ignoring spaces, ``-`` and ``_`` and a leading vendor word (``NVIDIA``, ``GeForce``,
``Tesla``, ``AMD``, ``Instinct``), so ``A100-80GB``, ``a100_80gb``, ``NVIDIA A100 80GB PCIe`` and the
aliases listed per row (``h100``, ``4090``, ``rtx4090``, ...) all resolve. Pure: no torch, no env reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from fitcheck.errors import ConfigError

_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "amd", "instinct")


@dataclass(frozen=True)
class GpuInfo:
    """One GPU model.

    Attributes:
        name: Canonical name, e.g. ``"H100-80GB"``.
        memory_bytes: ``torch.cuda.get_device_properties(i).total_memory`` as a public printout shows it.
        peak_tflops_bf16: Dense bf16 tensor-core peak (no sparsity); None when the GPU has no bf16 hardware.
        source: Where the memory and peak numbers come from.
        peak_tflops_fp16: Dense fp16 tensor-core peak (with fp32 accumulate where the sheet distinguishes).
        memory_basis: ``"deviceQuery"`` (exact bytes) or ``"torch-total_memory"`` (MiB printout x 2**20).
        aliases: Other names that resolve to this GPU.
        note: Caveats (ambiguous alias, no bf16 support, ...); empty when none.
        assumed_for: Short names that could mean several cards (``a100``, ``h100``); they resolve to this row
            by assumption, and :func:`resolve_gpu` says so.
    """

    name: str
    memory_bytes: int
    peak_tflops_bf16: float | None
    source: str
    peak_tflops_fp16: float | None = None
    memory_basis: str = ""
    aliases: tuple[str, ...] = ()
    note: str = ""
    assumed_for: tuple[str, ...] = ()


def _normalize(name: str) -> str:
    """Lower-case, drop separators and leading vendor words: ``"NVIDIA A100-80GB"`` -> ``"a10080gb"``."""
    words = [w for w in re.split(r"[\s_\-./]+", name.strip().lower()) if w]
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    return "".join(words)


def _keys(info: GpuInfo) -> set[str]:
    """Every normalized spelling that resolves to ``info``."""
    keys = {_normalize(info.name), *(_normalize(a) for a in info.aliases)}
    # "A100-80GB" is also typed "A100-80" / "a100 80g": accept the memory size without its unit.
    for key in list(keys):
        if key.endswith("gb") and key[:-2][-1:].isdigit():
            keys.update({key[:-2], key[:-1]})
    return keys


@lru_cache(maxsize=1)
def _table() -> tuple[tuple[GpuInfo, ...], dict[str, GpuInfo]]:
    """Load gpus.json once (importlib.resources: works from a wheel)."""
    raw = json.loads(resources.files("fitcheck.catalog").joinpath("gpus.json").read_text(encoding="utf-8"))
    infos: list[GpuInfo] = []
    index: dict[str, GpuInfo] = {}
    for row in raw["gpus"]:
        info = GpuInfo(
            name=row["name"],
            memory_bytes=int(row["memory_bytes"]),
            peak_tflops_bf16=row["peak_tflops_bf16"],
            source=f"memory: {row['memory_source']} Peak: {row['tflops_source']}",
            peak_tflops_fp16=row.get("peak_tflops_fp16"),
            memory_basis=row.get("memory_basis", ""),
            aliases=tuple(row.get("aliases", ())),
            note=row.get("note", ""),
            assumed_for=tuple(row.get("assumed_for", ())),
        )
        infos.append(info)
        for key in _keys(info):
            if key in index and index[key] is not info:
                raise RuntimeError(f"gpus.json: alias {key!r} names both {index[key].name} and {info.name}")
            index[key] = info
    return tuple(infos), index


def known_gpus() -> tuple[GpuInfo, ...]:
    """All GPUs in the table, in table order."""
    return _table()[0]


def gpu_names() -> list[str]:
    """Canonical GPU names, in table order."""
    return [g.name for g in known_gpus()]


def resolve_gpu(name: str) -> tuple[GpuInfo, str | None]:
    """Find a GPU like :func:`lookup_gpu`, and say what was assumed when the name could mean several cards.

    Args:
        name: A table name, an alias, or what ``nvidia-smi --query-gpu=name`` prints
            (``"NVIDIA H100 80GB HBM3"``, ``"NVIDIA A100-SXM4-40GB"``, ``"NVIDIA GeForce RTX 4090"``).

    Returns:
        The row and, for an ambiguous short name (``a100``, ``h100``, ``h200``, ``v100``, ``gh200``), one line
        for the report's "assumed" list; None when the name is exact.

    Raises:
        ConfigError: If the name is not in the table.
    """
    info = lookup_gpu(name)
    key = _normalize(str(name))
    if key not in {_normalize(a) for a in info.assumed_for}:
        return info, None
    others = [g.name for g in known_gpus() if g is not info and _normalize(g.name).startswith(key)]
    also = f" (could also be {', '.join(others)})" if others else ""
    return info, (
        f"--gpu {name}: ambiguous name{also}; assumed {info.name}, {info.memory_bytes / 2**30:.1f} GiB. "
        "Name the card as nvidia-smi prints it, or pass --gpu_memory"
    )


def lookup_gpu(name: str) -> GpuInfo:
    """Find a GPU by name or alias, case-insensitively.

    Args:
        name: E.g. ``"A100-80GB"``, ``"h100"``, ``"4090"``, ``"rtx4090"``, ``"NVIDIA L40S"``.

    Returns:
        The table row.

    Raises:
        ConfigError: If the name is not in the table; the message lists the known names and suggests
            ``--gpu_memory``.
    """
    info = _table()[1].get(_normalize(str(name)[:200]))
    if info is None:
        close = similar_gpus(str(name))
        mean = f" Did you mean {' or '.join(close)}?" if close else ""
        raise ConfigError(
            f"--gpu: unknown GPU {str(name)[:80]!r}.{mean} Known GPUs: {', '.join(gpu_names())}. "
            "For another GPU pass its memory instead, e.g. --gpu_memory 80GiB "
            "(torch.cuda.get_device_properties(0).total_memory on that machine)."
        )
    return info


def similar_gpus(name: str, n: int = 3) -> list[str]:
    """Table names close to a mistyped GPU name, best first (``difflib`` on the normalized spellings)."""
    import difflib

    index = _table()[1]
    found = difflib.get_close_matches(_normalize(name[:200]), list(index), n=n * 3, cutoff=0.5)
    return list(dict.fromkeys(index[k].name for k in found))[:n]
