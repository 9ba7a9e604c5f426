"""Issue 19: a REAL FSDP1 LoRA step with fms-acceleration's settings, on 2 gloo CPU ranks and on one process, live
tensor bytes per region at micro-batch 1, 2 and 4, against fitcheck's estimate (``--device_type cpu``).

The fms-acceleration A100 table (``benchmarks/data/published_reports_session20.json``) shows FSDP1 LoRA/QLoRA runs
missing bytes that grow with the micro-batch, while the same runs on one GPU are exact. This script runs what those
runs run, at tiny widths:

- a Mistral in bf16 (fms ``torch_dtype: bfloat16``), LoRA r 16 / alpha 16 / dropout 0.1 on q/k/v/o through
  ``get_peft_model``. The adapters are fp32 (peft's ``autocast_adapter_dtype=True`` default); ``--bf16`` gives the
  FSDP-QLoRA run's precision without the 4-bit base: bf16 adapters (TRL 0.13's sharded-QLoRA
  ``get_peft_model(..., autocast_adapter_dtype=False)``), ``bf16=True`` (accelerate's autocast, FSDP
  ``MixedPrecision(bf16, bf16, bf16)``, accelerate's fp32 upcast of the trainable flat parameters);
- transformers' reentrant gradient checkpointing (4.35-4.x ``gradient_checkpointing_enable`` default) and
  ``enable_input_require_grads`` (TRL 0.13 ``sft_trainer.py`` line 210, reentrant checkpointing);
- FSDP1 with fms ``accelerate.yaml``: FULL_SHARD, BACKWARD_PRE, no forward prefetch, mixed precision ``no``, and
  the auto-wrap policy transformers 4.48 ``Trainer._fsdp_qlora_plugin_updates`` (and fms-hf-tuning 2.5.0
  ``sft_trainer.py``) set for a PEFT LoRA model: peft's ``fsdp_auto_wrap_policy`` (every decoder layer, and every
  trainable leaf -- each ``lora_A`` / ``lora_B`` -- its own unit).

Two drivers: the default one calls ``Accelerator.prepare`` itself (``use_orig_params`` False, accelerate's
plugin default; ``--orig-params`` True); ``--trainer`` runs the real ``transformers.Trainer`` with
``fsdp="full_shard auto_wrap"`` and ``use_orig_params`` True (``accelerate launch``'s default,
accelerate 1.0.1 ``commands/launch.py``), recording its third step. On CPU accelerate never selects FSDP, so the
state is set as on a GPU machine (``benchmarks/gloo_rank.py`` ``fsdp_on_cpu``); everything else is the library code.
Each step is recorded with the tracer's live-tensor recorder (FSDP1's flat-parameter storage resizes followed);
``--wide`` uses Mistral-7B's proportions so that a layer's recompute weighs against the loss as at 7B.
``--qlora`` (installed stack: bitsandbytes' CPU backend) loads the base 4-bit as fms's baseline-peft-bnb does (nf4,
double quant, bf16 compute and quant storage), bf16 adapters without k-bit preparation (TRL 0.13's sharded-QLoRA
path) and accelerate mixed precision bf16.

Runs on the installed stack, or on transformers 4.48.1 / peft 0.13.2 / trl 0.13.0 / accelerate 1.0.1 (the fms
runs' versions) in a separate environment; fitcheck's estimate then takes that stack. Recorded:
``benchmarks/data/fsdp1_lora_cpu_session20.txt``.

Run: ``PYTHONPATH=. python benchmarks/fsdp1_lora_cpu.py [--trainer] [--wide] [--bf16] [--qlora] [--orig-params]
[--layers N] [--breakdown]``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from typing import Any

TINY: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 2048, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "sliding_window": None,
}
# WIDE: Mistral-7B's proportions (vocab / hidden 8, intermediate / hidden 3.5, 4 query heads per kv head), so that a
# layer's recompute and backward weigh against the loss as they do at 7B
WIDE: dict[str, Any] = {**TINY, "hidden_size": 256, "intermediate_size": 896, "num_attention_heads": 8,
                        "num_key_value_heads": 2, "vocab_size": 2048}
SEQ = 128
WORLD = 2


def _config() -> dict[str, Any]:
    return WIDE if os.environ.get("FSDP1_WIDE") == "1" else TINY


def _recorder() -> Any:
    """The live-tensor recorder, following FSDP1's ``_alloc_storage`` / ``_free_storage`` (storage resizes in
    place, torch ``distributed/utils.py``, imported by ``fsdp/_flat_param.py``)."""
    from fsdp_cpu import resize_recorder
    from torch.distributed.fsdp import _flat_param

    rec = resize_recorder()
    alloc, free = _flat_param._alloc_storage, _flat_param._free_storage

    def alloc_storage(t: Any, size: Any) -> None:
        alloc(t, size)
        rec.resized(t)

    def free_storage(t: Any) -> None:
        free(t)
        rec.resized(t)

    _flat_param._alloc_storage = alloc_storage
    _flat_param._free_storage = free_storage
    return rec


def _breakdown(rec: Any, region: str) -> str:
    """Storages alive at a region's peak, in KiB (``fsdp_cpu.breakdown``)."""
    from fsdp_cpu import breakdown

    return str(breakdown(rec, region, kib=True))


