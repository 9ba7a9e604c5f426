"""A real ``transformers.Trainer`` run on one CUDA GPU, phase by phase, plain and under DeepSpeed ZeRO-2/3.

Issue 19: users see the whole run, not one step. This runs the real thing under ``torch.distributed.run`` with one
process (NCCL): the model built with random weights on the CPU in bf16 (where ``from_pretrained`` without a
``device_map`` leaves it), ``Trainer.train()`` for three optimizer steps, ``Trainer.evaluate()`` on 8 samples, then
``Trainer.save_model()``. A callback reads the caching allocator's counters
(``max_memory_allocated/reserved``, ``mem_get_info`` used bytes, ``num_alloc_retries``):

* ``prepare``: at ``on_train_begin`` (the Trainer's device move, or ``deepspeed.initialize``: the ZeRO optimizer's
  fp32 master partitions and flat buffers);
* ``step1``: the first step (optimizer states made); ``step``: steps 2-3 (peaks reset after step 1);
* ``eval``: ``evaluate()`` (``prediction_step`` keeps the logits of every batch: no ``eval_accumulation_steps``);
* ``save``: ``save_model()`` (ZeRO-3: ``stage3_gather_16bit_weights_on_model_save``).

DeepSpeed configs are the Hugging Face documentation's (``"auto"`` values, ``overlap_comm`` and
``contiguous_gradients`` on); with no ``optimizer`` section the Trainer builds its own ``adamw_torch_fused`` and
sets ``zero_allow_untested_optimizer`` (transformers ``integrations/deepspeed.py`` ``deepspeed_optim_sched``), so
no DeepSpeed op is compiled.

Measurement only on the device (GPU time is scarce): ``--rescore FILE`` adds ``fitcheck estimate`` of the same
flags on any machine. ``PYTHONPATH=. python benchmarks/trainer_gpu.py --out DIR`` (GPU only).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
PREFIX = "TRAINER_GPU_RESULT "
MODEL = "meta-llama/Llama-3.2-1B"
BATCH, SEQ, EVAL_SAMPLES = 4, 1024, 8
_Z = {"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto"}
DS_CONFIGS: dict[str, dict[str, Any]] = {
    "zero2": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8, "reduce_scatter": True, **_Z},
    "zero3": {"stage": 3, "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
              "stage3_gather_16bit_weights_on_model_save": True, **_Z},
}
# name: (DeepSpeed config key or None, LoRA, gradient checkpointing)
CASES: dict[str, tuple[str | None, bool, bool]] = {
    "trainer bf16 full": (None, False, False),
    "zero2 bf16 full": ("zero2", False, False),
    "zero3 bf16 full": ("zero3", False, False),
    "trainer bf16 lora ckpt": (None, True, True),
}


def ds_config(key: str) -> dict[str, Any]:
    """The Hugging Face docs' DeepSpeed config for a stage (``"auto"`` filled by the Trainer)."""
    return {"bf16": {"enabled": "auto"}, "zero_optimization": DS_CONFIGS[key],
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto", "steps_per_print": 1000000}


def estimate_argv(model_dir: Path, case: str, work: Path) -> list[str]:
    """``fitcheck estimate`` flags of a case (its DeepSpeed config written to ``work``)."""
    ds, lora, ckpt = CASES[case]
    argv = ["--model_name_or_path", str(model_dir), "--dtype", "bfloat16", "--bf16", "--num_processes", "1",
            "--optim", "adamw_torch_fused", "--per_device_train_batch_size", str(BATCH), "--max_seq_length",
            str(SEQ), "--per_device_eval_batch_size", str(BATCH), "--device_type", "cuda"]
    if ds:
        path = work / f"ds_{ds}.json"
        path.write_text(json.dumps(ds_config(ds)), encoding="utf-8")
        argv += ["--deepspeed", str(path)]
    if lora:
        argv += ["--use_peft", "--lora_r", "16", "--lora_alpha", "32", "--lora_target_modules", "all-linear"]
    return argv + (["--gradient_checkpointing"] if ckpt else [])


def worker(case: str) -> dict[str, Any]:
    """One case under ``torch.distributed.run`` (1 process): the real Trainer run, phase by phase."""
    import os

    ds, lora, ckpt = CASES[case]
    out: dict[str, Any] = {"case": case, "model": MODEL, "batch": BATCH, "seq": SEQ, "status": "ok"}
    started = time.perf_counter()
    dry = os.environ.get("TRAINER_GPU_DRY") == "1"
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if dry else "cuda")
    from fsdp_gpu import _counters as cuda_counters
    from fsdp_gpu import build_on_cpu, failed, probe

    try:
        import torch
        import transformers
        from gpu_truth import _environment

        if dry:
            torch.cuda.reset_peak_memory_stats = lambda *a: None

        def _counters() -> dict[str, int]:  # the CPU rehearsal has no allocator to read
            return {} if dry else cuda_counters()

        from fitcheck.catalog import find_catalog_config

        out["environment"] = _environment("cpu" if dry else "cuda")
        with tempfile.TemporaryDirectory(prefix="trainer_gpu_") as tmp:
            work = Path(tmp)
            found = find_catalog_config(MODEL)
            assert found is not None
            config = found[0]
            measured: dict[str, Any] = {}
            if dry:  # a CPU rehearsal of the harness at tiny widths (no counters)
                from gpu_truth import tiny_config

                from fitcheck.torch_adapters import hf_config, model_class, reduced_config

                config = reduced_config(tiny_config(config), 2)
                model = model_class(config)._from_config(hf_config(config, "sdpa"), dtype=torch.bfloat16)
            else:  # built before TrainingArguments: no zero.Init (the ZeRO-3 engine partitions at initialize)
                model = build_on_cpu(config, torch.bfloat16)
            model.config.use_cache = False
            targs = transformers.TrainingArguments(
                output_dir=str(work / "out"), per_device_train_batch_size=BATCH, per_device_eval_batch_size=BATCH,
                max_steps=3, bf16=True, optim="adamw_torch_fused", save_strategy="no", report_to="none",
                logging_steps=1000, dataloader_num_workers=0, gradient_checkpointing=ckpt,
                deepspeed=ds_config(ds) if ds else None, use_cpu=dry)
            if lora:
                import peft

                model = peft.get_peft_model(model, peft.LoraConfig(
                    r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear", task_type="CAUSAL_LM"))
            ids = torch.randint(0, int(config["vocab_size"]), (BATCH * 3 + EVAL_SAMPLES, SEQ))
            data = [{"input_ids": r, "labels": r} for r in ids]

            trainer = transformers.Trainer(model=model, args=targs, train_dataset=data[:BATCH * 3],
                                           eval_dataset=data[BATCH * 3:], callbacks=[probe(measured, _counters)])
            torch.cuda.reset_peak_memory_stats()
            trainer.train()
            measured["step"] = _counters()
            for phase, call in (("eval", trainer.evaluate), ("save", lambda: trainer.save_model(str(work / "s")))):
                torch.cuda.reset_peak_memory_stats()
                try:
                    call()
                    measured[phase] = _counters()
                except Exception as exc:  # a later phase's failure keeps the earlier ones
                    measured[phase] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            out["measured"] = measured
    except Exception as exc:
        failed(out, exc)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


PHASES = ("prepare", "step1", "step", "eval", "save")
EST_PHASE = {"step": None, "eval": "evaluation", "save": "save"}  # estimate phase per measured phase


def table(rows: list[dict[str, Any]]) -> str:
    """Measured allocated / reserved GiB per phase, and the estimate's where it has one."""
    g = 2**30
    lines = [f"{'case':24} {'status':6} | " + " | ".join(f"{p:>17}" for p in PHASES) + " | est step a/r | err a/r"]
    for r in rows:
        m, e = r.get("measured") or {}, r.get("estimate") or {}
        cells = []
        for p in PHASES:
            c = m.get(p) or {}
            cells.append(f"{(c.get('max_allocated') or 0) / g:7.2f}/{(c.get('max_reserved') or 0) / g:7.2f}"
                         if "max_allocated" in c else f"{'-':>17}")
        step = m.get("step") or {}
        ea, er = e.get("peak_allocated_bytes"), e.get("peak_reserved_bytes")
        sa, sr = step.get("max_allocated"), step.get("max_reserved")
        est = f"{(ea or 0) / g:6.2f}/{(er or 0) / g:6.2f}" if ea else f"{'-':>13}"
        err = (f"{(ea - sa) / sa * 100:+6.1f}%/{(er - sr) / sr * 100:+6.1f}%" if ea and er and sa and sr else "-")
        lines.append(f"{r['case']:24} {r.get('status', '?'):6} | " + " | ".join(cells) + f" | {est} | {err}")
        if r.get("status") != "ok":
            lines.append(f"   -> {(r.get('error') or '')[:600]}")
    return "\n".join(lines)


def rescore(path: Path) -> list[dict[str, Any]]:
    """The measured rows of a data file with ``fitcheck estimate`` of their flags (measurements untouched)."""
    from fsdp_gpu import model_dir, rescore_rows

    return rescore_rows(path, CASES, lambda work, r: estimate_argv(model_dir(work, MODEL), r["case"], work))


def main(argv: list[str]) -> int:
    """Run the cases (each in its own 1-process ``torch.distributed.run``), print, write ``trainer_gpu_<gpu>.json``."""
    from fsdp_gpu import cases_main

    return cases_main(argv, "trainer_gpu", list(CASES), PREFIX, worker, rescore, table, 120.0, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
