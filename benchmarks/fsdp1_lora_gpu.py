"""Issue 19: the fms-acceleration FSDP1 LoRA / QLoRA runs on one CUDA GPU, with and without FSDP1, and what the
caching allocator holds at the step's peak.

The fms A100 table (``benchmarks/data/published_reports_session20.json``) shows FSDP1 LoRA and FSDP-QLoRA runs
above fitcheck (Mistral-7B LoRA 2 x 4 x 4096: -9.4 %; Llama-2-70B QLoRA 2 x 2 x 4096: -22.7 %, and a false
"fits" at micro-batch 4) while the same runs on one GPU without FSDP are within 2 %. ``fsdp1_lora_cpu.py`` found
no FSDP-only bytes on CPU (2 gloo ranks, either stack). This runs the same settings on CUDA, where the kernels
(SDPA's flash backend, bitsandbytes' CUDA 4-bit path) and the caching allocator are the real ones:

- LoRA r 16 / alpha 16 / dropout 0.1 on q/k/v/o (fms ``scenarios.yaml``), reentrant gradient checkpointing and
  ``enable_input_require_grads`` (TRL 0.13 ``sft_trainer.py``), ``adamw_torch``, random token ids as labels;
- LoRA cases: bf16 weights, fp32 adapters (peft's default), no autocast (the fms scenario sets neither bf16 nor
  fp16); QLoRA cases: nf4, double quant, bf16 compute and bf16 quant storage, bf16 adapters
  (``autocast_adapter_dtype=False``: TRL 0.13's sharded-QLoRA path), ``bf16=True``, no k-bit preparation;
- ``fsdp1`` cases: the real Trainer with ``fsdp="full_shard auto_wrap"`` (FULL_SHARD, BACKWARD_PRE, no forward
  prefetch, ``use_orig_params``, the Trainer's peft auto-wrap policy for a PEFT model) under
  ``torch.distributed.run`` with one process (NCCL); ``plain`` cases: the same Trainer without FSDP;
- ``old`` cases run on the fms runs' own transformers 4.48.1 / peft 0.13.2 / accelerate 1.0.1 (wheels put in
  front of the path by the session script: ``FSDP1_GPU_OLD_SITE``).

Per case: the allocator's counters at ``on_train_begin`` (``prepare``), after step 1, over step 2 and step 3
(peaks reset between), and for step 2 a ``torch.cuda.memory._record_memory_history`` trace, reduced here to the
blocks live at the step's allocated peak, grouped by the Python frames that allocated them (``at_peak``), so that a
byte fitcheck misses has a name. Depth is reduced for the 70B model (``layers``); the per-layer terms scale.

Measurement only on the device; ``--rescore FILE`` adds ``fitcheck estimate`` of the same flags on any machine.
``PYTHONPATH=. python benchmarks/fsdp1_lora_gpu.py --out DIR [--cases ...]`` (GPU only).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
PREFIX = "FSDP1_LORA_GPU_RESULT "
SEQ = 4096
MISTRAL, LLAMA70 = "mistralai/Mistral-7B-v0.1", "meta-llama/Llama-2-70b-hf"
# name: model, layers (None: all), 4-bit base, FSDP1, micro-batch, stack ("old": the fms runs' versions)
CASES: dict[str, dict[str, Any]] = {
    "mistral LoRA fsdp1 b4": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4},
    "mistral LoRA plain b4": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": False, "micro": 4},
    "llama70b-4L QLoRA fsdp1 b2": {"model": LLAMA70, "layers": 4, "qlora": True, "fsdp": True, "micro": 2},
    "llama70b-4L QLoRA plain b2": {"model": LLAMA70, "layers": 4, "qlora": True, "fsdp": False, "micro": 2},
    "mistral LoRA fsdp1 b4 old": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4,
                                  "stack": "old"},
    "llama70b-4L QLoRA fsdp1 b2 old": {"model": LLAMA70, "layers": 4, "qlora": True, "fsdp": True, "micro": 2,
                                       "stack": "old"},
    "mistral QLoRA fsdp1 b4": {"model": MISTRAL, "layers": 8, "qlora": True, "fsdp": True, "micro": 4},
    "mistral QLoRA plain b4": {"model": MISTRAL, "layers": 8, "qlora": True, "fsdp": False, "micro": 4},
    # second call: which of the fms stack and FSDP1 holds the missing bytes, with the C++ frames of the blocks
    "mistral LoRA plain b4 old": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": False, "micro": 4,
                                  "stack": "old"},
    "mistral LoRA fsdp1 b4 old detail": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4,
                                         "stack": "old", "detail": True},
    "mistral LoRA fsdp1v1 b4": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4,
                                "fsdp_version": 1, "detail": True},
    "llama70b-4L QLoRA fsdp1 b2 old detail": {"model": LLAMA70, "layers": 4, "qlora": True, "fsdp": True,
                                              "micro": 2, "stack": "old", "detail": True},
    "llama70b-4L QLoRA fsdp1v1 b2": {"model": LLAMA70, "layers": 4, "qlora": True, "fsdp": True, "micro": 2,
                                     "fsdp_version": 1, "detail": True},
    # third call: the held inputs at another depth and micro-batch (the fms 2 x 4 row's per-GPU shape, 16 layers)
    "llama70b-16L QLoRA fsdp1 b4 old": {"model": LLAMA70, "layers": 16, "qlora": True, "fsdp": True, "micro": 4,
                                        "stack": "old"},
    "llama70b-4L QLoRA plain b2 old": {"model": LLAMA70, "layers": 4, "qlora": True, "fsdp": False, "micro": 2,
                                       "stack": "old"},
    # fourth call (s21-frag, prepared): which part of the 16-layer row's reserved a GPU at its limit needs
    # (fsdp1_lora_trace.py): every allocator event of the run, replayed here, and the run capped after its load.
    # "fsdpload": loaded as the fms runs load (accelerate.yaml fsdp_cpu_ram_efficient_loading): transformers 4.48.1
    # modeling_utils.py l.876-889 quantises each weight on the GPU and moves it to the CPU (rank 0) under
    # is_fsdp_enabled() (l.148: process group up, ACCELERATE_USE_FSDP, FSDP_CPU_RAM_EFFICIENT_LOADING), and FSDP1
    # moves each unit back before flattening it; the other rows load to the GPU and flatten there (prepare's cache)
    "llama70b-16L QLoRA fsdp1 b4 old fsdpload trace": {"model": LLAMA70, "layers": 16, "qlora": True, "fsdp": True,
                                                       "micro": 4, "stack": "old", "full_trace": True,
                                                       "fsdp_load": True},
    # capped after the load: fitcheck's allocator replay of the harness (from_pretrained's events, the Trainer's
    # free_memory() empty_cache, each unit flattened while the model is on the GPU, the traced step) runs Mistral
    # from 24.15 GiB (the 13.5 GiB flattening cache is whole segments: released and retried) and the 4-layer 70B
    # from 9.37 GiB (its cache is split by the step); cap24.0 / cap8.9 should run out of memory, cap24.5 should not
    "mistral LoRA fsdp1v1 b4 cap24.5": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4,
                                        "fsdp_version": 1, "cap_gib": 24.5},
    "mistral LoRA fsdp1v1 b4 cap24.0": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4,
                                        "fsdp_version": 1, "cap_gib": 24.0},
    "llama70b-4L QLoRA fsdp1v1 b2 cap8.9": {"model": LLAMA70, "layers": 4, "qlora": True, "fsdp": True, "micro": 2,
                                            "fsdp_version": 1, "cap_gib": 8.9},
    "llama70b-16L QLoRA fsdp1 b4 old trace": {"model": LLAMA70, "layers": 16, "qlora": True, "fsdp": True,
                                              "micro": 4, "stack": "old", "full_trace": True},
    "llama70b-16L QLoRA fsdp1 b4 old cap27": {"model": LLAMA70, "layers": 16, "qlora": True, "fsdp": True,
                                              "micro": 4, "stack": "old", "cap_gib": 27.0},
    "llama70b-16L QLoRA fsdp1 b4 old cap30": {"model": LLAMA70, "layers": 16, "qlora": True, "fsdp": True,
                                              "micro": 4, "stack": "old", "cap_gib": 30.0},
    # the LoRA model loaded on the CPU, as a user's FSDP1 run loads it (FSDP moves each unit, then flattens)
    "mistral LoRA fsdp1 b4 old cpuload": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4,
                                          "stack": "old", "build_on": "cpu"},
    # fifth call (session 23): the Mistral row whose capped runs contradicted the harness's replay (it predicted a
    # run from 24.15 GiB; capped at 24.5 and 24.0 it ran out of memory): its every allocator event, for
    # fsdp1_lora_trace.py's replay and least capacity
    "mistral LoRA fsdp1v1 b4 trace": {"model": MISTRAL, "layers": None, "qlora": False, "fsdp": True, "micro": 4,
                                      "fsdp_version": 1, "full_trace": True},
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
# frames from these files say nothing about who allocated (torch's own dispatch, autograd, hooks)
_SKIP = ("/torch/autograd/", "/torch/utils/checkpoint.py", "/torch/nn/modules/module.py", "/torch/_tensor.py",
         "/torch/utils/_contextlib.py", "/torch/_ops.py", "/torch/overrides.py")


def _short(frame: dict[str, Any]) -> str:
    name = str(frame.get("filename", ""))
    for root in ("site-packages/", "/torch/"):
        if root in name:
            name = name.split(root, 1)[1] if root == "site-packages/" else "torch/" + name.split(root, 1)[1]
            break
    return f"{frame.get('name')}@{name}:{frame.get('line')}"


def frames_key(frames: list[dict[str, Any]], depth: int = 4) -> str:
    """The innermost ``depth`` Python frames of an allocation that are not torch's dispatch or autograd."""
    kept = [f for f in frames if str(f.get("filename", "")).endswith(".py")
            and not any(s in str(f.get("filename", "")) for s in _SKIP)]
    return " < ".join(_short(f) for f in kept[:depth]) or "(no python frame)"


