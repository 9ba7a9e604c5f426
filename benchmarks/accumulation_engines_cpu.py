"""What the second micro-step of a gradient accumulation window holds, on the REAL engines (CPU, gloo).

For each engine a tiny Llama (``deepspeed_run_events_cpu.CONFIG``: h128, 2 layers, vocab 1024; 2 rows) runs two
optimizer steps of ``gradient_accumulation_steps`` 2, and a tensor hook on every leaf the autograd engine
accumulates into (the module's trainable parameters; FSDP2's unsharded parameters, ``FSDPParam._unsharded_param``;
FSDP1's ``FlatParameter``) sees each new gradient before its ``AccumulateGrad`` runs and records what ``.grad`` the
leaf already holds then (dtype, elements; the new gradient is always the leaf's whole size). The live-tensor
recorder (``fitcheck.torch_adapters.LiveTensorRecorder``; FSDP's storage resizes through ``fsdp_cpu`` /
``fsdp1_lora_cpu``'s recorders) gives each micro-step's forward and backward peak.

Engines (``ENGINES``):

- ``ddp``: torch ``DistributedDataParallel``, one gloo process, ``no_sync`` on the first micro-step (what accelerate
  1.15 ``Accelerator.no_sync`` does for a DDP model, ``accelerator.py`` l.1172-1178), bf16 loaded;
- ``zero0`` .. ``zero3``, ``zero1-overlap``: the deepspeed 0.19.8 engine (bf16, fp32-loaded, ``engine.backward`` /
  ``engine.step`` per micro-step, as the Trainer drives it: transformers 5.23 ``trainer.py`` l.1896-1903 runs
  DeepSpeed under ``nullcontext``), one gloo process (``gloo_rank.without_deepspeed_shm_comm``);
- ``fsdp1``, ``fsdp2`` (world 1 and 2): the real ``transformers.Trainer`` (``fsdp="full_shard auto_wrap"``,
  ``fsdp_config`` version 1 / 2, bf16, bf16 loaded) with accelerate's state set to FSDP on the CPU
  (``gloo_rank.install_fsdp_on_cpu_trainer``); the Trainer runs every micro-step but the last under
  ``accelerator.no_sync(model)`` (``trainer.py`` l.1896-1908), which under FSDP2 is
  ``set_requires_gradient_sync(False)`` and under FSDP1 ``model.no_sync`` only where ``use_distributed``
  (``accelerator.py`` l.1166-1178); ``-sync``: ``accelerator_config`` ``gradient_accumulation_kwargs.sync_each_batch``
  (the Trainer enters no ``no_sync``, ``trainer.py`` l.1896-1902).

Run: ``PYTHONPATH=. python benchmarks/accumulation_engines_cpu.py [ENGINE ...]`` prints one JSON line per engine: per
micro-step of the second optimizer step, the leaves seen, how many held a ``.grad``, its dtypes and bytes and how many
were whole, and the micro-step's forward and backward peaks. ``--write`` records every engine at 32 and 128 tokens in
``benchmarks/data/accumulation_engines_cpu.json``, with two ``deepspeed_cpu.py`` ``CASES`` (``--write-cases``: those
alone; ``--write ENGINE ...``: those engines' rows, the others kept); ``--table [ENGINE ...]`` prints the recorded held
gradients and micro-step 2's backward against the formula (``fitcheck.core.estimate``) and the traced default path
(``PinnedPath("always")``), and for ``FIRST_AS_ONE`` engines micro-step 1 against the estimate at accumulation 1. As the
tracer splits backward (``fitcheck.torch_adapters.tracer`` ``REGIONS``): the backward region until the logits' gradient
exists is the start of backward (``Phase.BACKWARD_START``); the region ``head`` (the LM head's backward) and ``layers``
(from the gradient reaching the final norm's output) are during backward (``Phase.BACKWARD``). Before session 22 the
head's backward was recorded in the start region and ``layers`` alone compared with ``Phase.BACKWARD``.
``ACCUM_BREAKDOWN=1 python benchmarks/accumulation_engines_cpu.py --one ENGINE SEQ`` prints the storages alive at each
region's peak of the FSDP rank 0 (``fsdp_cpu.breakdown``). On one gloo process ZeRO-3's ``layers`` peak at 32 tokens is
gloo's: torch 2.13 ``ProcessGroupGloo`` ``_reduce_scatter_base_`` copies its input into a new tensor and back (the
head's 262,144 B gradient, reduced when the final norm's gradient hook runs); NCCL reduces in place. Two-rank rows vary
by a few percent between runs (gloo's collectives finish on their own thread and the frees follow them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

ENGINES = ("ddp", "zero0", "zero1", "zero1-overlap", "zero2", "zero3", "fsdp1", "fsdp1-2ranks", "fsdp2",
           "fsdp2-2ranks", "fsdp1-2ranks-sync", "fsdp2-sync", "fsdp2-2ranks-sync", "fsdp1-2ranks-pre",
           "fsdp1-2ranks-fwd")
ACCUM = 2
BUCKET = 20_000  # reduce_bucket_size (elements), deepspeed_run_events_cpu's
SEQS = (32, 128)
DATA = ROOT / "benchmarks" / "data" / "accumulation_engines_cpu.json"


class HeldProbe:
    """Tensor hooks on the leaves autograd accumulates into: for each new gradient, the ``.grad`` its leaf holds."""

    def __init__(self) -> None:
        self.micro: str | None = None
        self.rows: dict[str, list[tuple[str, int, str | None, int]]] = {}
        self.hooked: set[int] = set()

    def attach(self, leaves: list[tuple[str, Any]]) -> None:
        """Hook every leaf not hooked yet (``name``, tensor)."""
        for name, leaf in leaves:
            if id(leaf) in self.hooked or not leaf.requires_grad:
                continue
            self.hooked.add(id(leaf))
            leaf.register_hook(lambda g, n=name, t=leaf: self._seen(n, t, g))

    def _seen(self, name: str, leaf: Any, grad: Any) -> None:
        if self.micro is None:
            return
        held = leaf.grad
        self.rows.setdefault(self.micro, []).append(
            (name, grad.numel(), None if held is None else str(held.dtype).removeprefix("torch."),
             0 if held is None else held.numel() * held.element_size()))

    def summary(self, micro: str) -> dict[str, Any]:
        """Leaves seen in ``micro``, how many held a ``.grad``, its dtypes, bytes, and how many were whole."""
        rows = self.rows.get(micro, [])
        held = [r for r in rows if r[2] is not None]
        whole = [r for r in held if r[3] // _nbytes(r[2]) == r[1]]
        return {"leaves": len(rows), "held": len(held), "held_dtypes": sorted({str(r[2]) for r in held}),
                "held_bytes": sum(r[3] for r in held), "whole": len(whole),
                "new_numel": sum(r[1] for r in rows)}


def mark_layers(model: Any, rec: Any, probe: HeldProbe) -> None:
    """Enter region ``head<micro>`` when the logits' gradient exists (the tracer's start of ``Phase.BACKWARD``,
    ``tracer._grad_marker``: the backward region before it is ``Phase.BACKWARD_START``'s) and ``layers<micro>``
    when the gradient reaches the final norm's output (the LM head's backward is done)."""
    norm = next(m for n, m in model.named_modules() if n.endswith("model.norm"))
    head = next(m for n, m in model.named_modules() if n.endswith("lm_head"))

    def marker(region: str) -> Any:
        def hook(_m: Any, _i: Any, out: Any) -> None:
            if out.requires_grad:
                out.register_hook(lambda _g: rec.enter_region(f"{region}{probe.micro}"))

        return hook

    norm.register_forward_hook(marker("layers"))
    head.register_forward_hook(marker("head"))


def _recording(model: Any, probe: HeldProbe, ids: Any) -> Any:
    """The live-tensor recorder of one run: the layer marks, every reachable tensor and the input ids tracked."""
    from fitcheck.torch_adapters import LiveTensorRecorder

    rec = LiveTensorRecorder()
    mark_layers(model, rec, probe)
    rec.track_reachable()
    rec.track([ids])
    return rec


def _nbytes(dtype: str | None) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(dtype), 4)


def _result(probe: HeldProbe, rec: Any, step: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in range(ACCUM):
        key = f"{step}.{m}"
        layers = rec.regions.get(f"layers{key}")
        head = rec.regions.get(f"head{key}")
        start = rec.regions[f"backward{key}"].peak
        during = [0 if r is None else r.peak for r in (head, layers)]
        out[f"micro{m + 1}"] = {**probe.summary(key), "forward_peak": rec.regions[f"forward{key}"].peak,
                                "start_peak": start, "head_peak": during[0], "layers_peak": during[1],
                                "backward_peak": max(start, *during)}
    return out


def run_deepspeed(stage: int, overlap: bool, seq: int) -> dict[str, Any]:
    """The deepspeed 0.19.8 engine, one process, bf16 over the fp32-loaded tiny Llama, accumulation 2
    (``deepspeed_cpu.tiny_engine``)."""
    from deepspeed_run_events_cpu import BATCH, CONFIG

    from benchmarks.deepspeed_cpu import tiny_engine

    engine, ids = tiny_engine(stage, seq, BATCH, config=CONFIG, bucket=BUCKET, accum=ACCUM,
                              zero={"overlap_comm": overlap})
    probe = HeldProbe()
    probe.attach(list(engine.module.named_parameters()))
    rec = _recording(engine.module, probe, ids)
    with rec:
        for step in range(2):
            for micro in range(ACCUM):
                probe.micro = f"{step}.{micro}"
                rec.enter_region(f"forward{step}.{micro}")
                loss = engine(input_ids=ids, labels=ids).loss
                rec.enter_region(f"backward{step}.{micro}")
                engine.backward(loss)
                del loss
                rec.enter_region(f"step{step}.{micro}")
                engine.step()
        rec.enter_region("done")
    return _result(probe, rec, 1)


def run_ddp(seq: int) -> dict[str, Any]:
    """torch DDP on one gloo process, bf16 loaded, ``no_sync`` on every micro-step but the last."""
    import contextlib

    from gloo_rank import free_port, start_rank

    start_rank(0, 1, int(free_port()))
    import torch
    import transformers
    from deepspeed_run_events_cpu import BATCH, CONFIG

    cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, seq))
    probe = HeldProbe()
    probe.attach(list(model.named_parameters()))
    rec = _recording(model, probe, ids)
    with rec:
        for step in range(2):
            for micro in range(ACCUM):
                probe.micro = f"{step}.{micro}"
                sync = contextlib.nullcontext() if micro == ACCUM - 1 else ddp.no_sync()
                with sync:
                    rec.enter_region(f"forward{step}.{micro}")
                    loss = ddp(input_ids=ids, labels=ids).loss / ACCUM
                    rec.enter_region(f"backward{step}.{micro}")
                    loss.backward()
                    del loss
            rec.enter_region(f"step{step}")
            opt.step()
            opt.zero_grad(set_to_none=True)
        rec.enter_region("done")
    return _result(probe, rec, 1)


def _fsdp_leaves(model: Any) -> list[tuple[str, Any]]:
    """The leaves autograd accumulates into under FSDP: FSDP2's unsharded parameters, FSDP1's flat parameters."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    out: list[tuple[str, Any]] = []
    for name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group
            for fp in [] if group is None else group.fsdp_params:
                if getattr(fp, "_unsharded_param", None) is not None:
                    out.append((f"{name}.{fp._param_fqn}", fp._unsharded_param))
        elif isinstance(m, FSDP1) and m._has_params:
            out.append((name or "root", m._flat_param))
    return out