def _rank(rank: int, world: int, micro: int, layers: int, port: int, out: str, breakdown: bool) -> None:
    from benchmarks.gloo_rank import fsdp_on_cpu, start_rank

    start_rank(rank, world, port)
    warnings.filterwarnings("ignore")

    import peft
    import torch
    import transformers
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy

    cfg = transformers.MistralConfig(num_hidden_layers=layers, **_config())
    torch.manual_seed(0)
    old = int(transformers.__version__.split(".")[0]) < 5  # transformers 4.x spells the load dtype torch_dtype
    model = transformers.AutoModelForCausalLM.from_config(cfg, **{"torch_dtype" if old else "dtype": torch.bfloat16})
    qlora = os.environ.get("FSDP1_QLORA") == "1"
    if qlora:  # fms baseline-peft-bnb: nf4, double quant, bf16 compute and bf16 quant storage (FSDP); bitsandbytes' CPU
        # backend quantizes on load. TRL 0.13's sharded-QLoRA path: bf16 adapters, no k-bit preparation.
        path = os.environ["FSDP1_QLORA_PATH"]  # the same random model, saved by the parent (measure)
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, quantization_config=quant, device_map="cpu",
            **{"torch_dtype" if old else "dtype": torch.bfloat16})
    model.config.use_cache = False
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=16, lora_dropout=0.1,
                                                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                                **({"autocast_adapter_dtype": False} if qlora else {}))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    model.train()
    # QLoRA: bf16=True in the fms scenario (accelerate's autocast; FSDP MixedPrecision(bf16), as transformers 4.48
    # _fsdp_qlora_plugin_updates sets from bnb_4bit_quant_storage)
    acc = Accelerator(cpu=True, mixed_precision="bf16" if qlora else "no")
    if world > 1:
        version = {"fsdp_version": 1} if not old else {}  # accelerate 1.0 has FSDP1 only
        plugin = FullyShardedDataParallelPlugin(
            **version, sharding_strategy=ShardingStrategy.FULL_SHARD,
            backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=False,
            use_orig_params=os.environ.get("FSDP1_ORIG", "0") == "1",
            sync_module_states=False, auto_wrap_policy=peft.utils.other.fsdp_auto_wrap_policy(model))
        fsdp_on_cpu(acc, plugin)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=False)
    model, opt = acc.prepare(model, opt)
    ids = torch.randint(0, cfg.vocab_size, (micro, SEQ), generator=torch.Generator().manual_seed(rank))
    rec = _recorder()
    rec.track_reachable()
    rec.track([ids])
    with rec:
        for step in range(2):
            rec.enter_region(f"forward{step}")
            loss = model(input_ids=ids, labels=ids).loss
            rec.enter_region(f"backward{step}")
            acc.backward(loss)
            del loss
            rec.enter_region(f"optimizer{step}")
            opt.step()
            opt.zero_grad(set_to_none=True)
        rec.enter_region("done")
    _write_peaks(rec, "1", ("forward", "backward", "optimizer"), out, rank,
                 f"== world {world} micro {micro} layers {layers}" if breakdown else None)


def _write_peaks(rec: Any, step: str, regions: tuple[str, ...], out: str, rank: int, title: str | None) -> None:
    """Write this rank's peak per region of step ``step`` to ``out.<rank>`` (rank 0 prints the breakdown under
    ``title`` when given), then leave the process group."""
    peaks = {r: rec.regions[f"{r}{step}"].peak for r in regions}
    if title is not None and rank == 0:
        print(title)
        print("\n".join(_breakdown(rec, f"{r}{step}") for r in ("forward", "backward")), flush=True)
    with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
        json.dump(peaks, fh)
    from benchmarks.gloo_rank import finish_rank

    finish_rank()