def _big_blocks(trace: list[dict[str, Any]], held: dict[int, dict[str, Any]], peak_at: int,
                min_bytes: int = 32 * 2**20) -> list[dict[str, Any]]:
    """The blocks of at least ``min_bytes`` live at the peak: size, when allocated and freed (event index), and
    every frame (C++ ones too where recorded), innermost first."""
    index = {id(ev): i for i, ev in enumerate(trace)}
    freed: dict[int, int] = {}
    for i in range(peak_at + 1, len(trace)):
        ev = trace[i]
        if ev.get("action") == "free_requested":
            freed.setdefault(int(ev.get("addr", 0)), i)
    out = []
    for addr, ev in sorted(held.items(), key=lambda kv: -int(kv[1]["size"])):
        if int(ev["size"]) < min_bytes:
            continue
        out.append({"size": int(ev["size"]), "alloc_event": index[id(ev)], "free_event": freed.get(addr),
                    "frames": [_short(f) for f in (ev.get("frames") or [])[:40]]})
    return out


def live_at_peak(trace: list[dict[str, Any]], baseline: int, top: int = 40, detail: bool = False) -> dict[str, Any]:
    """Replay a memory-history trace (one device): the allocated peak over the window (``alloc`` adds,
    ``free_requested`` removes, as ``memory_allocated`` counts), and the blocks allocated in the window still live
    at that moment, grouped by their frames. ``baseline``: bytes allocated when the window began."""
    cur = peak = peak_at = 0
    live: dict[int, int] = {}
    for i, ev in enumerate(trace):
        action, addr, size = ev.get("action"), int(ev.get("addr", 0)), int(ev.get("size", 0))
        if action == "alloc":
            live[addr] = size
            cur += size
        elif action == "free_requested" and addr in live:
            cur -= live.pop(addr)
        if cur > peak:
            peak, peak_at = cur, i
    held: dict[int, dict[str, Any]] = {}
    for ev in trace[:peak_at + 1]:
        action, addr = ev.get("action"), int(ev.get("addr", 0))
        if action == "alloc":
            held[addr] = ev
        elif action == "free_requested":
            held.pop(addr, None)
    groups: dict[str, dict[str, Any]] = {}
    for ev in held.values():
        g = groups.setdefault(frames_key(ev.get("frames") or []), {"bytes": 0, "count": 0, "sizes": {}})
        g["bytes"] += int(ev["size"])
        g["count"] += 1
        g["sizes"][str(ev["size"])] = g["sizes"].get(str(ev["size"]), 0) + 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1]["bytes"])
    rows = [{"frames": k, "bytes": v["bytes"], "count": v["count"],
             "sizes": dict(sorted(v["sizes"].items(), key=lambda kv: -kv[1])[:4])} for k, v in ranked[:top]]
    return {"baseline": baseline, "window_peak": baseline + peak, "events": len(trace), "peak_event": peak_at,
            "held_in_window": sum(v["bytes"] for v in groups.values()), "groups": rows,
            "other_bytes": sum(v["bytes"] for _, v in ranked[top:]),
            **({"big": _big_blocks(trace, held, peak_at)} if detail else {})}


