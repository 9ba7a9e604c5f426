"""Built-in data: official model configs (with where each came from) and GPU datasheet numbers.

- :mod:`.models`: ``config.json`` files of common models, found offline by Hub id;
- :mod:`.gpus`: memory and peak throughput per GPU name, with sources;
- :mod:`.envelope_cells`: the checked envelope's cells (kinds of run whose formulas match a trace), written by
  the benchmarks that check them, and the ranges of shapes each kind was checked over (``envelope_ranges.json``).
"""

from fitcheck.catalog.envelope_cells import (
    ENVELOPE_CELLS_FILE,
    CellBlock,
    EnvelopeKey,
    dump_envelope_blocks,
    envelope_blocks,
    envelope_cells,
    envelope_probe_misses,
    envelope_ranges,
    parse_envelope_blocks,
)
from fitcheck.catalog.gpus import GpuInfo, known_gpus, lookup_gpu, resolve_gpu, similar_gpus
from fitcheck.catalog.models import catalog_ids, find_catalog_config, similar_catalog_ids

__all__ = [
    "ENVELOPE_CELLS_FILE",
    "CellBlock",
    "EnvelopeKey",
    "GpuInfo",
    "catalog_ids",
    "dump_envelope_blocks",
    "envelope_blocks",
    "envelope_cells",
    "envelope_probe_misses",
    "envelope_ranges",
    "find_catalog_config",
    "known_gpus",
    "lookup_gpu",
    "parse_envelope_blocks",
    "resolve_gpu",
    "similar_catalog_ids",
    "similar_gpus",
]