def _trainer_rank(rank: int, world: int, micro: int, layers: int, port: int, out: str, breakdown: bool) -> None:
    """The same run through the real ``transformers.Trainer`` (FSDP1 from ``TrainingArguments.fsdp``, as
    ``accelerate launch`` with fms ``accelerate.yaml`` gives it: ``use_orig_params`` true, accelerate's launch
    default), the second optimizer step recorded."""
    from benchmarks.gloo_rank import fsdp_on_cpu, start_rank

    if world > 1:
        start_rank(rank, world, port)
    else:  # one plain process: no group, or the Trainer wraps the model in DDP (which refuses reentrant checkpointing)
        import torch

        torch.set_num_threads(1)
    warnings.filterwarnings("ignore")

    import accelerate
    import peft
    import torch
    import transformers

    class FsdpOnCpuAccelerator(accelerate.Accelerator):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if os.environ.get("ACCELERATE_USE_FSDP") == "true":
                fsdp_on_cpu(self, accelerate.utils.FullyShardedDataParallelPlugin())

    transformers.trainer.Accelerator = FsdpOnCpuAccelerator
    cfg = transformers.MistralConfig(num_hidden_layers=layers, **_config())
    torch.manual_seed(0)
    old = int(transformers.__version__.split(".")[0]) < 5
    model = transformers.AutoModelForCausalLM.from_config(cfg, **{"torch_dtype" if old else "dtype": torch.bfloat16})
    model.config.use_cache = False
    # bf16: the FSDP-QLoRA run's precision without the 4-bit base: TRL 0.13's sharded-QLoRA get_peft_model
    # (autocast_adapter_dtype=False: bf16 adapters), TrainingArguments bf16=True (accelerate's autocast and FSDP
    # MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16), its fp32 upcast of the adapters)
    bf16 = os.environ.get("FSDP1_BF16") == "1"
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=16, lora_dropout=0.1,
                                                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                                **({"autocast_adapter_dtype": False} if bf16 else {}))
    model.enable_input_require_grads()
    ids = torch.randint(0, cfg.vocab_size, (micro * 3, SEQ), generator=torch.Generator().manual_seed(rank))
    data = [{"input_ids": r, "labels": r} for r in ids]
    fsdp: dict[str, Any] = {}
    if world > 1:
        fsdp = {"fsdp": "full_shard auto_wrap", "fsdp_config": {
            "backward_prefetch": "backward_pre", "forward_prefetch": False, "use_orig_params": True,
            "sync_module_states": False, "transformer_layer_cls_to_wrap": ["MistralDecoderLayer"]}}
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=micro, gradient_accumulation_steps=1,
        max_steps=3, gradient_checkpointing=True, use_cpu=True, optim="adamw_torch", save_strategy="no",
        report_to="none", logging_strategy="no", disable_tqdm=True, seed=0, bf16=bf16, **fsdp)
    rec = _recorder()

    class Regions(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, _a: Any, state: Any, _c: Any, **_k: Any) -> None:
            rec.enter_region(f"step{state.global_step}")

        def on_step_end(self, _a: Any, state: Any, _c: Any, **_k: Any) -> None:
            rec.enter_region("between")

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[Regions()])
    from fsdp_cpu import regions_around_loss

    regions_around_loss(trainer, rec, lambda: str(trainer.state.global_step))
    rec.track_reachable()
    with rec:
        trainer.train()
    _write_peaks(rec, "2", ("forward", "backward"), out, rank,
                 f"== trainer world {world} micro {micro} layers {layers}" if breakdown else None)


