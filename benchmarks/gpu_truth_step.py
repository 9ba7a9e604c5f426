"""One real training step the way the libraries run it, for ``gpu_truth.py``: build, optimizer, measured steps.

The model as transformers/peft/TRL would hold it for a row's flags (``from_config`` with random weights;
bitsandbytes bases saved and reloaded through ``from_pretrained(quantization_config=...)``; LoRA with TRL's
defaults), the optimizer the Trainer builds, and three steps with the peak counters reset after the first.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CLIP_NORM = 1.0  # transformers/training_args.py: max_grad_norm default


def _flag(values: Mapping[str, object], key: str) -> bool:
    v = values.get(key)
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes", "on", ""))


# ------------------------------------------------------------------------------------------------ model
def _dtype(values: Mapping[str, object], config: Mapping[str, Any]) -> Any:
    import torch

    name = str(values.get("dtype") or "auto")
    if name == "auto":  # transformers 5 from_pretrained default: the config's dtype (float32 if none)
        name = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return getattr(torch, name)


def build_model(config: Mapping[str, Any], values: Mapping[str, object], device: str, work: Path,
                phases: dict[str, dict[str, int]] | None = None) -> Any:
    """The model as transformers/peft/TRL would hold it for these flags, on ``device``, in train mode.

    On CUDA every model is loaded as a user's script loads it: random weights built (on the GPU) and saved, then
    ``from_pretrained(..., device_map={"": cuda})`` (with the row's ``BitsAndBytesConfig``), and the allocator's
    counters are recorded in ``phases``: ``load`` (after ``from_pretrained``, peaks since an emptied cache) and
    ``prepare`` (after ``prepare_model_for_kbit_training``), next to ``fitcheck.core.loading.load_phase``.
    """
    import torch

    from fitcheck.torch_adapters import hf_config, model_class

    dtype = _dtype(values, config)
    attn = str(values.get("attn_implementation") or "sdpa")
    cls = model_class(config)
    quantized = _flag(values, "load_in_4bit") or _flag(values, "load_in_8bit")
    build_on = device  # on CUDA the random init runs on the GPU (CPU init of a 1B model took over a minute there)
    with torch.device(build_on):
        model = cls._from_config(hf_config(config, attn), dtype=dtype)
    if next(model.parameters()).device.type != build_on:
        model.to(build_on)
    ckpt = _flag(values, "gradient_checkpointing")
    if device == "cuda" or quantized:
        model.save_pretrained(work / "weights")
        del model
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        where = torch.device(device, 0) if device == "cuda" else device
        model = cls.from_pretrained(work / "weights", quantization_config=_bnb_config(values, dtype) if quantized
                                    else None, dtype=dtype, device_map={"": where}, attn_implementation=attn)
        if device == "cuda" and phases is not None:
            phases["load"] = _cuda_counters()
    if quantized:
        from peft import prepare_model_for_kbit_training

        # TRL SFTTrainer for a k-bit model: prepare_model_for_kbit_training(model, use_gradient_checkpointing=
        # args.gradient_checkpointing, gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs or {})
        model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
            model, use_gradient_checkpointing=ckpt, gradient_checkpointing_kwargs={})
        if device == "cuda" and phases is not None:
            phases["prepare"] = _cuda_counters()
    model.config.use_cache = False
    if _flag(values, "use_peft"):
        from peft import get_peft_model

        model = get_peft_model(model, _lora_config(values))
    if ckpt:  # as Trainer.train calls it (kwargs None -> use_reentrant=False in transformers 5)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    model.train()
    return model


def _bnb_config(values: Mapping[str, object], dtype: Any) -> Any:
    import torch
    from transformers import BitsAndBytesConfig

    if _flag(values, "load_in_8bit"):
        return BitsAndBytesConfig(load_in_8bit=True)  # type: ignore[no-untyped-call]
    compute = values.get("bnb_4bit_compute_dtype")
    storage = values.get("bnb_4bit_quant_storage")
    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type=str(values.get("bnb_4bit_quant_type") or "nf4"),
        bnb_4bit_use_double_quant=_flag(values, "use_bnb_nested_quant"),
        bnb_4bit_compute_dtype=getattr(torch, str(compute)) if compute else dtype,  # TRL passes model dtype
        bnb_4bit_quant_storage=getattr(torch, str(storage)) if storage else torch.uint8,
    )


def _lora_config(values: Mapping[str, object]) -> Any:
    """TRL ``get_peft_config``: LoraConfig from ModelConfig (r 16, alpha 32, dropout 0.05, peft's targets)."""
    from peft import LoraConfig

    targets: Any = values.get("lora_target_modules")
    if isinstance(targets, list) and targets == ["all-linear"]:
        targets = "all-linear"
    to_save = values.get("lora_modules_to_save")
    return LoraConfig(
        task_type="CAUSAL_LM", bias="none", r=int(str(values.get("lora_r") or 16)),
        lora_alpha=int(float(str(values.get("lora_alpha") or 32))),
        lora_dropout=float(str(values.get("lora_dropout") or 0.05)), target_modules=targets or None,
        modules_to_save=list(to_save) if isinstance(to_save, list) else None,
        use_dora=_flag(values, "use_dora"), use_rslora=_flag(values, "use_rslora"),
    )


def make_optimizer(model: Any, optim: str, work: Path) -> Any:
    """The optimizer ``Trainer.create_optimizer`` builds for ``TrainingArguments(optim=optim)``."""
    from torch import nn
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(work / "trainer"), optim=optim, report_to="none")
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    decay = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]  # self unused
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    opt = cls(groups, **kwargs)
    if "bitsandbytes" in str(cls) and kwargs.get("optim_bits") == 8:
        import importlib

        bnb_optim: Any = importlib.import_module("bitsandbytes.optim")
        manager = bnb_optim.GlobalOptimManager.get_instance()
        for module in model.modules():  # Trainer.create_optimizer keeps embeddings' states in 32 bits
            if isinstance(module, nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
    return opt


# ------------------------------------------------------------------------------------------------- steps
def train_steps(model: Any, opt: Any, values: Mapping[str, object], device: str, steps: int = 3,
                lengths: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run ``steps`` real steps; the peak counters are reset after the first. Returns the measurements.

    With ``lengths`` (a row's ``--seq_lengths``), one step per length in that order, as a run over batches padded
    to those lengths: nothing is reset (the estimate is the whole sequence's peak, the first step's optimizer
    states included), and the counters after each step are kept under ``per_step``.
    """
    import torch

    batch = int(str(values.get("per_device_train_batch_size") or 8))
    seq = int(str(values.get("max_seq_length") or 1024))
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (batch, max((seq, *lengths))), device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    ac_dtype = torch.bfloat16 if _flag(values, "bf16") else torch.float16 if _flag(values, "fp16") else None
    tracker = None
    if device == "cpu":
        from fitcheck.torch_adapters import LiveTensorTracker, model_state_tensors

        tracker = LiveTensorTracker()
        tracker.track([*model_state_tensors(model, opt), ids])
        tracker.start()
    times: list[float] = []
    per_step: list[dict[str, int]] = []
    try:
        for step, n in enumerate(lengths or (seq,) * steps):
            start = time.perf_counter()
            ctx = torch.autocast(device, dtype=ac_dtype) if ac_dtype is not None else contextlib.nullcontext()
            x = ids[:, :n].contiguous() if n != ids.shape[1] else ids
            with ctx:
                loss = model(input_ids=x, labels=x, use_cache=False).loss
            loss.backward()
            del loss, x
            torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            if lengths:
                now = _cuda_counters() if tracker is None else {"max_allocated": tracker.peak}
                per_step.append({"seq": n, **now})
            elif step == 0:
                if tracker is not None:
                    tracker.reset_peak()
                else:
                    torch.cuda.reset_peak_memory_stats()
    finally:
        if tracker is not None:
            tracker.stop()
    out: dict[str, Any] = {"step_seconds": statistics.mean(times[1:]) if len(times) > 1 else times[0]}
    if tracker is not None:
        out.update(max_allocated=tracker.peak, max_reserved=None, used=None, used_peak=None)
    else:
        out.update(_cuda_counters())
    if per_step:
        out["per_step"] = per_step
    return out


def _environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    env: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                           "python": sys.version.split()[0],
                           "PYTORCH_CUDA_ALLOC_CONF": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    for mod in ("peft", "bitsandbytes", "accelerate"):
        with contextlib.suppress(Exception):
            env[mod] = __import__(mod).__version__
    if device == "cuda":
        torch.cuda.init()  # type: ignore[no-untyped-call]
        free, total = torch.cuda.mem_get_info()
        env.update(gpu_name=torch.cuda.get_device_name(0), gpu_total_bytes=total, used_at_init=total - free,
                   cuda=torch.version.cuda)
    return env


def _cuda_counters() -> dict[str, int]:
    """The caching allocator's counters now (peaks since the last reset) and the device's used bytes."""
    import torch

    free, total = torch.cuda.mem_get_info()
    used = total - free
    reserved = torch.cuda.memory_reserved()
    max_reserved = torch.cuda.max_memory_reserved()
    allocated = torch.cuda.memory_allocated()
    return {"max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": max_reserved, "used": used,
            # nvidia-smi at the reserved peak: memory outside the allocator is unchanged, the pool was larger
            "used_peak": used - reserved + max_reserved, "allocated_end": allocated,
            "allocated": allocated, "reserved": reserved,
            "num_alloc_retries": int(torch.cuda.memory_stats().get("num_alloc_retries", 0))}
