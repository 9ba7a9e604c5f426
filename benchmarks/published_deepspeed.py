"""A published row's DeepSpeed settings read by fitcheck's own readers, as ``fitcheck estimate`` reads them.

A DeepSpeed row carries its configuration as the run gave it, in one of two keys:

- ``deepspeed_config``: the DeepSpeed JSON (``--deepspeed ds_config.json``), ``"auto"`` values included;
- ``accelerate_config``: the accelerate config YAML as a mapping (``accelerate launch --config_file``), whose
  ``deepspeed_config`` section accelerate turns into a DeepSpeed dict (``DeepSpeedPlugin.__post_init__``).

Either is written to a temporary file and read by the reader the CLI uses (``read_accelerate_config`` for the
accelerate file, then ``resolve_deepspeed``): ``"auto"`` is resolved against the row's micro-batch, gradient
accumulation and bf16/fp16 as transformers' ``HfTrainerDeepSpeedConfig`` resolves it (the hidden-size keys from
the model's ``hidden_size``), the ``zero_optimization`` keys are checked against DeepSpeed's, and accelerate's
``zero3_init_flag`` is applied as ``fitcheck/readers/merge.py`` applies it. A config the reader refuses, or whose
findings are errors (a value that disagrees with the row's TrainingArguments: transformers raises at Trainer start)
or not-modelled features (tensor/pipeline parallel, ZeRO++, partial offload), is the row's skip reason.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from fitcheck.spec import DeepSpeedSpec, MixedPrecision, ShardingSpec, Strategy

# A stand-in hidden size to check, before the model is loaded, that the config is readable; the row's
# ShardingSpec is read again with the model's own hidden_size when its TrainingSpec is built.
_CHECK_HIDDEN = 4096


def is_deepspeed_row(row: Mapping[str, Any]) -> bool:
    """True when the row ran under DeepSpeed (its ``distributed`` text or a DeepSpeed/accelerate config)."""
    return "deepspeed" in str(row.get("distributed")).lower() or bool(
        row.get("deepspeed_config") or row.get("accelerate_config")
    )


def read_deepspeed_sharding(row: Mapping[str, Any], hidden_size: int | None = None) -> ShardingSpec | str:
    """The row's DeepSpeed run as a :class:`ShardingSpec`, read by fitcheck's DeepSpeed reader.

    Args:
        row: A published row whose ``deepspeed_config`` or ``accelerate_config`` gives its configuration.
        hidden_size: The model's hidden size (fills the hidden-size based ``"auto"`` keys); None to check the
            config only (a stand-in fills them).

    Returns:
        The sharding, or why the row cannot be expressed (the reader's refusal or error findings).
    """
    from published_fields import read_precision

    from fitcheck.errors import FitcheckError
    from fitcheck.findings import Severity
    from fitcheck.readers import read_accelerate_config, resolve_deepspeed

    n = int(row.get("num_gpus") or 1)
    mixed = read_precision(row).mixed_precision  # the row's TrainingArguments bf16/fp16
    run: dict[str, object] = {
        "per_device_train_batch_size": int(row["micro_batch_size"]),
        "gradient_accumulation_steps": int(row.get("grad_accum") or 1),
        "bf16": mixed is MixedPrecision.BF16,
        "fp16": mixed is MixedPrecision.FP16,
    }
    zero3_init: bool | None = None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if row.get("accelerate_config"):
                path = Path(tmp) / "accelerate_config.json"
                path.write_text(json.dumps(row["accelerate_config"]))
                acc = read_accelerate_config(str(path))
                if acc.deepspeed is None:
                    return "the row's accelerate config names no inline DeepSpeed settings"
                raw: Mapping[str, object] = acc.deepspeed
                source, zero3_init = "accelerate_config:deepspeed_config", acc.zero3_init
            elif row.get("deepspeed_config"):
                raw, source = row["deepspeed_config"], "ds_config.json"
            else:
                return "DeepSpeed row without its deepspeed_config or accelerate_config"
            read = resolve_deepspeed(
                raw,
                source=source,
                run=run,
                run_provenance={k: "row" for k in run},
                world_size=n,
                hidden_size=hidden_size or _CHECK_HIDDEN,
            )
        except FitcheckError as exc:
            return "fitcheck's DeepSpeed reader refuses it: " + str(exc).replace(tmp, "")
    # errors (transformers/accelerate refuse the run) and "not-modelled" warnings (a parallelism the estimate
    # would treat as plain data parallel) both make the row not comparable
    refused = [f.message for f in read.findings if f.severity is Severity.ERROR or f.code == "not-modelled"]
    if refused:
        return "fitcheck's DeepSpeed reader: " + "; ".join(refused)
    spec: DeepSpeedSpec = read.spec if zero3_init is None else replace(read.spec, zero3_init=zero3_init)
    return ShardingSpec(strategy=Strategy.DEEPSPEED, num_processes=n, deepspeed=spec)