def _model_config(case: dict[str, Any]) -> dict[str, Any]:
    from fitcheck.catalog import find_catalog_config

    found = find_catalog_config(case["model"])
    assert found is not None, case["model"]
    config = dict(found[0])
    if case["layers"]:
        config["num_hidden_layers"] = case["layers"]
    return config


def _build(case: dict[str, Any], config: dict[str, Any], work: Path) -> Any:
    """The model on the GPU, random weights (seed 0), bf16; QLoRA: saved, then loaded 4-bit (quantise on load)."""
    import torch
    import transformers

    old = int(transformers.__version__.split(".")[0]) < 5
    dtype_kw = {"torch_dtype" if old else "dtype": torch.bfloat16}
    fields = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version", "torch_dtype")}
    cfg = transformers.AutoConfig.for_model(config["model_type"], **fields)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(case.get("build_on", "cuda")):
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", **dtype_kw)
    if case["qlora"]:
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
        path = Path(tempfile.mkdtemp(prefix="fsdp1_lora_gpu_", dir=shm))
        model.save_pretrained(str(path))
        del model
        torch.cuda.empty_cache()
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), quantization_config=quant, device_map={"": 0}, attn_implementation="sdpa", **dtype_kw)
        for f in path.iterdir():
            f.unlink()
        path.rmdir()
    model.config.use_cache = False
    return model


