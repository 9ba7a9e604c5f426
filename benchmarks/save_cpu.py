"""REAL save paths on 2 gloo CPU ranks (or one process): the bytes each rank allocates while saving, by a
live-tensor tracker.

For each path, after one real step, every storage created while saving is counted
(``fitcheck.torch_adapters.LiveTensorTracker``, with every tensor alive before the call counted first, so that a view
of a parameter or state — ``state_dict``'s ``detach()``, a DTensor's ``to_local()`` — is no new storage): ``peak`` is
the most new bytes alive at once, ``held`` what is still alive when the call returns. On CPU a ``.cpu()`` of a CPU
tensor is the tensor itself: what a GPU rank would copy to the host is seen only where it is a ``clone`` (rank 0's
full state dict, accelerate's ZeRO-1/2 clone); rank 1 (``rank0_only``: it keeps nothing) shows the transient gather
a GPU rank makes on the device.

Paths (the calls transformers 5.23 ``Trainer.save_model`` / ``_save_optimizer_and_scheduler`` make):

- ``fsdp{1,2}-full-model``: ``Accelerator.get_state_dict(model)`` (accelerate 1.15 accelerator.py: FSDP1
  ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``; FSDP2 ``get_model_state_dict`` with
  ``full_state_dict=True, cpu_offload=True``), what ``Trainer.save_model`` saves under ``FULL_STATE_DICT``;
- ``fsdp{1,2}-sharded-ckpt``: ``save_fsdp_model`` under ``SHARDED_STATE_DICT`` (DCP), the checkpoint's model part;
- ``fsdp{1,2}-{full,sharded}-optim``: ``save_fsdp_optimizer`` (accelerate 1.15 utils/fsdp_utils.py), the checkpoint's
  optimizer part;
- ``zero3-16bit``: DeepSpeed 0.19.8 ``engine._zero3_consolidated_16bit_state_dict()`` (runtime/engine.py: one
  module's own parameters gathered at a time, copied to rank 0's CPU), ZeRO-3 bf16 on 2 gloo ranks;
- ``{peft,full}-trainer`` (one process) and ``zero{1,2}-trainer`` (2 ranks, DeepSpeed bf16): a real ``Trainer``
  after one step; ``save_model``, ``_save_optimizer_and_scheduler`` and ``_save_rng_state`` each under the tracker
  (the RNG states are CPU tensors made outside torch's dispatch: 0 here, host-side on a GPU too).

Run: ``PYTHONPATH=. python benchmarks/save_cpu.py [PATH ...]`` (a JSON row per path and rank), or ``--compare``
(estimate vs real for :data:`COMPARED`; ``benchmarks/run_phases.py --save-only --write`` stores them).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from typing import Any

from benchmarks.fsdp_upcast_cpu import TINY, WORLD

PATHS = ("fsdp1-full-model", "fsdp2-full-model", "fsdp1-sharded-ckpt", "fsdp2-sharded-ckpt", "zero3-16bit",
         "fsdp2-full-optim", "fsdp2-sharded-optim", "peft-trainer", "full-trainer", "zero1-trainer", "zero2-trainer")
# Trainer paths: one process (plain Trainer) or 2 gloo ranks (DeepSpeed ZeRO-1/2 under the Trainer)
TRAINER_PATHS = {"peft-trainer": 1, "full-trainer": 1, "zero1-trainer": WORLD, "zero2-trainer": WORLD}


def _plain_tracker() -> Any:
    """A live-tensor tracker that counts plain tensors only.

    A DTensor is a wrapper subclass: its storage reports the global size while its memory is its local tensor's,
    and the ops DTensor runs on local tensors inside its own dispatch (the all-gather buffer, for one) are not seen
    by a dispatch mode above it. Counting the wrappers would add every parameter's global size; the tensors a
    full state dict holds (``to_local()`` of a replicated DTensor) are plain and counted.
    """
    import torch

    from fitcheck.torch_adapters import LiveTensorTracker

    class PlainTracker(LiveTensorTracker):
        def _add(self, tensor: Any) -> None:
            if isinstance(tensor, torch.Tensor) and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
                return
            super()._add(tensor)

    return PlainTracker()


def _fsdp_rank(rank: int, path: str, port: int, out: str) -> None:
    from benchmarks.gloo_rank import finish_rank, fsdp_on_cpu, start_rank

    start_rank(rank, WORLD, port)
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import save_fsdp_model, save_fsdp_optimizer

    version = int(path[4])
    full = "-full-" in path
    optim = path.endswith("-optim")
    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k not in ("model_type", "architectures")})
    kw: dict[str, Any] = {"fsdp_version": version, "auto_wrap_policy": "transformer_based_wrap",
                          "transformer_cls_names_to_wrap": ["LlamaDecoderLayer"],
                          "state_dict_type": "FULL_STATE_DICT" if full else "SHARDED_STATE_DICT"}
    if version == 1:
        kw["use_orig_params"] = True
    plugin = FullyShardedDataParallelPlugin(**kw)
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    fsdp_on_cpu(acc, plugin)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    acc.backward(model(input_ids=ids, labels=ids).loss)
    opt.step()
    opt.zero_grad()
    tracker = _plain_tracker()
    base = _count_live(tracker)
    tracker.start()
    try:
        if optim:  # what Trainer._save_optimizer_and_scheduler calls after save_fsdp_model (transformers 5.23)
            with tempfile.TemporaryDirectory() as tmp:
                save_fsdp_optimizer(plugin, acc, opt, model, tmp)
            state = None
        elif full:
            state = acc.get_state_dict(model)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                save_fsdp_model(plugin, acc, model, tmp)
            state = None
        import gc

        gc.collect()  # storages in reference cycles (DTensor/funcol wrappers) go now, as a GPU run's would later
        held = tracker.current
    finally:
        tracker.stop()
    keys = len(state) if state else 0
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump({"peak": tracker.peak - base, "held": held - base, "keys": keys}, fh)
    del state
    finish_rank()


def _zero3_rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    warnings.filterwarnings("ignore")
    import deepspeed
    import torch
    import transformers

    from benchmarks.gloo_rank import finish_rank, without_deepspeed_shm_comm
    from fitcheck.torch_adapters import LiveTensorTracker

    without_deepspeed_shm_comm()
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k not in ("model_type", "architectures")})
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True,
                              "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
    }
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    tracker = LiveTensorTracker().start()
    try:
        state = engine._zero3_consolidated_16bit_state_dict()
        import gc

        gc.collect()
        held = tracker.current
    finally:
        tracker.stop()
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump({"peak": tracker.peak, "held": held, "keys": len(state) if state else 0}, fh)
    del state
    finish_rank()


def _count_live(tracker: Any) -> int:
    """Count every tensor alive now (parameters, their local shards, gradients, optimizer states, DeepSpeed's flat
    buffers) in ``tracker`` and return its bytes: a view of one of them (``state_dict``'s ``detach()``, a DTensor's
    ``to_local()``) is then no new storage, and ``peak``/``current`` minus that is what saving creates."""
    import gc

    import torch

    gc.collect()
    tracker.track(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
    return int(tracker.current)


def _tracker_over_live() -> Any:
    """A live-tensor tracker with every tensor alive now already counted (parameters, gradients, optimizer states,
    DeepSpeed's flat buffers): a view of one of them (``state_dict``'s ``detach()``) is then no new storage, and
    ``peak - current`` at the start is what saving creates."""
    import gc

    import torch

    from fitcheck.torch_adapters import LiveTensorTracker

    gc.collect()
    tracker = LiveTensorTracker()
    tracker.track(o for o in gc.get_objects() if isinstance(o, torch.Tensor))
    return tracker


def _trainer_rank(rank: int, path: str, port: int, out: str) -> None:
    """A real Trainer (LoRA, full, or DeepSpeed ZeRO-1/2 bf16) after one step: each save call under the tracker."""
    from benchmarks.gloo_rank import finish_rank, start_rank

    world = TRAINER_PATHS[path]
    if world > 1:
        start_rank(rank, world, port)
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    from benchmarks.tuner_budget import Tokens

    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    extra: dict[str, Any] = {}
    if path == "peft-trainer":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 lora_dropout=0.0, task_type="CAUSAL_LM"))
    if path.startswith("zero"):
        stage = int(path[4])
        extra = {"bf16": True, "deepspeed": {
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "train_batch_size": "auto", "bf16": {"enabled": "auto"},
            "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}}}}
        from benchmarks.gloo_rank import without_deepspeed_shm_comm

        without_deepspeed_shm_comm()
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        args = transformers.TrainingArguments(
            output_dir=tmp, per_device_train_batch_size=2, max_steps=1, optim="adamw_torch", use_cpu=True,
            report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0, **extra)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
        trainer.train()
        os.makedirs(os.path.join(tmp, "ckpt"), exist_ok=True)  # as _save_checkpoint's save_model makes it
        calls = (("save_model", lambda: trainer.save_model(os.path.join(tmp, "model"))),
                 ("optimizer_and_scheduler",
                  lambda: trainer._save_optimizer_and_scheduler(os.path.join(tmp, "ckpt"))),
                 ("rng_state", lambda: trainer._save_rng_state(os.path.join(tmp, "ckpt"))))
        for name, call in calls:
            tracker = _tracker_over_live()
            base = tracker.current
            tracker.start()
            try:
                call()
                import gc

                gc.collect()
                held = tracker.current
            finally:
                tracker.stop()
            rows[name] = {"peak": tracker.peak - base, "held": held - base}
        rows["model_bytes"] = sum(p.numel() * p.element_size() for p in trainer.model_wrapped.parameters())
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump(rows, fh)
    if world > 1:
        finish_rank()


def _spawned(rank: int, path: str, port: int, out: str) -> None:
    if path in TRAINER_PATHS:
        _trainer_rank(rank, path, port, out)
    elif path == "zero3-16bit":
        _zero3_rank(rank, port, out)
    else:
        _fsdp_rank(rank, path, port, out)


def measure(path: str, port: int | None = None) -> list[dict[str, int]]:
    """Per rank: ``peak`` and ``held`` bytes created while building the state dict of ``path`` (see the module).

    Args:
        path: One of :data:`PATHS`.
        port: A free TCP port for the gloo rendezvous (default: one the OS picks).

    Returns:
        One ``{"peak", "held", "keys"}`` per rank.
    """

    import torch.multiprocessing as mp_

    if port is None:
        from benchmarks.gloo_rank import free_port

        port = int(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "save")
        # spawn, not fork: a forked rank inherits the parent's globals, and after a test process built a Trainer
        # with a DeepSpeed config (transformers' HfDeepSpeedConfig weak reference) the ZeRO-3 rank's gather came
        # out 0 bytes (tests/test_save_phase.py failed after test_levers/test_integration_trainer, passed alone)
        world = TRAINER_PATHS.get(path, WORLD)
        mp_.start_processes(_spawned, args=(path, port, out), nprocs=world, join=True, start_method="spawn")
        rows = []
        for rank in range(world):
            with open(f"{out}.{rank}", encoding="utf-8") as fh:
                rows.append(json.load(fh))
    return rows


# Paths compared with the estimate, and why the others are not (read from source only).
COMPARED = ("fsdp2-full-model", "zero3-16bit", "fsdp2-full-optim", "zero1-trainer", "zero2-trainer", "peft-trainer",
            "full-trainer")
NOT_COMPARED = {
    "fsdp1-full-model": "FSDP1 FULL_STATE_DICT with offload_to_cpu segfaults on CPU: torch 2.13 "
                        "distributed/fsdp/_flat_param.py to_cpu() moves the unit to the CPU (a no-op there) and then "
                        "frees the storage it still uses; the GPU rule is read from source only",
    "fsdp1-sharded-ckpt": "SHARDED_STATE_DICT: each rank writes its own shards; estimated as no gather and a host "
                          "copy of each rank's shards (source)",
    "fsdp2-sharded-ckpt": "SHARDED_STATE_DICT via DCP: no gather (measured new bytes per rank: 15,912 / 11,363 B, "
                          "DCP's pickled save plans in object collectives, not modelled); the host copy of each rank's "
                          "shards (cpu_offload=True) is a no-op on CPU: estimated from source",
    "fsdp2-sharded-optim": "as fsdp2-sharded-ckpt for the optimizer (measured new bytes per rank: 48,129 / 33,475 B of "
                           "pickled plans); the host copy of each rank's optimizer shards is from source",
    "fsdp1-full-optim": "FSDP.optim_state_dict runs on CPU, but storages alive before the call are freed inside it "
                        "(held -213,632 B): the gather is not isolated; FSDP1's optimizer gather is not modelled",
}


# What a compared row's difference is.
_TAG = ("the 80 B are deepspeed 0.19.8 engine.py _checkpoint_tag_validation's 20-byte tag-hash tensors (bhash, two "
        "clones, two comparisons); not modelled")
NOTES = {"zero1-trainer": _TAG, "zero2-trainer": _TAG,
         "peft-trainer": "adapter state dict = views of the LoRA weights; the host copy (safetensors .to('cpu')) is a "
                         "no-op on CPU",
         "full-trainer": "save_pretrained's state dict = views; the host copy is a no-op on CPU"}


def estimate_for(path: str) -> Any:
    """fitcheck's save cost for the measured run (tiny Llama, 2 processes or one, bf16 mixed precision)."""
    from dataclasses import replace

    from benchmarks.cpu_truth import Row, spec_for
    from fitcheck.core import save_cost
    from fitcheck.spec import DeepSpeedSpec, FsdpSpec, LoraSpec, ShardingSpec, Strategy

    if path == "zero3-16bit" or path.startswith("zero"):
        spec = spec_for(Row("zero-save", TINY, seq=16, batch=2, dtype="float32", mp="bf16", optim="adamw_torch"))
        ds = DeepSpeedSpec(stage=3, gather_16bit_on_save=True) if path == "zero3-16bit" else DeepSpeedSpec(
            stage=int(path[4]))
        spec = replace(spec, sharding=ShardingSpec(Strategy.DEEPSPEED, WORLD, 1, ds))
    elif path in TRAINER_PATHS:  # one process, fp32, LoRA r16 all-linear or full
        lora = LoraSpec(r=16, alpha=32, target_modules=("all-linear",)) if path == "peft-trainer" else None
        spec = spec_for(Row("trainer-save", TINY, seq=32, batch=2, dtype="float32", lora=lora))
    else:
        spec = spec_for(Row("fsdp-save", TINY, seq=16, batch=2, dtype="bfloat16", mp="bf16", optim="adamw_torch"))
        fsdp = FsdpSpec(version=int(path[4]),
                        state_dict_type="FULL_STATE_DICT" if "-full-" in path else "SHARDED_STATE_DICT")
        spec = replace(spec, sharding=ShardingSpec(Strategy.FSDP, WORLD, 1, None, fsdp))
    return save_cost(spec)


