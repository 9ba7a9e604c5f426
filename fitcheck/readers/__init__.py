"""Readers: one per input format; raw dicts stop here and leave as typed spec pieces with provenance.

- :mod:`.model_config`: ``config.json`` (directory, file, HF cache, built-in catalog) -> ``ModelInventory``
  (known families in pure Python: :mod:`.families`; others through a meta-device builder the caller passes);
- :mod:`.trainer_args`: TrainingArguments / TRL fields (object, file, or a script's own flags);
- :mod:`.deepspeed` (+ ``deepspeed_zero``, ``deepspeed_batch``): DeepSpeed JSON, ``"auto"`` resolved as
  transformers does; :mod:`.fsdp_config`: FSDP options; :mod:`.accelerate_config`: accelerate's YAML;
- :mod:`.peft_config`, :mod:`.quantization_config`: adapter and bitsandbytes configs;
- :mod:`.merge`: every source of one run merged by precedence; :mod:`.run_args`: merged values -> spec.

Where a new reader goes: a module here returning spec pieces (and findings), merged in :mod:`.merge`.
"""

from fitcheck.readers.accelerate_config import default_config_path
from fitcheck.readers.deepspeed import resolve_deepspeed
from fitcheck.readers.families_base import ConfigView, mlp_kind
from fitcheck.readers.fsdp_config import fsdp_from_config, fsdp_option_string
from fitcheck.readers.merge import merge_sources
from fitcheck.readers.model_config import MetaFallback, inventory_from_config, load_inventory
from fitcheck.readers.peft_config import read_adapter_config
from fitcheck.readers.run_args import spec_from_values
from fitcheck.readers.trainer_args import read_script_argv, read_training_args_object

__all__ = [
    "ConfigView",
    "MetaFallback",
    "default_config_path",
    "fsdp_from_config",
    "fsdp_option_string",
    "inventory_from_config",
    "load_inventory",
    "merge_sources",
    "mlp_kind",
    "read_adapter_config",
    "read_script_argv",
    "read_training_args_object",
    "resolve_deepspeed",
    "spec_from_values",
]
