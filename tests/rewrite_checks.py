"""What the tests of a rewritten whole run (DeepSpeed's, FSDP2's, FSDP1's) check of a traced answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def takes_the_replay(spec: Any, whole_run: Callable[..., Any]) -> Any:
    """A traced answer of ``spec`` (``PinnedPath("always")``): no ``reserved-published-gap`` INFO, and its reserved
    is the estimate with the gap of the rewritten run's replay (``whole_run``: ``deepspeed_run_events.whole_run``,
    ``fsdp2_run_events.whole_run``). Returns (the path, the report, the replay)."""
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import PinnedPath
    from fitcheck.torch_adapters.pinned_path import _cache_key

    path = PinnedPath("always")
    report = path(spec)
    assert "reserved-published-gap" not in {f.code for f in report.findings}
    replay = whole_run(path, spec, _cache_key(spec))
    traced = tuple(c for c in report.components if c.name.endswith(".traced"))
    # the replay of the rank's own run: its gap fraction and its own reserved bytes (ReplayedGap)
    assert report.peak_reserved_bytes == estimate(spec, activations=traced,
                                                  replayed=replay.measured(True)).peak_reserved_bytes
    return path, report, replay


def fsdp_values(tmp_path: Any, version: int) -> dict[str, Any]:
    """CLI values of a traced FSDP``version`` run of the tiny Llama (``deepspeed_run_events_cpu.CONFIG``, bf16
    loaded, ``--bf16``, fused AdamW) with its config and ``fsdp_config`` written under ``tmp_path``."""
    import json

    from deepspeed_run_events_cpu import CONFIG

    (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "torch_dtype": "bfloat16"}), encoding="utf-8")
    fsdp = tmp_path / "fsdp.json"
    fsdp.write_text(json.dumps({"fsdp_version": version, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}),
                    encoding="utf-8")
    return {"model_name_or_path": str(tmp_path), "max_seq_length": 32, "per_device_train_batch_size": 2,
            "gpu": "H100", "dtype": "bfloat16", "bf16": True, "fsdp": "full_shard auto_wrap",
            "fsdp_config": str(fsdp), "optim": "adamw_torch_fused"}
