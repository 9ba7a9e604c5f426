"""A REAL DeepSpeed 0.19.8 engine on CPU against ``fitcheck.torch_adapters.deepspeed_run_events``' sequence.

One gloo process, a tiny Llama loaded in bf16, the Trainer's two parameter groups in a fused torch AdamW (what
``optim="adamw_torch_fused"`` hands DeepSpeed), ``gradient_clipping`` 1.0 (the Trainer's ``max_grad_norm``), two
steps. Every storage from the model's parameters on is recorded (the tracer's ``LiveTensorRecorder``), through
``deepspeed.initialize``, both forwards, backwards and optimizer steps. The same run, composed from the fake-tensor
trace of the plain step (``whole_run_events``) and rewritten by ``deepspeed_run``, must leave the same live bytes
after ``initialize``, after each backward and after the first step, and make the same large allocations
(a quarter of the trainable bytes or more) in ``initialize`` and in the optimizer steps, and the same ipg buckets
per backward: the check of ``tests/test_deepspeed_run_events.py``. Not checked here: fp16 (read from source: its
overflow check allocates scalars only, ``runtime/utils.py`` ``has_inf_or_nan``), CUDA streams (one device).
More than one process (``MULTI``): one gloo process a rank (``gloo_rank.start_rank``), a rank's record (rank 0's
unless the run names another) against the rewrite of that rank; with gradient accumulation, ``engine.step()`` after
every micro-batch (it steps at the boundary), the live points being those after each step's last backward.

Run: ``PYTHONPATH=. python benchmarks/deepspeed_run_events_cpu.py [STAGE ...]`` (one line per run of ``RUNS``
and ``MULTI``; exit 1 on a difference; ~2 min of wall time for ``RUNS`` on a shared CPU, ~6 min more for
``MULTI`` under a load of 16 on 2 cores). Result: all 8 runs of ``RUNS`` (ZeRO-1/2/3 with ``overlap_comm`` off
and on, ZeRO-1 and ZeRO-2 LoRA) and all 12 of ``MULTI`` (ZeRO-1/2 on 2 and 3 processes, full and LoRA, with and
without ``overlap_comm``, rank 1 of 3; two micro-batches a step under ZeRO-2 on 1, 2 and 3 processes and ZeRO-3 on
one) the same live bytes (within 64 B) and the same large allocations. Not replayed (``deepspeed_run_plan.
not_replayed``): ZeRO-1 with gradient accumulation (its reduction at the
boundary only: here one ipg bucket a step, not one a micro-batch).
ZeRO-3 on more than one process: ``benchmarks/deepspeed_zero3_cpu.py`` (``ZERO_EXTRA``: zero_optimization keys it
replaces, in the real run and in :func:`fitcheck_run`).
``--real STAGE:OVERLAP:LORA[:WORLD[:ACCUM]] ...`` prints the real engines' records as JSON (the test runs it in
its own process: DeepSpeed initialises torch.distributed; ``--rank`` is one rank of a multi-process run).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

# tiny, with every trainable tensor large enough to tell apart from the activations' small temporaries
CONFIG: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1024,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}
SEQ, BATCH = 32, 2
BUCKET = 20_000  # reduce_bucket_size (elements): the embedding and head are larger, the layers' tensors smaller
POINTS = ("initialize", "backward1", "step1", "backward")


def real_run(stage: int, overlap: bool, lora: bool = False, world: int = 1, accum: int = 1) -> dict[str, Any]:
    """The real engine's record (this process's rank): ``events`` as ``[bytes (+ alloc / - free), region]`` and
    the live bytes at :data:`POINTS` above what was alive before ``initialize`` (the model, its inputs; engines
    run before in the same process are deleted first); with ``accum`` > 1 also after each micro-batch's backward
    (``backward1.K``, ``backward.K``). ``world`` > 1: the rendezvous is :func:`real`'s (one process a rank)."""
    if world == 1:
        from gloo_rank import free_port

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port(), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    warnings.filterwarnings("ignore")
    import deepspeed
    import torch
    import transformers
    from gloo_rank import without_deepspeed_shm_comm

    from fitcheck.torch_adapters import LiveTensorRecorder

    without_deepspeed_shm_comm()
    # the imports' objects (no tensor of this run among them) out of every gc pass below: alive()'s collections
    # walked them each time (7.6 of the subprocess's 12 CPU-seconds; session 20)
    gc.collect()
    gc.freeze()
    cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    if lora:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"],
                                                           lora_dropout=0.0, task_type="CAUSAL_LM"))
    model.train()
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    decay = [p for n, p in model.named_parameters() if p.requires_grad and "norm" not in n and "bias" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and ("norm" in n or "bias" in n)]
    groups = [g for g in ({"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0})
              if g["params"]]
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": accum, "bf16": {"enabled": True},
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage, "overlap_comm": overlap, "contiguous_gradients": True,
                              "reduce_bucket_size": BUCKET, "stage3_param_persistence_threshold": 0},
    }
    # ZERO_EXTRA: zero_optimization keys a caller replaces (deepspeed_zero3_cpu.py: the "auto" values)
    ds["zero_optimization"].update(json.loads(os.environ.get("ZERO_EXTRA", "{}")))
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo")
    gc.collect()
    rec = LiveTensorRecorder()
    rec.track([*model.parameters(), *model.buffers(), ids])  # not gc's other tensors: left over from the model's init
    live: dict[str, int] = {}

    def alive() -> int:  # every storage Python reaches (the recorder's own count keeps storages that
        gc.collect()     # ``p.data = view`` released while it was recording)
        seen = {o.untyped_storage().data_ptr(): o.untyped_storage().nbytes() for o in gc.get_objects()
                if isinstance(o, torch.Tensor) and not o.is_meta and o.numel()}
        return sum(seen.values())

    before = alive()
    with rec:
        optimizer = torch.optim.AdamW(groups, lr=1e-4, fused=True)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds)
        del optimizer
        live["initialize"] = alive()
        for step in range(2):
            for micro in range(accum):  # DeepSpeed's step() at every micro-batch, stepping at the boundary
                rec.enter_region("forward")
                loss = engine(input_ids=ids, labels=ids).loss
                rec.enter_region("backward")
                engine.backward(loss)
                del loss
                point = "backward1" if step == 0 else "backward"
                live[point if micro == accum - 1 else f"{point}.{micro}"] = alive()
                rec.enter_region("optimizer" if micro == accum - 1 else "micro")
                engine.step()
            if step == 0:
                live["step1"] = alive()
        rec.enter_region("done")
    events = [[sign * rec.sizes[s], rec.tags[s] if sign > 0 else ""] for s, sign in rec.events]
    del engine, rec
    gc.unfreeze()
    gc.collect()
    return {"events": events, "live": {k: v - before for k, v in live.items()}}


