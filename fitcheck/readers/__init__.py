"""Readers: one per input format; raw dicts stop here and leave as typed spec pieces with provenance.

- :mod:`.model_config`: ``config.json`` (directory, file, HF cache, built-in catalog) -> ``ModelInventory``
  (known families in pure Python: :mod:`.families`; others through a meta-device builder the caller passes);
- :mod:`.trainer_args`: TrainingArguments / TRL fields (object, file, or a script's own flags);
- :mod:`.deepspeed` (+ ``deepspeed_zero``, ``deepspeed_batch``, ``deepspeed_optimizer``: the config's own
  optimizer): DeepSpeed JSON, ``"auto"`` resolved as transformers does; :mod:`.fsdp_config`: FSDP options;
  :mod:`.accelerate_config`: accelerate's YAML;
- :mod:`.peft_config`, :mod:`.quantization_config`: adapter and bitsandbytes configs;
- :mod:`.task_heads`: the task head (``architectures`` / ``--task``: seq-cls, token-cls, image-text-to-text);
- :mod:`.axolotl`, :mod:`.llamafactory` (+ :mod:`.framework_yaml`): a framework's YAML read as the same
  settings the flags give, with the framework's defaults;
- :mod:`.parallelism`: the tp/cp/sp/HSDP layout (accelerate ``ParallelismConfig``) and accelerate's checks;
- :mod:`.settings_table`: the one table of run settings (names, spellings, kinds, CLI flags);
  :mod:`.run_settings`: ``RunSettings``, one typed value per setting with its default and provenance;
- :mod:`.merge`: every source of one run merged by precedence into ``RunSettings``; :mod:`.run_args`:
  settings -> spec; :mod:`.trl_settings`: ``--trainer`` and TRL's config fields -> ``TrainerSpec``;
  :mod:`.trl_source`: TRL's config classes read from the installed source with ``ast`` (no import of trl/torch).

Where a new reader goes: a module here returning spec pieces (and findings), merged in :mod:`.merge`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fitcheck.families import ConfigView, mlp_kind
from fitcheck.readers.accelerate_config import default_config_path, read_accelerate_config
from fitcheck.readers.deepspeed import ACCELERATE_ZERO_STAGE, accelerate_deepspeed_config, resolve_deepspeed
from fitcheck.readers.deepspeed_optimizer import read_config_optimizer
from fitcheck.readers.families_legacy import inventory_for_stack
from fitcheck.readers.fsdp_config import fsdp_from_config, fsdp_option_string
from fitcheck.readers.merge import merge_sources
from fitcheck.readers.model_config import MetaFallback, inventory_from_config, load_inventory
from fitcheck.readers.parallelism import PARALLELISM_FLAGS, read_parallelism
from fitcheck.readers.peft_config import (
    TRACED_PEFT_TYPES,
    adapter_from_mapping,
    adapter_from_object,
    read_adapter_config,
    refuse_unmodelled_lora_settings,
)
from fitcheck.readers.run_args import spec_from_settings, spec_from_values
from fitcheck.readers.run_settings import CliFlag, RunSettings, cli_flags
from fitcheck.readers.settings_table import SETTINGS, canonical_key
from fitcheck.readers.sources import read_text_file, safe_json_load, safe_yaml_load
from fitcheck.readers.task_heads import (
    TASKS,
    classifier_inventory,
    pure_task_supported,
    resolve_image_tokens,
    spec_for_task,
    task_config,
    task_from_config,
    with_task,
)
from fitcheck.readers.trainer_args import read_script_argv, read_training_args_object
from fitcheck.readers.trl_settings import TRL_FLAG_NAMES, trainer_kind, trainer_spec, trl_default_layer
from fitcheck.readers.versions import installed_stack, parse_stack

if TYPE_CHECKING:  # imported on first use (PEP 562, ``__getattr__``): a run without a framework YAML,
    # ``--seq_lengths`` or a TRL trainer (trl_source) never reads them (axolotl 11.3, llamafactory 8.5,
    # seq_lengths 1.5 ms of a formula answer's imports at load ~7, session 18)
    from fitcheck.readers.axolotl import read_axolotl
    from fitcheck.readers.framework_yaml import FrameworkRun
    from fitcheck.readers.llamafactory import read_llamafactory, resolve_freeze
    from fitcheck.readers.seq_lengths import check_seq_lengths, parse_seq_lengths
    from fitcheck.readers.trl_source import ConfigSource, read_config_class, read_config_fields

_WHERE = {"read_axolotl": "axolotl", "FrameworkRun": "framework_yaml", "read_llamafactory": "llamafactory",
          "resolve_freeze": "llamafactory", "check_seq_lengths": "seq_lengths", "parse_seq_lengths": "seq_lengths",
          "ConfigSource": "trl_source", "read_config_class": "trl_source", "read_config_fields": "trl_source"}

__all__ = [
    "ACCELERATE_ZERO_STAGE",
    "PARALLELISM_FLAGS",
    "SETTINGS",
    "TASKS",
    "TRACED_PEFT_TYPES",
    "TRL_FLAG_NAMES",
    "CliFlag",
    "ConfigSource",
    "ConfigView",
    "FrameworkRun",
    "MetaFallback",
    "RunSettings",
    "accelerate_deepspeed_config",
    "adapter_from_mapping",
    "adapter_from_object",
    "canonical_key",
    "check_seq_lengths",
    "classifier_inventory",
    "cli_flags",
    "default_config_path",
    "fsdp_from_config",
    "fsdp_option_string",
    "installed_stack",
    "inventory_for_stack",
    "inventory_from_config",
    "load_inventory",
    "merge_sources",
    "mlp_kind",
    "parse_seq_lengths",
    "parse_stack",
    "pure_task_supported",
    "read_accelerate_config",
    "read_adapter_config",
    "read_axolotl",
    "read_config_class",
    "read_config_fields",
    "read_config_optimizer",
    "read_llamafactory",
    "read_parallelism",
    "read_script_argv",
    "read_text_file",
    "read_training_args_object",
    "refuse_unmodelled_lora_settings",
    "resolve_deepspeed",
    "resolve_freeze",
    "resolve_image_tokens",
    "safe_json_load",
    "safe_yaml_load",
    "spec_for_task",
    "spec_from_settings",
    "spec_from_values",
    "task_config",
    "task_from_config",
    "trainer_kind",
    "trainer_spec",
    "trl_default_layer",
    "with_task",
]


def __getattr__(name: str) -> Any:
    """Import the reader module that defines ``name`` on first use (the framework YAML readers, ``--seq_lengths``)."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"fitcheck.readers.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'fitcheck.readers' has no attribute {name!r}")
