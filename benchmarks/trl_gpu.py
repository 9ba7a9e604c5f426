"""Real TRL 1.16 trainers on one CUDA GPU at real width, phase by phase (issue 19: the whole run on CUDA).

``trl_truth.py`` checks the TRL trainers on CPU at tiny widths (live tensor bytes). This runs the same real
trainers (``trl_truth.build_trainer``: the model saved with random weights and loaded by TRL from that path, as it
loads a Hub id; TRL's own config defaults: bf16, gradient checkpointing, ``adamw_torch_fused``) on the GPU at a real
width (Qwen2.5-0.5B's config.json from the catalog), each case in its own process, and reads the caching allocator's
counters (``max_memory_allocated/reserved``, ``mem_get_info`` used bytes):

* ``load``: after the trainer's construction (TRL's ``from_pretrained`` of the policy, and of the reference copy
  where there is one, the Trainer's device move, peft's wrapping);
* ``prepare``: at ``on_train_begin`` (accelerate's ``prepare``, the optimizer not yet stepped);
* ``step1``: the first step (optimizer states made); ``step``: step 2 (``trl_truth``'s ``max_steps=2``; peaks
  reset after step 1);
* GRPO: ``generation``, the peak of ``GRPOTrainer._generate`` in step 2 (peaks reset around it), and
  ``before_generation`` / ``training`` (the step's peak before and after it).

Measurement only on the device (GPU time is scarce): ``--rescore FILE`` adds ``fitcheck estimate`` of the same
flags on any machine. ``PYTHONPATH=. python benchmarks/trl_gpu.py --out DIR`` (GPU only);
``TRL_GPU_DRY=1 ... --worker CASE`` rehearses one case on the CPU at a tiny width (no counters).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from trl_truth import TRL_LORA, Case  # noqa: E402

from fitcheck.core.trainers import TrainerKind  # noqa: E402

PREFIX = "TRL_GPU_RESULT "
MODEL = "Qwen/Qwen2.5-0.5B"
# name -> case at real width, in the order they run (the least measured first); the worker fills Case.model
# and vocab from the catalog
CASES: dict[str, Case] = {c.name: c for c in (
    Case("grpo LoRA 8 gen 128+256", TrainerKind.GRPO, batch=8, length=256, prompt=128, lora=TRL_LORA,
         extra={"num_generations": 8}),
    Case("dpo LoRA 2x(256+256)", TrainerKind.DPO, batch=2, length=256, prompt=256, lora=TRL_LORA),
    Case("sft LoRA 4x1024", TrainerKind.SFT, batch=4, length=1024, lora=TRL_LORA),
    Case("grpo full beta0.04 8 gen 128+256", TrainerKind.GRPO, batch=8, length=256, prompt=128,
         extra={"num_generations": 8, "beta": 0.04}),
    Case("dpo full 2x(256+256)", TrainerKind.DPO, batch=2, length=256, prompt=256),
    Case("kto LoRA 4x(256+256)", TrainerKind.KTO, batch=4, length=256, prompt=256, lora=TRL_LORA),
    Case("sft full 4x1024", TrainerKind.SFT, batch=4, length=1024),
    Case("reward LoRA 4x512", TrainerKind.REWARD, batch=4, length=512, lora=TRL_LORA),
)}
ARG_KEYS = ("bf16", "fp16", "gradient_checkpointing", "optim", "per_device_train_batch_size", "max_length",
            "max_prompt_length", "max_completion_length", "num_generations", "beta", "steps_per_generation",
            "generation_batch_size", "loss_type", "padding_free", "packing", "precompute_ref_log_probs",
            "disable_dropout", "use_liger_kernel", "gradient_accumulation_steps")


def _case_at_width(name: str, dry: bool) -> Case:
    from fitcheck.catalog import find_catalog_config

    case = CASES[name]
    if dry:  # the CPU rehearsal: trl_truth's tiny Llama, short sequences
        return dataclasses.replace(case, length=min(case.length, 32), prompt=min(case.prompt, 16))
    found = find_catalog_config(MODEL)
    assert found is not None
    config = dict(found[0])
    return dataclasses.replace(case, model=config, vocab=int(config["vocab_size"]))


def live_blocks(top: int = 30) -> list[dict[str, Any]]:
    """The caching allocator's allocated blocks grouped by the Python stack that allocated them (the largest
    ``top`` groups): ``torch.cuda.memory._snapshot()`` with the history ``TRL_GPU_SNAPSHOT=1`` starts recording.
    What it is for: the 8,225,280 B each loaded model holds above its parameters on the H200 rows, and the 13.6 MB
    (SFT) / 19.4 MB (DPO, GRPO with a reference) a full fine-tune keeps after its step beyond weights, states and the
    cuBLAS workspaces (s19-trl report), which the sources read so far do not explain."""
    import torch

    groups: dict[str, list[int]] = {}
    for seg in torch.cuda.memory._snapshot().get("segments", []):
        for block in seg.get("blocks", []):
            if block.get("state") != "active_allocated":
                continue
            frames = [f"{f.get('filename', '?').rsplit('site-packages/', 1)[-1]}:{f.get('line')} {f.get('name')}"
                      for f in block.get("frames", []) if str(f.get("filename", "")).endswith(".py")][:8]
            key = " <- ".join(frames) or "(no Python frames)"
            g = groups.setdefault(key, [0, 0])
            g[0] += int(block.get("size", 0))
            g[1] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"bytes": b, "blocks": n, "stack": k} for k, (b, n) in rows]


def worker(name: str) -> dict[str, Any]:
    """One case (own process): the real TRL trainer, phase by phase, the allocator's counters."""
    dry = os.environ.get("TRL_GPU_DRY") == "1"
    out: dict[str, Any] = {"case": name, "model": MODEL, "status": "ok"}
    started = time.perf_counter()
    from fsdp_gpu import _counters as cuda_counters
    from fsdp_gpu import failed

    try:
        import torch
        import transformers
        from gpu_truth import _environment
        from trl_truth import build_trainer

        def counters() -> dict[str, int]:
            return {} if dry else cuda_counters()

        snapshot = os.environ.get("TRL_GPU_SNAPSHOT") == "1" and not dry
        if snapshot:  # every allocation's stack from here on (what live_blocks groups)
            torch.cuda.memory._record_memory_history(max_entries=100000)

        def reset() -> None:
            if not dry:
                torch.cuda.reset_peak_memory_stats()

        out["environment"] = _environment("cpu" if dry else "cuda")
        with __import__("contextlib").suppress(Exception):
            out["environment"]["trl"] = __import__("trl").__version__
        case = _case_at_width(name, dry)
        measured: dict[str, Any] = {"steps": []}
        with tempfile.TemporaryDirectory(prefix="trl_gpu_") as path, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reset()
            t0 = time.perf_counter()
            trainer = build_trainer(case, path, use_cpu=dry)
            measured["load"] = counters()
            if snapshot:
                measured["load_blocks"] = live_blocks()
            measured["load_seconds"] = round(time.perf_counter() - t0, 1)
            out["trl_args"] = {k: getattr(trainer.args, k) for k in ARG_KEYS if hasattr(trainer.args, k)}
            out["trl_args"]["optim"] = str(out["trl_args"].get("optim"))
            out["trl_args"]["has_ref_model"] = getattr(trainer, "ref_model", None) is not None
            state: dict[str, Any] = {"current": None}

            class Probe(transformers.TrainerCallback):  # type: ignore[misc]
                def on_train_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
                    measured["prepare"] = counters()
                    model = kw["model"]
                    measured["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
                    measured["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
                    reset()

                def on_step_begin(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
                    state["current"] = {"step": st.global_step + 1}

                def on_step_end(self, args: Any, st: Any, control: Any, **kw: Any) -> None:
                    cur = state["current"] or {}
                    cur.update(end=counters())
                    measured["steps"].append(cur)
                    if st.global_step == 1:
                        measured["step1"] = counters()
                        if snapshot:
                            measured["step1_blocks"] = live_blocks()
                        reset()

            if case.trainer is TrainerKind.GRPO:
                generate = trainer._generate

                def timed_generate(*a: Any, **kw: Any) -> Any:
                    cur = state["current"]
                    if cur is None:
                        return generate(*a, **kw)
                    cur["before_generation"] = counters()
                    reset()
                    t = time.perf_counter()
                    result = generate(*a, **kw)
                    cur["generation"] = counters()
                    cur["generation_seconds"] = round(time.perf_counter() - t, 2)
                    reset()
                    return result

                trainer._generate = timed_generate
            trainer.add_callback(Probe())
            trainer.train()
            measured["step"] = counters()
        out["measured"] = measured
        out["case_fields"] = {"trainer": case.trainer.value, "batch": case.batch, "length": case.length,
                              "prompt": case.prompt, "lora": case.lora is not None, "extra": case.extra}
    except Exception as exc:
        failed(out, exc)
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def _peak(m: dict[str, Any], key: str) -> int | None:
    """The largest ``key`` counter over step 2 (``step`` and, for GRPO, the generation windows)."""
    vals = [((m.get("step") or {}).get(key))]
    for s in m.get("steps", []):
        if s.get("step", 0) >= 2:
            vals += [(s.get(w) or {}).get(key) for w in ("before_generation", "generation")]
    vals = [v for v in vals if v]
    return max(vals) if vals else None


def table(rows: list[dict[str, Any]]) -> str:
    """Measured allocated / reserved GiB per phase, and the estimate's peak where rescored."""
    g = 2**30
    head = (f"{'case':34} {'status':6} | {'load a/r':>13} | {'step1 a/r':>13} | {'step a/r':>13} | "
            f"{'gen a (s)':>12} | est a/r | err a/r")
    lines = [head]
    for r in rows:
        m, e = r.get("measured") or {}, r.get("estimate") or {}

        def ar(c: dict[str, Any] | None) -> str:
            c = c or {}
            return (f"{(c.get('max_allocated') or 0) / g:6.2f}/{(c.get('max_reserved') or 0) / g:6.2f}"
                    if "max_allocated" in c else f"{'-':>13}")

        gens = [s for s in m.get("steps", []) if s.get("generation") and s.get("step", 0) >= 2]
        gen = (f"{max(s['generation']['max_allocated'] for s in gens) / g:6.2f} "
               f"({max(s.get('generation_seconds', 0) for s in gens):4.1f})" if gens else f"{'-':>12}")
        sa, sr = _peak(m, "max_allocated"), _peak(m, "max_reserved")
        ea, er = e.get("peak_allocated_bytes"), e.get("peak_reserved_bytes")
        est = f"{(ea or 0) / g:5.2f}/{(er or 0) / g:5.2f}" if ea else "-"
        err = f"{(ea - sa) / sa * 100:+5.1f}%/{(er - sr) / sr * 100:+5.1f}%" if ea and er and sa and sr else "-"
        lines.append(f"{r['case']:34} {r.get('status', '?'):6} | {ar(m.get('load'))} | {ar(m.get('step1'))} | "
                     f"{ar(m.get('step'))} | {gen} | {est} | {err}")
        if r.get("status") != "ok":
            lines.append(f"   -> {(r.get('error') or '')[:600]}")
    return "\n".join(lines)


def estimate_argv(model_dir: Path, row: dict[str, Any]) -> list[str]:
    """``fitcheck estimate`` flags of a measured row (its case's fields and the TRL config it ran with)."""
    f, a = row["case_fields"], row["trl_args"]
    optim = str(a.get("optim", "adamw_torch")).split(".")[-1].lower()
    argv = ["--model_name_or_path", str(model_dir), "--trainer", f["trainer"], "--dtype", "bfloat16",
            "--bf16" if a.get("bf16") else "--no_bf16", "--optim", optim,
            "--per_device_train_batch_size", str(f["batch"]), "--max_seq_length", str(f["length"] + f["prompt"])]
    argv = [x for x in argv if x != "--no_bf16"]
    if a.get("gradient_checkpointing"):
        argv.append("--gradient_checkpointing")
    if f["trainer"] in ("dpo", "kto"):
        argv += ["--max_prompt_length", str(f["prompt"])]
    if f["trainer"] == "grpo":
        argv += ["--max_prompt_length", str(f["prompt"]), "--max_completion_length", str(f["length"]),
                 "--num_generations", str(a["num_generations"]), "--beta", str(a["beta"])]
    if f["lora"]:
        lora = TRL_LORA
        argv += ["--use_peft", "--lora_r", str(lora.r), "--lora_alpha", str(lora.alpha), "--lora_dropout",
                 str(lora.dropout), "--lora_target_modules", *lora.target_modules]
    return argv


def rescore(path: Path) -> list[dict[str, Any]]:
    """The measured rows with ``fitcheck estimate`` (the default path, and the formula's peak) of their flags
    (measurements untouched)."""
    from fsdp_gpu import model_dir, rescore_rows

    return rescore_rows(path, CASES, lambda work, r: estimate_argv(model_dir(work, MODEL), r))


def main(argv: list[str]) -> int:
    """Run the cases (each in its own 1-process ``torch.distributed.run``), print, write ``trl_gpu_<gpu>.json``."""
    from fsdp_gpu import cases_main

    return cases_main(argv, "trl_gpu", list(CASES), PREFIX, worker, rescore, table, 120.0, __doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