def measure_trainer(world: int, micro: int, layers: int, breakdown: bool = False) -> dict[str, int]:
    """Rank 0's live-tensor peak of the third Trainer step."""
    import torch.multiprocessing as mp_

    from benchmarks.gloo_rank import free_port

    port = int(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peaks")
        mp_.start_processes(_trainer_rank, args=(world, micro, layers, port, out, breakdown), nprocs=world,
                            join=True, start_method="spawn")
        with open(f"{out}.0", encoding="utf-8") as fh:
            peaks: dict[str, int] = json.load(fh)
    return peaks


def _save_for_qlora(layers: int, path: str) -> None:
    """Save the random bf16 model the ranks load 4-bit (``--qlora``), from this (parent) process."""
    import torch
    import transformers

    cfg = transformers.MistralConfig(num_hidden_layers=layers, **_config())
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
    os.environ["FSDP1_QLORA_PATH"] = path


def measure(world: int, micro: int, layers: int, breakdown: bool = False) -> dict[str, int]:
    """Rank 0's live-tensor peaks of the second step, by region."""
    import torch.multiprocessing as mp_

    if os.environ.get("FSDP1_QLORA") == "1" and not os.environ.get("FSDP1_QLORA_PATH"):
        _save_for_qlora(layers, tempfile.mkdtemp())

    from benchmarks.gloo_rank import free_port

    port = int(free_port())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peaks")
        mp_.start_processes(_rank, args=(world, micro, layers, port, out, breakdown), nprocs=world, join=True,
                            start_method="spawn")
        with open(f"{out}.0", encoding="utf-8") as fh:
            peaks: dict[str, int] = json.load(fh)
    return peaks


def estimate_for(world: int, micro: int, layers: int, stack: dict[str, str] | None = None) -> Any:
    """fitcheck's report for the same run (device_type cpu; FSDP1 FULL_SHARD, ``use_orig_params`` False on 2)."""
    from fitcheck.core import estimate
    from fitcheck.readers import inventory_for_stack, inventory_from_config
    from fitcheck.spec import (
        ActivationSpec,
        AttnImpl,
        BatchSpec,
        DeviceType,
        Dtype,
        FsdpSpec,
        HardwareSpec,
        LoraSpec,
        MixedPrecision,
        OptimizerSpec,
        PrecisionSpec,
        QuantSpec,
        ShardingSpec,
        StackSpec,
        Strategy,
        TrainingSpec,
    )

    config = {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "num_hidden_layers": layers,
              **_config()}
    libs = StackSpec(tuple(sorted(stack.items())), "run") if stack else StackSpec()
    inv = inventory_for_stack(inventory_from_config(config, "tiny-mistral", "benchmarks/fsdp1_lora_cpu.py"), libs)
    sharding = ShardingSpec(Strategy.FSDP, world, 1, None, FsdpSpec(version=1, use_orig_params=False)) \
        if world > 1 else ShardingSpec()
    spec = TrainingSpec(
        model=inv,
        precision=PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.BF16 if "1" in (
            os.environ.get("FSDP1_BF16"), os.environ.get("FSDP1_QLORA")) else MixedPrecision.NO),
        optimizer=OptimizerSpec("adamw_torch"),
        batch=BatchSpec(micro_batch=micro, seq_len=SEQ),
        activations=ActivationSpec(checkpointing=True, attn_implementation=AttnImpl.SDPA, use_reentrant=True),
        hardware=HardwareSpec(device_type=DeviceType.CPU),
        lora=LoraSpec(r=16, alpha=16, dropout=0.1, target_modules=("q_proj", "k_proj", "v_proj", "o_proj")),
        sharding=sharding,
        stack=libs,
        quant=QuantSpec(double_quant=True, quant_storage=Dtype.BFLOAT16, compute_dtype=Dtype.BFLOAT16,
                        prepare_for_kbit_training=False) if os.environ.get("FSDP1_QLORA") == "1" else None,
    )
    return estimate(spec)


def main(argv: list[str]) -> int:
    """Print rank 0's peaks per region for 1 process and FSDP1 on 2, at micro-batch 1, 2, 4, and the slopes."""
    layers = int(argv[argv.index("--layers") + 1]) if "--layers" in argv else 2
    breakdown = "--breakdown" in argv
    for flag, env in (("--orig-params", "FSDP1_ORIG"), ("--bf16", "FSDP1_BF16"), ("--wide", "FSDP1_WIDE"),
                      ("--qlora", "FSDP1_QLORA")):
        os.environ[env] = "1" if flag in argv else "0"  # read by the spawned ranks
    measure_fn = measure_trainer if "--trainer" in argv else measure
    import transformers

    stack = None
    if int(transformers.__version__.split(".")[0]) < 5:
        import accelerate
        import peft
        import torch

        stack = {"transformers": transformers.__version__, "peft": peft.__version__,
                 "accelerate": accelerate.__version__, "torch": torch.__version__.split("+")[0]}
    print(f"{'world':>5} {'micro':>5} {'forward KiB':>12} {'backward KiB':>13} {'optimizer KiB':>14} "
          f"{'real peak':>10} {'fitcheck':>10} {'error':>7}  fitcheck phase")
    peaks: dict[tuple[int, int], dict[str, int]] = {}
    for world in (1, WORLD):
        for micro in (1, 2, 4):
            p = peaks[world, micro] = measure_fn(world, micro, layers, breakdown)
            real = max(p.values())
            try:
                rep = estimate_for(world, micro, layers, stack)
                est, phase = rep.peak_allocated_bytes, rep.peak_phase.value
            except Exception as exc:  # the estimate is read where the old stack's fitcheck imports
                est, phase = 0, f"no estimate: {exc}"
            print(f"{world:>5} {micro:>5} {p['forward'] / 1024:12.1f} {p['backward'] / 1024:13.1f} "
                  f"{p.get('optimizer', 0) / 1024:14.1f} {real / 1024:10.1f} {est / 1024:10.1f} "
                  f"{(est - real) / real * 100:+6.1f}%  {phase}", flush=True)
    for world in (1, WORLD):
        for region in ("forward", "backward"):
            slope = (peaks[world, 4][region] - peaks[world, 1][region]) / 3
            print(f"world {world} {region}: {slope / 1024:.1f} KiB per sequence")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