def worker(name: str) -> dict[str, Any]:
    """One case under ``torch.distributed.run`` (1 process)."""
    import traceback

    case = CASES[name]
    out: dict[str, Any] = {"case": name, **case, "seq": SEQ, "status": "ok"}
    started = time.perf_counter()
    try:
        import peft
        import torch
        import transformers
        from gpu_truth_step import _cuda_counters, _environment

        out["environment"] = _environment("cuda")
        out["environment"]["peft"] = peft.__version__
        tracing = bool(case.get("full_trace"))
        marks: dict[str, int] = {}
        if tracing:  # every allocator event from before the build (fsdp1_lora_trace.py)
            from fsdp1_lora_trace import mark, start, write

            start()
        if case.get("fsdp_load"):  # load as an FSDP run loads (fsdp_cpu_ram_efficient_loading), see CASES
            os.environ.update(ACCELERATE_USE_FSDP="true", FSDP_CPU_RAM_EFFICIENT_LOADING="1")
            torch.cuda.set_device(0)
            torch.distributed.init_process_group("nccl")
        with tempfile.TemporaryDirectory(prefix="fsdp1_lora_gpu_") as tmp:
            work = Path(tmp)
            config = _model_config(case)
            model = _build(case, config, work)
            out["load"] = _cuda_counters()
            if tracing:
                marks["load"] = mark()
            if case.get("cap_gib"):  # the allocator's allowed_memory_maximum from here on (fsdp1_lora_trace.py)
                total = torch.cuda.get_device_properties(0).total_memory
                out["cap_bytes"] = int(float(case["cap_gib"]) * 2**30)
                torch.cuda.set_per_process_memory_fraction(out["cap_bytes"] / total)
            torch.cuda.reset_peak_memory_stats()
            model = peft.get_peft_model(
                model, peft.LoraConfig(r=16, lora_alpha=16, lora_dropout=0.1, target_modules=TARGETS,
                                       task_type="CAUSAL_LM"),
                **({"autocast_adapter_dtype": False} if case["qlora"] else {}))
            model.enable_input_require_grads()
            micro = int(case["micro"])
            ids = torch.randint(0, int(config["vocab_size"]), (micro * 3, SEQ))
            data = [{"input_ids": r, "labels": r} for r in ids]
            fsdp: dict[str, Any] = {}
            if case["fsdp"]:
                layer_cls = "MistralDecoderLayer" if config["model_type"] == "mistral" else "LlamaDecoderLayer"
                fsdp = {"fsdp": "full_shard auto_wrap", "fsdp_config": {
                    "backward_prefetch": "backward_pre", "forward_prefetch": False, "use_orig_params": True,
                    "sync_module_states": bool(case.get("fsdp_load")), "transformer_layer_cls_to_wrap": [layer_cls],
                    **({"cpu_ram_efficient_loading": True} if case.get("fsdp_load") else {}),
                    **({"fsdp_version": case["fsdp_version"]} if case.get("fsdp_version") else {})}}
            measured: dict[str, Any] = {}

            class Probe(transformers.TrainerCallback):  # type: ignore[misc]
                def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                    measured["prepare"] = _cuda_counters()
                    if tracing:
                        marks["prepare"] = mark()
                    measured["param_dtypes"] = sorted({f"{p.dtype}:{p.requires_grad}"
                                                       for p in kw["model"].parameters()})
                    torch.cuda.reset_peak_memory_stats()

                def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                    step = state.global_step
                    measured[f"step{step}"] = _cuda_counters()
                    if tracing:  # the full trace is kept whole: no step-2 window (its blocks are in the file)
                        marks[f"step{step}"] = mark()
                    elif step == 2:
                        snap = torch.cuda.memory._snapshot()
                        torch.cuda.memory._record_memory_history(enabled=None)
                        measured["at_peak"] = live_at_peak(snap["device_traces"][0], measured["step2_start"],
                                                           detail=bool(case.get("detail")))
                    torch.cuda.reset_peak_memory_stats()
                    if step == 1 and not tracing:
                        measured["step2_start"] = torch.cuda.memory_allocated()
                        torch.cuda.memory._record_memory_history(enabled="all", context="alloc",
                                                                 stacks="all" if case.get("detail") else "python",
                                                                 max_entries=400000,
                                                                 clear_history=True)

            targs = transformers.TrainingArguments(
                output_dir=str(work / "out"), per_device_train_batch_size=micro, max_steps=3,
                gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True},
                bf16=bool(case["qlora"]), optim="adamw_torch", save_strategy="no", report_to="none",
                logging_steps=1000, dataloader_num_workers=0, disable_tqdm=True, seed=0, **fsdp)
            trainer = transformers.Trainer(model=model, args=targs, train_dataset=data, callbacks=[Probe()])
            torch.cuda.reset_peak_memory_stats()
            trainer.train()
            out["measured"] = measured
            if tracing:
                name_ok = "".join(c if c.isalnum() else "_" for c in name)
                target = Path(os.environ.get("FSDP1_GPU_TRACE_DIR") or work) / f"{name_ok}.trace.json.gz"
                out.update(write(target, marks, {"load": out["load"], **{k: v for k, v in measured.items()
                                                                          if k in marks}}))
    except Exception as exc:
        oom = "out of memory" in str(exc).lower()
        out.update(status="oom" if oom else "error", error=f"{type(exc).__name__}: {exc}"[:800],
                   traceback=traceback.format_exc()[-3000:])
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def run_case(name: str, timeout: float, trace_dir: str = "") -> dict[str, Any]:
    """One case in a fresh ``torch.distributed.run --nproc_per_node 1`` process; ``old`` cases with the fms
    stack's wheels (``FSDP1_GPU_OLD_SITE``) in front of the path."""
    import subprocess

    from gloo_rank import free_port

    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    if CASES[name].get("stack") == "old":
        old = os.environ.get("FSDP1_GPU_OLD_SITE")
        if not old:
            return {"case": name, "status": "skipped", "error": "FSDP1_GPU_OLD_SITE not set"}
        path.insert(0, old)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)))
    env.setdefault("FSDP1_GPU_TRACE_DIR", trace_dir)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port",
           str(free_port()), str(Path(__file__).resolve()), "--worker", name]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"case": name, "status": "timeout"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PREFIX):
            return dict(json.loads(line[len(PREFIX):]))
    return {"case": name, "status": "crash", "error": (proc.stderr or proc.stdout)[-4000:]}