def _fsdp_rank(rank: int, world: int, version: int, seq: int, port: int, out: str, sync: bool = False,
               prefetch: bool = False, forward_prefetch: bool = False, kind: str = "") -> None:
    """One rank of the real Trainer under FSDP``version``; rank 0 writes its result to ``out``. ``sync``:
    accelerate's ``sync_each_batch`` (``TrainingArguments.accelerator_config``), no ``no_sync`` at all;
    ``prefetch``: FSDP1 ``fsdp_config`` ``backward_prefetch="backward_pre"`` (the Trainer's default: NO_PREFETCH);
    ``forward_prefetch``: FSDP1 ``fsdp_config`` ``forward_prefetch=True`` (the Trainer's default: false);
    ``kind``: the model and FSDP settings of ``fsdp_kinds_cpu.kind_model`` (LoRA, QLoRA, tied, SHARD_GRAD_OP), the
    bf16 full fine-tune when empty."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT))
    from gloo_rank import finish_rank, install_fsdp_on_cpu_trainer, start_rank

    start_rank(rank, world, port)
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from deepspeed_run_events_cpu import BATCH, CONFIG

    if version == 2:
        from fsdp_cpu import _recorder as recorder
    else:
        from fsdp1_lora_cpu import _recorder as recorder

    install_fsdp_on_cpu_trainer()
    cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    shard, kind_config = "full_shard", {}
    if kind:
        from fsdp_kinds_cpu import kind_model

        model, shard, kind_config = kind_model(kind, model)
    model.config.use_cache = False
    ids = torch.randint(0, cfg.vocab_size, (BATCH * ACCUM * 2, seq), generator=torch.Generator().manual_seed(rank))
    data = [{"input_ids": r, "labels": r} for r in ids]
    fsdp1 = {"sync_module_states": False, **({"backward_prefetch": "backward_pre"} if prefetch else {}),
             **({"forward_prefetch": True} if forward_prefetch else {})} if version == 1 else {}
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(), per_device_train_batch_size=BATCH, gradient_accumulation_steps=ACCUM,
        max_steps=2, bf16=True, use_cpu=True, fsdp=f"{shard} auto_wrap",
        fsdp_config={"version": version, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"], **fsdp1,
                     **kind_config},
        optim="adamw_torch", save_strategy="no", report_to="none", logging_strategy="no", disable_tqdm=True,
        seed=0, data_seed=0, dataloader_drop_last=True,
        accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": True}} if sync else None)
    rec = recorder()
    probe = HeldProbe()
    mark_layers(model, rec, probe)
    state = {"micro": 0}

    class Regions(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, _a: Any, st: Any, _c: Any, **_k: Any) -> None:
            state["micro"] = 0

        def on_pre_optimizer_step(self, _a: Any, st: Any, _c: Any, **_k: Any) -> None:
            rec.enter_region(f"step{st.global_step}")

    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[Regions()])
    from fsdp_cpu import regions_around_loss

    def micro_step() -> str:
        gs, m = trainer.state.global_step, state["micro"]
        state["micro"] += 1
        probe.attach(_fsdp_leaves(trainer.model_wrapped))  # FSDP2's unsharded parameters exist after lazy init
        probe.micro = f"{gs}.{m}"
        return probe.micro

    regions_around_loss(trainer, rec, micro_step)
    rec.track_reachable()
    with rec:
        trainer.train()
    result = _result(probe, rec, 1)
    if rank == 0 and os.environ.get("ACCUM_BREAKDOWN"):  # the storages alive at each region's peak, to stderr
        from fsdp_cpu import breakdown

        for region in [f"{r}1.{m}" for m in range(ACCUM) for r in ("forward", "backward", "head", "layers")]:
            if region in rec.regions:
                print(breakdown(rec, region, kib=True), file=sys.stderr, flush=True)
    result["is_fsdp2"] = bool(trainer.accelerator.is_fsdp2)
    result["distributed_type"] = str(trainer.accelerator.distributed_type)
    if kind:  # the FSDP1 strategy the run got (SHARD_GRAD_OP for fsdp_kinds_cpu's sgo)
        result["sharding_strategy"] = str(getattr(trainer.model_wrapped, "sharding_strategy", None))
    if rank == 0:
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    finish_rank()


def run_fsdp(version: int, world: int, seq: int, sync: bool = False, prefetch: bool = False,
             forward_prefetch: bool = False, kind: str = "") -> dict[str, Any]:
    """Rank 0's result of the Trainer under FSDP``version`` on ``world`` spawned gloo ranks (``kind``: see
    :func:`_fsdp_rank`)."""
    import torch.multiprocessing as mp_
    from gloo_rank import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp_.start_processes(_fsdp_rank, args=(world, version, seq, int(free_port()), out, sync, prefetch,
                                              forward_prefetch, kind), nprocs=world, join=True, start_method="spawn")
        with open(out, encoding="utf-8") as fh:
            return dict(json.load(fh))


def run(engine: str, seq: int) -> dict[str, Any]:
    """One engine's result (call in a fresh process: an engine leaves its process group and tensors behind)."""
    warnings.filterwarnings("ignore")
    if engine == "ddp":
        return run_ddp(seq)
    if engine.startswith("zero"):
        return run_deepspeed(int(engine[4]), engine.endswith("overlap"), seq)
    version = int(engine[4])
    return run_fsdp(version, 2 if "2ranks" in engine else 1, seq, engine.endswith("sync"), engine.endswith("pre"),
                    engine.endswith("fwd"))


