"""Built-in data: official model configs (with where each came from) and GPU datasheet numbers.

- :mod:`.models`: ``config.json`` files of common models, found offline by Hub id;
- :mod:`.gpus`: memory and peak throughput per GPU name, with sources.
"""

from fitcheck.catalog.gpus import lookup_gpu, resolve_gpu
from fitcheck.catalog.models import catalog_ids, find_catalog_config

__all__ = ["catalog_ids", "find_catalog_config", "lookup_gpu", "resolve_gpu"]