# the fms row each case re-runs (benchmarks/data/published_reports_session20.json): its LoRA, precision and stack
_FMS_ROW = {(MISTRAL, False): "FMS-lora-mistral-2x4", (MISTRAL, True): "FMS-qlora-mistral-2x4",
            (LLAMA70, True): "FMS-qlora-llama70-2x2"}


def case_spec(row: dict[str, Any], case: dict[str, Any]) -> Any:
    """fitcheck's ``TrainingSpec`` of a measured case: the fms row's reading (``published_rows.plan_row``) at this
    case's model depth, micro-batch, attention (SDPA), placement (one GPU; FSDP1 on the fms stack, FSDP2 on the
    installed one, whose transformers 5.23 ``fsdp`` argument defaults to version 2) and library versions (the
    worker's own)."""
    import dataclasses

    from published_rows import load_rows, plan_row

    from fitcheck.readers import inventory_from_config
    from fitcheck.spec import FsdpSpec, ShardingSpec, Strategy

    fms = {r["id"]: r for r in load_rows(ROOT / "benchmarks" / "data" / "published_reports_session20.json")}
    base = fms[_FMS_ROW[(case["model"], bool(case["qlora"]))]]
    env = row.get("environment") or {}
    versions = {k: str(env[k]).split("+")[0] for k in ("torch", "transformers", "peft", "accelerate", "bitsandbytes")
                if env.get(k)}
    old = case.get("stack") == "old"
    fake = dict(base, micro_batch_size=case["micro"], seq_len=SEQ, attention_impl="sdpa", num_gpus=1,
                distributed="single GPU", versions=versions, gpu="H200", memory_gib=1.0)
    fake.pop("trainer", None)  # the harness runs transformers' Trainer itself (the fms rows: TRL 0.13 SFTTrainer)
    plan = plan_row(fake)
    assert not hasattr(plan, "reason"), plan
    spec = plan.build(inventory_from_config(_model_config(case), case["model"], "catalog, depth edited"))
    if case["fsdp"]:
        version = 1 if old else int(case.get("fsdp_version") or 2)
        sharding = ShardingSpec(strategy=Strategy.FSDP, num_processes=1, fsdp=FsdpSpec(version=version))
        spec = dataclasses.replace(spec, sharding=sharding)
    return spec