def fitcheck_run(stage: int, overlap: bool, lora: bool = False, world: int = 1, accum: int = 1,
                 rank: int = 0) -> dict[str, Any]:
    """The same run as :func:`deepspeed_run_events.deepspeed_run` rewrites it for ``rank``: its events and live
    bytes."""
    from cpu_truth import Row, spec_for

    from fitcheck.spec import DeepSpeedSpec, LoraSpec, ShardingSpec, Strategy
    from fitcheck.torch_adapters import deepspeed_plan, deepspeed_run, live_bytes, whole_run_events

    spec = spec_for(Row("tiny", CONFIG, seq=SEQ, batch=BATCH, dtype="bfloat16", mp="bf16", optim="adamw_torch_fused",
                        lora=LoraSpec(r=8, target_modules=("q_proj", "v_proj"), dropout=0.0) if lora else None))
    if accum > 1:
        spec = replace(spec, batch=replace(spec.batch, grad_accum=accum))
    extra = json.loads(os.environ.get("ZERO_EXTRA", "{}"))  # the real run's ZERO_EXTRA, as DeepSpeedSpec fields
    spec = replace(spec, sharding=ShardingSpec(Strategy.DEEPSPEED, world, 1, DeepSpeedSpec(
        stage=stage, overlap_comm=overlap, reduce_bucket_size=extra.get("reduce_bucket_size", BUCKET),
        param_persistence_threshold=extra.get("stage3_param_persistence_threshold", 0),
        prefetch_bucket_size=extra.get("stage3_prefetch_bucket_size", DeepSpeedSpec.prefetch_bucket_size),
        max_live_parameters=extra.get("stage3_max_live_parameters", DeepSpeedSpec.max_live_parameters),
        max_reuse_distance=extra.get("stage3_max_reuse_distance", DeepSpeedSpec.max_reuse_distance))))
    plan = deepspeed_plan(spec)
    # traced as the 16-bit module the engine runs, as the estimate does; a micro-batch is a plain pass
    plain = whole_run_events(spec, steps=3 * accum)
    before = sum(n for _, n, t in plain if t == "setup")  # the model and its inputs
    events = deepspeed_run(plain, plan)
    live = live_bytes(events)
    return {"events": [[n, t] for _, n, t in events if n],
            "live": {k: v - before for k, v in live.items()}, "trainable_bytes": plan.elem * plan.numel}


def large(events: list[list[Any]], regions: tuple[str, ...], floor: int) -> list[int]:
    """The allocations of ``floor`` bytes or more made in ``regions`` (``setup``: initialize), in order."""
    return [n for n, t in events if n >= floor and t.removeprefix("side:").startswith(regions)]