def measured(engine: str, seq: int, script: str = __file__) -> dict[str, Any]:
    """``script``'s ``run`` (this file's :func:`run`) in a child process (:func:`child_entry`)."""
    proc = subprocess.run([sys.executable, script, "--one", engine, str(seq)], capture_output=True, text=True,
                          check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def child_entry(run_one: Any) -> None:
    """The ``--one ENGINE SEQ`` child of :func:`measured`: ``run_one``'s result as the last line, then exit at once
    (the gloo ranks' threads are not joined)."""
    if sys.argv[1:2] == ["--one"]:
        print(json.dumps(run_one(sys.argv[2], int(sys.argv[3]))))
        sys.stdout.flush()
        os._exit(0)


# engines whose first micro-step reduces as a step without accumulation does (no ``no_sync`` before it: FSDP1 on one
# process, accelerate's ``sync_each_batch``): their micro-step 1 is compared with the estimate at accumulation 1
FIRST_AS_ONE = ("fsdp1", "fsdp1-2ranks-sync", "fsdp2-sync", "fsdp2-2ranks-sync")


def spec_of(engine: str, seq: int, accum: int = ACCUM) -> Any:
    """fitcheck's spec of an engine's run (accumulation ``accum``)."""
    from cpu_truth import Row, spec_for
    from deepspeed_run_events_cpu import BATCH, CONFIG

    from fitcheck.spec import DeepSpeedSpec, FsdpSpec, ShardingSpec, Strategy

    if engine.startswith("zero"):
        spec = spec_for(Row("tiny", CONFIG, seq=seq, batch=BATCH, dtype="float32", mp="bf16"))
        ds = DeepSpeedSpec(stage=int(engine[4]), reduce_bucket_size=BUCKET, allgather_bucket_size=BUCKET,
                           overlap_comm=engine.endswith("overlap"), zero3_init=False)
        sharding = ShardingSpec(Strategy.DEEPSPEED, 1, 1, ds)
    elif engine == "ddp":
        spec = spec_for(Row("tiny", CONFIG, seq=seq, batch=BATCH, dtype="bfloat16"))
        sharding = ShardingSpec(Strategy.DDP, 1, 1)
    else:
        spec = spec_for(Row("tiny", CONFIG, seq=seq, batch=BATCH, dtype="bfloat16", mp="bf16"))
        world = 2 if "2ranks" in engine else 1
        fsdp = FsdpSpec(version=int(engine[4]), sync_each_batch=engine.endswith("sync"),
                        backward_prefetch="BACKWARD_PRE" if engine.endswith("pre") else "NO_PREFETCH",
                        **({"forward_prefetch": True} if engine.endswith("fwd") else {}))
        sharding = ShardingSpec(Strategy.FSDP, world, 1, None, fsdp)
    return replace(spec, sharding=sharding, batch=replace(spec.batch, grad_accum=accum))


def estimates(engine: str, seq: int, accum: int = ACCUM) -> dict[str, tuple[int, int]]:
    """The formula's (``fitcheck.core.estimate``) and the traced default path's (``PinnedPath("always")``) device
    bytes for the engine's run: (start of backward, during backward) each, and whether the traced answer is pinned
    (as 0 / 1 in ``pinned``)."""
    from fitcheck.core import estimate
    from fitcheck.report import Location, Phase
    from fitcheck.torch_adapters import PinnedPath

    spec = spec_of(engine, seq, accum)

    def phases(rep: Any) -> tuple[int, int]:
        tot = {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}
        return tot[Phase.BACKWARD_START], tot[Phase.BACKWARD]

    traced = PinnedPath("always", cache=None)(spec)
    return {"formula": phases(estimate(spec)), "traced": phases(traced), "pinned": (int(traced.pinned), 0)}


def during_peak(micro: dict[str, Any]) -> int:
    """A recorded micro-step's peak during backward (``Phase.BACKWARD``): the head's backward and the layers'."""
    return max(int(micro.get("head_peak", 0)), int(micro["layers_peak"]))


def table(engines: list[str]) -> int:
    """Print the recorded held gradients and micro-step 2's backward against the estimates: the start of backward
    (the backward region before the logits' gradient exists) and during backward (the head's and the ``layers``
    regions); for :data:`FIRST_AS_ONE` engines also micro-step 1 against the estimate at accumulation 1."""
    rows = json.loads(DATA.read_text(encoding="utf-8"))["rows"]
    print(f"{'engine':18} {'micro':>5} {'held':26} {'seq':>4} | {'start: real':>11} {'formula':>8} {'traced':>8} | "
          f"{'during: real':>12} {'formula':>8} {'traced':>8} | pinned")
    for engine in engines:
        for seq in SEQS:
            if f"{engine} {seq}" not in rows:
                continue
            for micro, accum in (("micro1", 1), ("micro2", ACCUM)):
                if micro == "micro1" and engine not in FIRST_AS_ONE:
                    continue
                m = rows[f"{engine} {seq}"][micro]
                held = f"{m['held']}/{m['leaves']} {','.join(m['held_dtypes']) or '-'} {m['held_bytes']}"
                est = estimates(engine, seq, accum)
                start, during = m["start_peak"], during_peak(m)

                def err(e: int, r: int) -> str:
                    return f"{(e - r) / r * 100:+7.2f}%" if r else "      -"

                print(f"{engine:18} {micro[-1]:>5} {held:26} {seq:4d} | {start:11d} {err(est['formula'][0], start)} "
                      f"{err(est['traced'][0], start)} | {during:12d} {err(est['formula'][1], during)} "
                      f"{err(est['traced'][1], during)} | {bool(est['pinned'][0])}", flush=True)
    return 0


# ``deepspeed_cpu.py`` ``CASES`` whose real peaks (forward, backward, optimizer step; the largest micro-step's)
# ``--write`` / ``--write-cases`` record beside the rows: ZeRO-1 with overlap_comm on 8 ranks and a tied ZeRO-3 run
DEEPSPEED_CASES = ("zero1-overlap-8-ranks-accum2", "zero3-tied-accum2")


def deepspeed_case(name: str) -> list[int]:
    """A ``deepspeed_cpu.py --measure-case`` run's peaks, in a child process."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "deepspeed_cpu.py"), "--measure-case", name],
                          capture_output=True, text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    return [int(x) for x in proc.stdout.strip().splitlines()[-1].split()]


def write(cases_only: bool = False, engines: tuple[str, ...] = ()) -> int:
    """Record every engine at :data:`SEQS` tokens and :data:`DEEPSPEED_CASES` in :data:`DATA` (read by
    ``tests/test_accumulation_rule.py``); ``cases_only``: the cases, the rows kept; ``engines``: those engines' rows
    and the cases, the other rows kept."""
    if engines:
        data = json.loads(DATA.read_text(encoding="utf-8"))
        data["rows"].update({f"{engine} {seq}": measured(engine, seq) for seq in SEQS for engine in engines})
    else:
        data = json.loads(DATA.read_text(encoding="utf-8")) if cases_only else {
            "accum": ACCUM, "rows": {f"{engine} {seq}": measured(engine, seq) for seq in SEQS for engine in ENGINES}}
    data["deepspeed_cases"] = {name: deepspeed_case(name) for name in DEEPSPEED_CASES}
    DATA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    child_entry(run)
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or list(ENGINES)
    if "--table" in sys.argv:
        sys.exit(table(names))
    if "--write" in sys.argv or "--write-cases" in sys.argv:
        sys.exit(write(cases_only="--write-cases" in sys.argv,
                       engines=tuple(a for a in sys.argv[1:] if not a.startswith("--"))))
    for name in names:
        print(name, json.dumps(measured(name, 32)), flush=True)