def rescore(path: Path, default_path: bool = False) -> list[dict[str, Any]]:
    """Add fitcheck's estimate (the formula, or with ``default_path`` the CLI's default answer) to each ok row."""
    from fitcheck.core import estimate

    doc = json.loads(path.read_text(encoding="utf-8"))
    answer: Any = estimate
    if default_path:
        from fitcheck.torch_adapters import PinnedPath

        answer = PinnedPath()
    for row in doc["rows"]:
        if row.get("status") != "ok":
            continue
        report = answer(case_spec(row, CASES[row["case"]]))
        row["estimate"] = {"peak_allocated_bytes": report.peak_allocated_bytes,
                           "peak_reserved_bytes": report.peak_reserved_bytes, "peak_phase": report.peak_phase.value,
                           "pinned": report.pinned, "path": "default" if default_path else "formula",
                           "components": {c.name: c.at(report.peak_phase) for c in report.components
                                          if c.at(report.peak_phase) and c.location.value == "device"}}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return list(doc["rows"])


def table(rows: list[dict[str, Any]]) -> str:
    """Measured GiB per phase, the estimate where ``--rescore`` added it."""
    g = 2**30
    lines = [f"{'case':32} {'status':7} {'prep':>6} {'step2 alloc':>11} {'resv':>6} {'est':>6} {'err':>7} {'s':>5}"]
    for r in rows:
        m, e = r.get("measured") or {}, r.get("estimate") or {}
        s2 = m.get("step2") or {}
        a, ea = s2.get("max_allocated"), e.get("peak_allocated_bytes")
        err = f"{(ea - a) / a * 100:+6.1f}%" if a and ea else "-"
        prep = (m.get("prepare") or {}).get("allocated")
        lines.append(f"{r['case']:32} {r.get('status', '?'):7} {(prep or 0) / g:6.2f} {(a or 0) / g:11.2f} "
                     f"{(s2.get('max_reserved') or 0) / g:6.2f} {(ea or 0) / g:6.2f} {err:>7} "
                     f"{r.get('seconds', 0):5.0f}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from fsdp_gpu import case_arguments, run_cases

    ap = case_arguments(__doc__, list(CASES), 120.0)
    ap.add_argument("--default_path", action="store_true", help="with --rescore: the CLI's default answer")
    args = ap.parse_args(argv)
    if args.rescore:
        print(table(rescore(Path(args.rescore), args.default_path)))
        return 0
    if args.worker:
        print(PREFIX + json.dumps(worker(args.worker)), flush=True)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save(rows: list[dict[str, Any]]) -> None:
        doc = {"schema": 1, "command": ["benchmarks/fsdp1_lora_gpu.py", *argv], "rows": rows}
        (out / "fsdp1_lora_gpu.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")

    rows = run_cases(args.cases, args.budget_s, args.timeout_s,
                     lambda name, t: run_case(name, t, str(out.resolve())), save)
    print(table(rows))
    return 0 if any(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
