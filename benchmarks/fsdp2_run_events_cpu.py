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

Variants (``--variant full lora accum2 lora_accum2 lora_accelerate lora_accum2_accelerate``; ``--write`` records them in
``benchmarks/data/fsdp2_run_events_cpu.json``, which ``tests/test_fsdp2_run_events.py`` checks without spawning):
``lora``: peft ``get_peft_model`` r 8 on q/v over the bf16 base (the adapters fp32: ``autocast_adapter_dtype``),
prepared as the Trainer prepares a peft model (transformers 5.23 ``update_fsdp_plugin_peft`` first: under FSDP2 no
decoder layer gets a unit, the root gathers them all; ``core/states/fsdp2_units.py``), the Trainer's optimizer on
the trainable parameters only; ``lora_accelerate`` / ``lora_accum2_accelerate``: the same without
``update_fsdp_plugin_peft`` (accelerate's own ``transformer_based_wrap``: a unit per layer), NOT the Trainer's run;
``accum2``: two micro-batches a step as the Trainer runs
them (``accelerator.no_sync`` but for the last: ``set_requires_gradient_sync(False)``), the live bytes read after
each micro-batch's backward too (``backward1.0``, ``backward.0``). An unsharded ``.grad`` FSDP2 keeps between
micro-batches has no Python object until something reads it, so ``alive()`` reads them through the FSDP states.
``forward1`` (every variant recorded since 2026-11-27 evening): after the first forward. Result: lora (the Trainer's)
minus lora_accelerate at forward1 605176 B (world 1) / 605168 B (world 2) = both layers and adapters in bf16
(605184 B); the other points of lora and lora_accelerate are alike. The accelerate-direct result before (as lora,
2026-11-27, world 1 / 2, real vs fitcheck, every point within 40 B): lora_accelerate 20 / 28692 / 57396 / 86068 vs
0 / 28680 / 57384 / 86056 (world 2: -571992 / -557656 / -543288 / -528952 vs -572032 / -557688 / -543320 /
-528984); accum2 after the first micro-batch 2230800 vs 2230792 (world 2: 1115424 vs 1115400), the unsharded bf16
gradients (2 bytes a parameter); lora_accum2 after the first micro-batch 14356 vs 14344 (world 2: -557656 vs
-557688).

FSDP1 (``--version 1``; ``fitcheck.torch_adapters.fsdp1_run_events``): ``Accelerator.prepare`` with the plugin
transformers 5.23 builds for ``fsdp_version: 1`` (``use_orig_params=True``, ``NO_PREFETCH``, ``FULL_SHARD``;
``sync_module_states`` off on CPU), the model first and the fused AdamW after it, as the Trainer does
(``delay_optimizer_creation``). ``--write`` records the real live bytes in
``benchmarks/data/fsdp1_run_events_cpu.json``.
Result (2026-11-27): world 1: real 2230784 / 3346112 / 7807764 / 7807764, fitcheck 2230784 / 3346184 / 7807836 /
7807836; world 2: real 557696 / 1115328 / 3346160 / 3346160, fitcheck 557696 / 1115400 / 3346232 / 3346232.
The same variants (``--version 1 --variant ... [--worlds 1 2 3] --write``), the LoRA ones with what the Trainer
does for a peft model under FSDP before ``prepare`` (transformers 5.23 ``update_fsdp_plugin_peft``: peft's
``fsdp_auto_wrap_policy``, each LoRA A/B its own unit); accelerate's ``no_sync`` is FSDP1's ``model.no_sync`` only
on more than one process. Result (2026-11-27), every point within 72 B of ``fsdp1_run``'s: after the first
micro-batch accum2 world 1 3346112 (the fp32 gradient, reduced), world 2 1115328 and world 3 743544 (the unsharded
bf16 ``.grad``: 2 bytes a parameter, less the upcast's 16-bit shard freed at the first forward); lora world 1
0 / 28608 / 85984 / 85984, world 2 -572032 / -557760 / -529056 / -529056.
``--variant qlora`` (FSDP1 only, session 22): the lora run over a 4-bit base (:data:`QLORA_CONFIG`, bf16 quant storage,
quantized on load by bitsandbytes' CPU backend, no k-bit preparation; ``fsdp1_run`` replays it from the traced
module's storages, ``fsdp_params.packed_param``). Result (2026-11-28): world 1 real 0 / 28608 / 85984 / 85984,
fitcheck 0 / 28680 / 86056 / 86056; world 2 real -350848 / -336576 / -307872 / -307872, fitcheck -350848 / -336504 /
-307800 / -307800 (the packed weights' flats sharded: half of them freed by ``prepare``).
"""

from __future__ import annotations

import contextlib
import json
import os
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


def _rank(rank: int, world: int, port: int, out: str, version: int = 2, lora: bool = False, accum: int = 1,
          trainer: bool = True, qlora: str = "") -> None:
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
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
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
    if qlora:  # the same random model saved by the parent, loaded 4-bit as FSDP-QLoRA loads it (QLORA_CONFIG)
        del model
        quant = transformers.BitsAndBytesConfig(**{**QLORA_CONFIG, "bnb_4bit_compute_dtype": torch.bfloat16,
                                                   "bnb_4bit_quant_storage": torch.bfloat16})
        model = transformers.AutoModelForCausalLM.from_pretrained(qlora, quantization_config=quant, device_map="cpu",
                                                                  dtype=torch.bfloat16)
    model.config.use_cache = False
    if lora:  # peft 0.21 get_peft_model (autocast_adapter_dtype=True: the adapters in fp32), as the Trainer is given
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"],
                                                           lora_dropout=0.0, task_type="CAUSAL_LM"))
        if version == 1 or trainer:  # transformers 5.23 trainer.py l.1751-1754 (delay_optimizer_creation, a peft
            # model under FSDP1; the Trainer's FSDP2 run does NOT call it, l.1717-1722: the FSDP2 `lora` variants are a
            # script that calls it by hand, `*_accelerate` the Trainer's FSDP2 run):
            # distributed/fsdp.py update_fsdp_plugin_peft sets peft's fsdp_auto_wrap_policy (utils/other.py: every
            # leaf module whose weight requires grad, the LoRA A/B, a unit of its own, _or_policy with the layers)
            from transformers.distributed.fsdp import update_fsdp_plugin_peft

            # FSDP2: accelerate 1.15 fsdp_utils.py fsdp2_prepare_auto_wrap_policy knows transformer_auto_wrap_policy
            # and size_based_auto_wrap_policy only; for peft's _or_policy partial it returns None, so
            # fsdp2_prepare_model fully_shards no decoder layer (the root holds them all)
            update_fsdp_plugin_peft(model, acc)
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))

    def alive() -> int:
        gc.collect()
        # an unsharded parameter's .grad that FSDP2 keeps between micro-batches (no_sync: post_backward returns
        # before reading it) has no Python object gc could find: read it through the FSDP states
        held = [g for m in model.modules() if isinstance(m, FSDPModule)
                for group in m._get_fsdp_state()._fsdp_param_groups for fp in group.fsdp_params
                for g in (getattr(getattr(fp, "_unsharded_param", None), "grad", None),
                          fp.unsharded_accumulated_grad) if g is not None]
        # FSDP1: each flat parameter's .grad (under no_sync the unsharded flat gradient) and saved shard
        held += [g for m in model.modules() if isinstance(m, FSDP1) and m._has_params
                 for g in (m._flat_param.grad, getattr(m._flat_param, "_saved_grad_shard", None)) if g is not None]
        seen: dict[int, int] = {}
        for o in [*gc.get_objects(), *held]:
            if isinstance(o, torch.Tensor) and not isinstance(o, DTensor) and not o.is_meta:
                st = o.untyped_storage()
                if st.nbytes():
                    seen[st.data_ptr()] = st.nbytes()
        return sum(seen.values())

    live: dict[str, int] = {}
    before = alive()
    # the Trainer's optimizer holds the trainable parameters only (trainer.py get_optimizer_grouped_parameters)
    if version == 2:  # (no list of them kept here: it would keep the unsharded originals alive)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
        model, opt = acc.prepare(model, opt)  # FSDP2: together (the optimizer is pointed at the shards)
    else:  # FSDP1: the Trainer delays the optimizer (trainer.py _prepare_for_training: delay_optimizer_creation)
        model = acc.prepare(model)
        opt = acc.prepare(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4,
                                            fused=True))
    live["initialize"] = alive()
    for step in range(2):
        point = "backward1" if step == 0 else "backward"
        for micro in range(accum):
            # the Trainer's inner loop (trainer.py: sync_context): accelerator.no_sync but for the last micro-batch;
            # accelerate 1.15 accelerator.py no_sync under FSDP2: model.set_requires_gradient_sync(False)
            sync = contextlib.nullcontext() if micro == accum - 1 else acc.no_sync(model)
            with sync:
                loss = model(input_ids=ids, labels=ids).loss / accum
                if step == 0 and micro == 0:  # the end of the first forward: what the units keep gathered
                    live["forward1"] = alive()
                acc.backward(loss)
            del loss
            live[point if micro == accum - 1 else f"{point}.{micro}"] = alive()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            live["step1"] = alive()
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump({k: v - before for k, v in live.items()}, fh)
    dist.destroy_process_group()


# FSDP-QLoRA's base (the ``qlora`` variant): nf4, double quant, bf16 compute and quant storage (bitsandbytes' CPU
# backend quantizes on load), no k-bit preparation; peft's fp32 adapters
QLORA_CONFIG = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True}


def real(world: int, version: int = 2, lora: bool = False, accum: int = 1, trainer: bool = True,
         qlora: bool = False) -> dict[str, int]:
    """Rank 0's live bytes at :data:`POINTS` of the real FSDP``version`` run on ``world`` gloo ranks (spawned);
    ``lora``: peft LoRA r 8 on q/v over the frozen bf16 base; ``accum``: micro-batches a step (the live bytes after
    each but the last micro-batch's backward too: ``backward1.K``, ``backward.K``); ``trainer``: a LoRA run prepared
    with ``update_fsdp_plugin_peft`` first (the Trainer's FSDP1; under FSDP2 a script doing so by hand, not the
    Trainer); False: accelerate's ``transformer_based_wrap`` alone (the Trainer's FSDP2 run). ``forward1``: after the
    first forward (its loss alive)."""
    import torch.multiprocessing as mp_
    from gloo_rank import free_port

    port = int(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "live")
        saved = ""
        if qlora:
            import torch
            import transformers
            from deepspeed_run_events_cpu import CONFIG

            cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type",
                                                                                         "architectures")})
            torch.manual_seed(0)
            saved = os.path.join(tmp, "model")
            transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(saved)
        mp_.start_processes(_rank, args=(world, port, out, version, lora, accum, trainer, saved), nprocs=world,
                            join=True, start_method="spawn")
        with open(f"{out}.0", encoding="utf-8") as fh:
            return dict(json.load(fh))


def spec_of(world: int, version: int = 2, lora: bool = False, accum: int = 1, qlora: bool = False) -> Any:
    """fitcheck's spec of the same run (FSDP``version`` FULL_SHARD, ``world`` processes, bf16 loaded, ``--bf16``;
    ``lora``: r 8 on q/v; ``accum``: ``gradient_accumulation_steps``; ``qlora``: over :data:`QLORA_CONFIG`'s base)."""
    from cpu_truth import Row, spec_for
    from deepspeed_run_events_cpu import BATCH, CONFIG, SEQ

    from fitcheck.spec import Dtype, FsdpSpec, LoraSpec, QuantSpec, ShardingSpec, Strategy

    spec = spec_for(Row("tiny", CONFIG, seq=SEQ, batch=BATCH, dtype="bfloat16", mp="bf16", optim="adamw_torch_fused",
                        lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj"), dropout=0.0) if lora else None))
    spec = replace(spec, batch=replace(spec.batch, grad_accum=accum))
    if qlora:
        spec = replace(spec, quant=QuantSpec(bits=4, quant_type="nf4", double_quant=True, quant_storage=Dtype.BFLOAT16,
                                             compute_dtype=Dtype.BFLOAT16, prepare_for_kbit_training=False))
    return replace(spec, sharding=ShardingSpec(Strategy.FSDP, world, 1, None, FsdpSpec(version=version)))


def fitcheck_live(world: int, plain: list[Any] | None = None, version: int = 2, plan: Any = None,
                  lora: bool = False, accum: int = 1, qlora: bool = False) -> tuple[dict[str, int], list[Any]]:
    """The live bytes of ``fsdp2_run``'s (``fsdp1_run``'s) sequence at :data:`POINTS` (above the traced setup), and
    the plain run's events (``plain``: reuse them; the trace does not depend on the world size or version).
    ``plan``: the spec -> the rewrite's plan (default: ``fsdp2_plan`` / ``fsdp1_plan``)."""
    from fitcheck.torch_adapters import fsdp1_plan, fsdp1_run, fsdp2_plan, fsdp2_run, live_bytes, whole_run_events

    spec = spec_of(world, version, lora, accum, qlora)
    plan = (plan or (fsdp1_plan if version == 1 else fsdp2_plan))(spec)
    plain = plain if plain is not None else whole_run_events(spec, micro_batches=plan.accum)
    before = sum(n for _, n, t in plain if t == "setup")
    events = fsdp1_run(plain, plan) if version == 1 else fsdp2_run(plain, plan)  # a resident model: traced setup
    live = {**live_bytes(events), **micro_live(events, plan.accum), **forward_live(events)}
    return {k: v - before for k, v in live.items()}, plain


def forward_live(events: list[Any]) -> dict[str, int]:
    """``forward1``: the live bytes at the rewrite's first ``(MARK, 0, "forward")`` (the root's post-forward of
    the first pass; FSDP2 only), or nothing. Not compared by :func:`compare`: it is 339934 .. 339962 B above the
    real runs' ``forward1`` in all four of lora / lora_accelerate x world 1 / 2 (2026-11-27; something of the traced
    forward's end that ``alive()`` does not reach, not identified); the difference of two plans is checked
    (``tests/test_fsdp2_peft_root.py``)."""
    live = 0
    for _, n, t in events:
        if n == 0 and t == "forward":
            return {"forward1": live}
        live += n
    return {}


def micro_live(events: list[Any], accum: int) -> dict[str, int]:
    """The live bytes at the rewrite's points between micro-batches (its ``(MARK, 0, "micro")`` events):
    ``backward1.K`` in the first step, ``backward.K`` in the last."""
    live, seen = 0, []
    for _, n, t in events:
        if n == 0 and t == "micro":
            seen.append(live)
        live += n
    if accum < 2 or not seen:
        return {}
    out = {f"backward1.{m}": seen[m] for m in range(accum - 1)}
    return {**out, **{f"backward.{m}": seen[len(seen) - accum + 1 + m] for m in range(accum - 1)}}


def compare(theirs: dict[str, int], mine: dict[str, int]) -> list[str]:
    """The points where the live bytes differ by more than :data:`TOLERANCE` (:data:`POINTS` and, with gradient
    accumulation, those between micro-batches)."""
    return [f"live after {p}: real {theirs[p]} fitcheck {mine.get(p)}" for p in theirs
            if p != "forward1" and abs(theirs[p] - mine.get(p, 0)) > TOLERANCE]


DATA = ROOT / "benchmarks" / "data" / "fsdp1_run_events_cpu.json"
DATA2 = ROOT / "benchmarks" / "data" / "fsdp2_run_events_cpu.json"
# FSDP2's recorded variants: name -> (LoRA r 8 on q/v, gradient_accumulation_steps, prepared as the Trainer
# prepares a peft model: update_fsdp_plugin_peft before prepare). ``*_accelerate``: accelerate-direct
# (transformer_based_wrap, one unit per decoder layer), NOT what the Trainer runs for a peft model under FSDP2.
VARIANTS = {"full": (False, 1, True), "lora": (True, 1, True), "accum2": (False, 2, True),
            "lora_accum2": (True, 2, True), "lora_accelerate": (True, 1, False),
            "lora_accum2_accelerate": (True, 2, False), "qlora": (True, 1, True)}  # qlora: FSDP1 only


def main(argv: list[str] | None = None) -> int:
    """Compare world sizes 1 and 2 (``--version 1``: FSDP1; ``--variant``: FSDP2's :data:`VARIANTS` to run;
    ``--write``: record the real runs' live bytes, FSDP1's in :data:`DATA`, FSDP2's variants in :data:`DATA2`, which
    ``tests/test_fsdp1_run_events.py`` / ``tests/test_fsdp2_run_events.py`` check without spawning); exit 1 on a
    difference."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--version", type=int, default=2, choices=(1, 2))
    ap.add_argument("--variant", nargs="*", choices=sorted(VARIANTS), default=["full"])
    ap.add_argument("--worlds", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    bad = 0
    runs: dict[str, dict[str, Any]] = {}
    for name in args.variant:
        lora, accum, trainer = VARIANTS[name]
        plain, rows = None, {}
        for world in args.worlds:
            qlora = name == "qlora"
            theirs = real(world, args.version, lora, accum, trainer, qlora)
            try:
                mine, plain = fitcheck_live(world, plain, args.version, lora=lora, accum=accum, qlora=qlora)
            except ValueError as e:  # FsdpReplayError: the rewrite does not describe the run (recorded anyway)
                mine = {"error": str(e)}  # type: ignore[dict-item]
            rows[str(world)] = theirs
            diffs = compare(theirs, mine)
            bad += bool(diffs)
            print(f"{name} world {world}: real {theirs} fitcheck {mine} " + ("; ".join(diffs) or "same"))
        runs[name] = rows
    if args.write:
        import accelerate
        import peft
        import torch
        import transformers

        path = DATA if args.version == 1 else DATA2
        old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        variants = old.get("variants", {"full": {"lora": False, "accum": 1, "rows": old["rows"]}} if "rows" in old
                           else {})
        doc = {"what": f"live bytes above before-prepare of rank 0 of a REAL FSDP{args.version} run (benchmarks/"
                       f"fsdp2_run_events_cpu.py --version {args.version} --write --variant ...), per variant and "
                       "world size; backward1.K / backward.K: after micro-batch K's backward (no_sync)",
               "torch": torch.__version__, "transformers": transformers.__version__,
               "accelerate": accelerate.__version__, "peft": peft.__version__,
               "variants": {**variants, **{k: {"lora": VARIANTS[k][0], "accum": VARIANTS[k][1],
                                               **({"qlora": QLORA_CONFIG} if k == "qlora" else {}),
                                               "prepared": "the Trainer's (update_fsdp_plugin_peft)"
                                               if VARIANTS[k][2] or not VARIANTS[k][0] else
                                               "accelerate-direct transformer_based_wrap, not the Trainer's",
                                               "rows": {**variants.get(k, {}).get("rows", {}), **v}}
                                           for k, v in runs.items()}}}
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
