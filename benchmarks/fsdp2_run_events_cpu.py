"""A REAL FSDP2 run (accelerate 1.15 ``Accelerator.prepare`` -> ``fsdp2_prepare_model`` -> torch 2.13
``fully_shard``) on CPU gloo ranks against ``fitcheck.torch_adapters.fsdp2_run_events``' sequence.

Each rank: the tiny Llama of ``deepspeed_run_events_cpu.py`` loaded in bf16, ``mixed_precision="bf16"`` (the
fp32 upcast, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)``, the forward under autocast), the
Accelerator's state set to FSDP on the CPU as on a GPU (``gloo_rank.fsdp_on_cpu``), torch's fused AdamW prepared
with the model (``fsdp2_switch_optimizer_parameters`` points it at the shards), two steps (forward, backward, step,
``zero_grad(set_to_none=True)``). The bytes of every storage Python reaches (a DTensor by its local shard; a
resharded parameter's storage is resized to 0) are read after ``prepare``, after each backward and after the first
step, above what was alive before ``prepare``. The same run composed from the fake-tensor trace of the plain step
(``whole_run_events``) and rewritten by ``fsdp2_run`` must leave the same live bytes (within 1 KiB per point: the
scalars of gradient clipping and autocast's cache are not modelled): the check of
``tests/test_fsdp2_run_events.py``. Not checked here: CUDA streams (one device), timing.

Run: ``PYTHONPATH=. python benchmarks/fsdp2_run_events_cpu.py`` (world sizes 1 and 2; exit 1 on a difference).
Result (2026-11-27, this checkout): world 1 and 2, the same live bytes at every point.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

POINTS = ("initialize", "backward1", "step1", "backward")
TOLERANCE = 1024


def _rank(rank: int, world: int, port: int, out: str, version: int = 2) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gloo_rank import fsdp_on_cpu, start_rank

    start_rank(rank, world, port)
    warnings.filterwarnings("ignore")
    import gc

    import torch
    import torch.distributed as dist
    import transformers
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from deepspeed_run_events_cpu import BATCH, CONFIG, SEQ
    from torch.distributed.tensor import DTensor

    cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    if version == 2:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                                reshard_after_forward=True)
    else:  # what transformers 5.23 training_args.py _process_fsdp_args passes for FSDP1 by default, except
        # sync_module_states (its broadcast asks accelerate for an accelerator device: tests/fsdp_trainer_cpu.py;
        # its buckets are freed inside prepare, so no point read here sees them)
        plugin = FullyShardedDataParallelPlugin(fsdp_version=1, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                                reshard_after_forward="FULL_SHARD", use_orig_params=True,
                                                backward_prefetch="NO_PREFETCH", sync_module_states=False,
                                                forward_prefetch=False)
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    fsdp_on_cpu(acc, plugin)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))

    def alive() -> int:
        gc.collect()
        seen: dict[int, int] = {}
        for o in gc.get_objects():
            if isinstance(o, torch.Tensor) and not isinstance(o, DTensor) and not o.is_meta:
                st = o.untyped_storage()
                if st.nbytes():
                    seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())

    live: dict[str, int] = {}
    before = alive()
    if version == 2:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        model, opt = acc.prepare(model, opt)  # FSDP2: together (the optimizer is pointed at the shards)
    else:  # FSDP1: the Trainer delays the optimizer (trainer.py _prepare_for_training: delay_optimizer_creation)
        model = acc.prepare(model)
        opt = acc.prepare(torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True))
    live["initialize"] = alive()
    for step in range(2):
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        del loss
        live["backward1" if step == 0 else "backward"] = alive()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            live["step1"] = alive()
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump({k: v - before for k, v in live.items()}, fh)
    dist.destroy_process_group()


def real(world: int, version: int = 2) -> dict[str, int]:
    """Rank 0's live bytes at :data:`POINTS` of the real FSDP``version`` run on ``world`` gloo ranks (spawned)."""
    import torch.multiprocessing as mp_

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "live")
        mp_.start_processes(_rank, args=(world, port, out, version), nprocs=world, join=True, start_method="spawn")
        with open(f"{out}.0", encoding="utf-8") as fh:
            return dict(json.load(fh))


def spec_of(world: int) -> Any:
    """fitcheck's spec of the same run (FSDP2 FULL_SHARD, ``world`` processes, bf16 loaded, ``--bf16``)."""
    from cpu_truth import Row, spec_for
    from deepspeed_run_events_cpu import BATCH, CONFIG, SEQ

    from fitcheck.spec import FsdpSpec, ShardingSpec, Strategy

    spec = spec_for(Row("tiny", CONFIG, seq=SEQ, batch=BATCH, dtype="bfloat16", mp="bf16", optim="adamw_torch_fused"))
    return replace(spec, sharding=ShardingSpec(Strategy.FSDP, world, 1, None, FsdpSpec(version=2)))


def fitcheck_live(world: int, plain: list[Any] | None = None) -> tuple[dict[str, int], list[Any]]:
    """The live bytes of ``fsdp2_run``'s sequence at :data:`POINTS` (above the traced setup), and the plain run's
    events (``plain``: reuse them; the trace does not depend on the world size)."""
    from fitcheck.torch_adapters import fsdp2_plan, fsdp2_run, live_bytes, whole_run_events

    spec = spec_of(world)
    plain = plain if plain is not None else whole_run_events(spec)
    before = sum(n for _, n, t in plain if t == "setup")
    live = live_bytes(fsdp2_run(plain, fsdp2_plan(spec)))
    return {k: v - before for k, v in live.items()}, plain


def compare(theirs: dict[str, int], mine: dict[str, int]) -> list[str]:
    """The points where the live bytes differ by more than :data:`TOLERANCE`."""
    return [f"live after {p}: real {theirs[p]} fitcheck {mine.get(p)}" for p in POINTS
            if abs(theirs[p] - mine.get(p, 0)) > TOLERANCE]


def main() -> int:
    """Compare world sizes 1 and 2; exit 1 on a difference."""
    bad, plain = 0, None
    for world in (1, 2):
        mine, plain = fitcheck_live(world, plain)
        theirs = real(world)
        diffs = compare(theirs, mine)
        bad += bool(diffs)
        print(f"world {world}: real {theirs} fitcheck {mine} " + ("; ".join(diffs) or "same"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