def _real(path: str, ranks: list[dict[str, Any]]) -> tuple[int, int | None]:
    """(real device bytes, real host bytes per node or None where a CPU run cannot show it) of one path.

    - full state dicts (``fsdp2-full-model``, ``zero3-16bit``): the gather is rank 1's ``peak - held`` (rank 1 keeps
      nothing; ``held`` there is what it re-allocates in place of storages made before the tracker started:
      ZeRO-3's re-partitioned shards), the host copy rank 0's ``held`` minus rank 1's;
    - ``fsdp2-full-optim``: the dict is gone when ``save_fsdp_optimizer`` returns: the gather is rank 1's peak, the
      host copy rank 0's peak (on CPU rank 0's last gather is its host copy);
    - Trainer paths: what ``save_model`` and ``_save_optimizer_and_scheduler`` create. Under ZeRO-1/2 ``save_model``'s
      new bytes are accelerate's clone to the host (``.to("cpu")`` on a GPU): host = their sum over the ranks (one
      node), device = ``save_checkpoint``'s. One process: both calls, on the device (``.to("cpu")`` copies are a
      no-op on CPU, so the host side is not seen).
    """
    if path in ("fsdp2-full-model", "zero3-16bit"):
        r0, r1 = ranks
        return r1["peak"] - r1["held"], r0["held"] - r1["held"]
    if path == "fsdp2-full-optim":
        return ranks[1]["peak"], ranks[0]["peak"]
    if path.startswith("zero"):
        return max(r["optimizer_and_scheduler"]["peak"] for r in ranks), sum(r["save_model"]["peak"] for r in ranks)
    r = ranks[0]
    return r["save_model"]["peak"] + r["optimizer_and_scheduler"]["peak"], None