def real(*runs: tuple[int, ...]) -> list[dict[str, Any]]:
    """:func:`real_run` of each ``(stage, overlap_comm, lora[, world[, accum[, rank]]])``, one after the other in
    processes of their own: one, or one a rank (gloo, ``gloo_rank.start_rank``) where the runs' world size (the
    same for all) is above 1; the records of the runs' rank (the same for all; 0 unless given)."""
    world = max((r[3] for r in runs if len(r) > 3), default=1)
    rank = max((r[5] for r in runs if len(r) > 5), default=0)
    if any((r[3] if len(r) > 3 else 1, r[5] if len(r) > 5 else 0) != (world, rank) for r in runs):
        raise ValueError("one world size and one rank per call")
    args = [":".join(str(int(x)) for x in r[:5]) for r in runs]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if world == 1:
        proc = subprocess.run([sys.executable, __file__, "--real", *args], capture_output=True, text=True,
                              timeout=600, cwd=ROOT, env=env)
        if proc.returncode:
            raise RuntimeError(proc.stderr[-3000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    import tempfile

    from gloo_rank import free_port

    port = free_port()  # for the rendezvous

    # files, not pipes: a rank's record outgrows a pipe's buffer (rank 1 blocked writing while rank 0 waited at
    # the closing barrier: a 2-process ZeRO-3 record hung so)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [(Path(tmp) / f"{r}.out", Path(tmp) / f"{r}.err") for r in range(world)]
        procs = []
        for r, (out, err) in enumerate(paths):
            with out.open("w") as fo, err.open("w") as fe:
                procs.append(subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), str(port),
                                               *args], stdout=fo, stderr=fe, text=True, cwd=ROOT, env=env))
        for p in procs:
            p.wait(timeout=900)
        outs = [(out.read_text(), err.read_text()) for out, err in paths]
    if any(p.returncode for p in procs):
        raise RuntimeError("\n".join(err[-3000:] for _, err in outs))
    return json.loads(outs[rank][0].strip().splitlines()[-1])  # type: ignore[no-any-return]


RUNS = ((1, False, False), (1, True, False), (2, False, False), (2, True, False), (3, False, False),
        (3, True, False), (1, False, True), (2, True, True))
# (stage, overlap_comm, lora, processes, micro-batches a step), grouped by processes (one launch each)
MULTI = ((2, False, False, 1, 2), (3, False, False, 1, 2), (2, True, True, 1, 2),
         (1, False, False, 2), (2, False, False, 2), (2, True, False, 2), (2, True, True, 2), (2, False, False, 2, 2),
         (2, False, False, 3), (2, True, True, 3), (2, True, False, 3, 2), (2, False, False, 3, 1, 1))


def compare(run: tuple[int, ...], theirs: dict[str, Any]) -> list[str]:
    """Where fitcheck's sequence of ``run`` differs from the real engine's record: live bytes at
    :data:`POINTS` (within 64 B: a 0-d step counter, alignment), the large allocations of ``initialize`` and the
    optimizer steps, the ipg buckets each backward makes."""
    # three steps (allocator_replay.STEADY_STEPS) against the real two
    mine = fitcheck_run(*run)  # type: ignore[arg-type]
    floor = max(mine["trainable_bytes"] // 4, 1)
    out = [f"live after {p}: real {theirs['live'][p]} fitcheck {mine['live'].get(p)}" for p in POINTS
           if abs(theirs["live"][p] - mine["live"].get(p, 0)) > 64]
    for regions in (("setup",), ("optimizer",)):
        a, b = large(theirs["events"], regions, floor), large(mine["events"], regions, floor)
        if regions == ("optimizer",):  # the real run's two steps against the first two of fitcheck's three
            b = b[:len(a)]
        if a != b:
            out.append(f"large allocations in {regions[0]}: real {a} fitcheck {b}")
    # the ipg buckets: made at each backward's first gradient (setup_buckets), dropped at its end
    per_step = [sum(1 for n, t in e["events"] if n == 2 * BUCKET and t.startswith("backward")) / steps
                for e, steps in ((theirs, 2), (mine, 3))]
    if per_step[0] != per_step[1]:
        out.append(f"ipg buckets per backward: real {per_step[0]} fitcheck {per_step[1]}")
    return out


def main() -> int:
    """Compare every run of :data:`RUNS` and :data:`MULTI` (or of the stages given); exit 1 on a difference."""
    runs = [r for r in (*RUNS, *MULTI) if not sys.argv[1:] or str(r[0]) in sys.argv[1:]]
    bad = 0
    for world, rank in sorted({(r[3] if len(r) > 3 else 1, r[5] if len(r) > 5 else 0) for r in runs}):
        mine = [r for r in runs if (r[3] if len(r) > 3 else 1, r[5] if len(r) > 5 else 0) == (world, rank)]
        for run, theirs in zip(mine, real(*mine), strict=True):
            diffs = compare(run, theirs)
            bad += bool(diffs)
            micro = run[4] if len(run) > 4 else 1
            print(f"ZeRO-{run[0]} overlap_comm={run[1]!s:5} lora={run[2]!s:5} processes={world} micro={micro} "
                  f"rank={rank} "
                  + ("; ".join(diffs) or "same live bytes after initialize, backward, step; same large allocations"))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--real"]:
        runs = [tuple(int(x) for x in run.split(":")) for run in sys.argv[2:]]
        print(json.dumps([real_run(*run) for run in runs]))  # type: ignore[arg-type]
        sys.exit(0)
    if sys.argv[1:2] == ["--rank"]:  # one rank of a multi-process run: every rank prints its records
        from gloo_rank import finish_rank, start_rank

        start_rank(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        records = [real_run(*(int(x) for x in run.split(":"))) for run in sys.argv[5:]]  # type: ignore[arg-type]
        print(json.dumps(records))
        finish_rank()
    sys.exit(main())
