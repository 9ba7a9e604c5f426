"""The REAL ``Accelerator.prepare`` under FSDP1 and FSDP2 with ``mixed_precision="bf16"``, on 2 gloo ranks on CPU:
the dtype and bytes of each rank's trainable shards and optimizer states after one step, vs fitcheck.

accelerate 1.15 only switches to ``DistributedType.FSDP`` on accelerator devices (``state.py``: the FSDP branch
sits under the MULTI_GPU/... types); on CPU the state is ``MULTI_CPU``. The run therefore sets the shared state to
``DistributedType.FSDP`` with the plugin's ``set_mixed_precision("bf16")`` (what ``AcceleratorState.__init__``
does on GPUs) and the device to ``cpu`` (FSDP1 refuses ``device_id=cpu:0`` against the CPU compute device). From
there the real ``Accelerator.prepare`` runs: ``fsdp2_prepare_model`` (FSDP2) or ``FSDP(model, ...)`` plus the
flat-parameter upcast (FSDP1), then the real step (AdamW, ``accelerator.backward``).

Run: ``PYTHONPATH=. python benchmarks/fsdp_upcast_cpu.py`` (exit 1 when a row is off).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from dataclasses import replace
from typing import Any

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
WORLD = 2


def _rank(rank: int, version: int, dtype: str, mp: str, port: int, out: str) -> None:
    from benchmarks.gloo_rank import fsdp_on_cpu, start_rank

    start_rank(rank, WORLD, port)  # without inherited accelerate/FSDP switches, in an explicit gloo group
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import transformers
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.tensor import DTensor

    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k not in ("model_type", "architectures")})
    kw: dict[str, Any] = {"fsdp_version": version, "auto_wrap_policy": "transformer_based_wrap",
                          "transformer_cls_names_to_wrap": ["LlamaDecoderLayer"]}
    if version == 1:
        kw["use_orig_params"] = True
    plugin = FullyShardedDataParallelPlugin(**kw)
    acc = Accelerator(cpu=True, mixed_precision=mp)
    fsdp_on_cpu(acc, plugin)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)

    def local(t: Any) -> Any:
        return t._local_tensor if isinstance(t, DTensor) else t

    params: dict[str, int] = {}
    if version == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        tensors = [m._flat_param for m in FSDP.fsdp_modules(model) if m._has_params]
    else:
        tensors = [local(p) for p in model.parameters()]
    for t in tensors:
        params[str(t.dtype).removeprefix("torch.")] = params.get(str(t.dtype).removeprefix("torch."), 0) + (
            t.numel() * t.element_size())
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    states: dict[str, int] = {}
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.dim():
                t = local(v)
                key = str(t.dtype).removeprefix("torch.")
                states[key] = states.get(key, 0) + t.numel() * t.element_size()
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump({"params": params, "states": states}, fh)
    dist.destroy_process_group()


def measure(version: int, dtype: str, mp: str = "bf16") -> list[dict[str, dict[str, int]]]:
    """Per rank: bytes of the trainable shards and of the optimizer states, by dtype, after one real step.

    Args:
        version: FSDP version (1 or 2).
        dtype: The dtype the model is loaded in (``bfloat16`` / ``float32``).
        mp: accelerate ``mixed_precision``.

    Returns:
        One ``{"params": {dtype: bytes}, "states": {dtype: bytes}}`` per rank.
    """
    import torch.multiprocessing as mp_

    from benchmarks.gloo_rank import free_port

    port = int(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "dtypes")
        mp_.start_processes(_rank, args=(version, dtype, mp, port, out), nprocs=WORLD, join=True,
                            start_method="spawn")  # forked ranks inherited the parent's AcceleratorState
        rows = []
        for rank in range(WORLD):
            with open(f"{out}.{rank}", encoding="utf-8") as fh:
                rows.append(json.load(fh))
    return rows


def estimate_for(version: int, dtype: str, mp: str = "bf16") -> Any:
    """fitcheck's report for the same run (2 processes, FSDP FULL_SHARD, device_type cpu)."""
    from benchmarks.cpu_truth import Row, spec_for
    from fitcheck.core import estimate
    from fitcheck.spec import FsdpSpec, ShardingSpec, Strategy

    spec = spec_for(Row("fsdp-upcast", TINY, seq=16, batch=2, dtype=dtype, mp=mp, optim="adamw_torch"))
    spec = replace(spec, sharding=ShardingSpec(Strategy.FSDP, WORLD, 1, None, FsdpSpec(version=version)))
    return estimate(spec)


def component(report: Any, name: str) -> int:
    """Bytes of one component of a report (0 when absent)."""
    return sum(c.peak_bytes for c in report.components if c.name == name)


def main() -> int:
    """Print real vs estimated trainable-shard and optimizer-state bytes per FSDP version and load dtype."""
    print(f"{'fsdp':>4} {'load':9} {'mp':5} {'real params':>18} {'est':>8} {'real states':>18} {'est':>8}")
    worst = 0.0
    for version in (1, 2):
        for dtype, mp in (("bfloat16", "bf16"), ("float32", "bf16"), ("bfloat16", "no")):
            real = measure(version, dtype, mp)[0]
            rep = estimate_for(version, dtype, mp)
            est_p, est_s = component(rep, "weights.trainable"), component(rep, "optimizer.states")
            real_p, real_s = sum(real["params"].values()), sum(real["states"].values())
            worst = max(worst, abs(est_p - real_p) / real_p, abs(est_s - real_s) / real_s)
            print(f"{version:>4} {dtype:9} {mp:5} {json.dumps(real['params']):>18} {est_p:>8} "
                  f"{json.dumps(real['states']):>18} {est_s:>8}")
    print(f"worst |error| {worst:.2%}")
    return 0 if worst <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