def _error(est: int, real: int | None) -> float | None:
    if real is None:
        return None
    if real == 0:
        return 0.0 if est == 0 else None
    return (est - real) / real


def save_rows() -> list[dict[str, Any]]:
    """Estimate vs real, per compared path: the device gather and the host state dict per node (see :func:`_real`).

    A path fitcheck gives no save phase (one process, DDP) is estimated as 0 on the device.
    """
    rows: list[dict[str, Any]] = []
    for path in COMPARED:
        ranks = measure(path)
        cost = estimate_for(path)
        if cost is None:
            est_gather, est_host = 0, 0
        elif path.endswith("-model") or path == "zero3-16bit":  # the model's state dict alone
            est_gather, est_host = cost.model_gather, cost.model_host
        elif path.endswith("-optim"):
            est_gather, est_host = cost.optimizer_gather, cost.optimizer_host
        else:
            est_gather, est_host = cost.device_gather, cost.host
        real_gather, real_host = _real(path, ranks)
        row = {"case": path, "real_gather": real_gather, "est_gather": est_gather,
               "gather_error": _error(est_gather, real_gather), "real_host": real_host,
               "est_host": est_host, "host_error": _error(est_host, real_host), "ranks": ranks}
        if path in NOTES:
            row["note"] = NOTES[path]
        rows.append(row)
    rows.extend({"case": path, "not_compared": why} for path, why in NOT_COMPARED.items())
    return rows


def main() -> int:
    """Print the measured rows as JSON lines (``--compare``: estimate vs real per compared path)."""
    if sys.argv[1:2] == ["--compare"]:
        for row in save_rows():
            print(json.dumps(row), flush=True)
        return 0
    for path in (sys.argv[1:] or PATHS):
        print(json.dumps({"path": path, "ranks": measure(path)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
