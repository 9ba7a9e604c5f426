"""A REAL FSDP2 (``torch.distributed.fsdp.fully_shard``) training step on CPU, 2 gloo processes: each rank's
live-tensor peak vs ``fitcheck estimate --device_type cpu``, without and with FSDP mixed precision.

The tiny Llama of ``cpu_truth.py`` (random weights, fp32) is wrapped the way accelerate 1.15 does it
(``utils/fsdp_utils.py`` ``fsdp2_prepare_model``): every decoder layer its own unit, the input embedding its own
unit, ``[final norm, lm_head]`` one unit with ``reshard_after_forward=False``, then the root. Mixed precision is
accelerate's ``FullyShardedDataParallelPlugin.set_mixed_precision("bf16")``:
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)``, with the forward under
``torch.autocast`` (accelerate keeps native AMP on for FSDP). Each rank runs two steps (forward, loss,
backward, AdamW step, ``zero_grad(set_to_none=True)``) and records the second with the tracer's live-tensor
recorder (``fitcheck.torch_adapters.tracer_recorder``; DTensor shards counted by their local tensor).

Run: ``PYTHONPATH=. python benchmarks/fsdp_cpu.py [no|bf16] [--breakdown]`` (exit 1 when a row is off by more than 2 %).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

SEQ, BATCH = 256, 2
MODES = ("no", "bf16")


def resize_recorder() -> Any:
    """The tracer's recorder, counting a DTensor by its local shard, naming each storage's first shape, and with a
    ``resized(t)`` that FSDP's storage resizes report to (FSDP1 ``_alloc_storage`` / ``_free_storage``, FSDP2
    ``alloc_storage`` / ``free_storage``: the storage object stays alive, so the dispatch-mode recorder alone would
    count it as live). Shared by this benchmark and ``fsdp1_lora_cpu.py``."""
    from torch.distributed.tensor import DTensor

    from fitcheck.torch_adapters import LiveTensorRecorder, RegionStats

    class ShardRecorder(LiveTensorRecorder):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: dict[int, str] = {}
            # (serial, bytes before) of every resize, and per region how many were logged at its peak: the sizes
            # a breakdown shows are those at the peak (a resharded parameter's storage is 0 bytes by the end)
            self.resize_log: list[tuple[int, int]] = []
            self.peak_resizes: dict[str, int] = {}

        def enter_region(self, name: str) -> None:
            super().enter_region(name)
            self.peak_resizes[name] = len(self.resize_log)

        def _add(self, t: Any) -> None:
            t = t._local_tensor if isinstance(t, DTensor) else t
            before = self.regions.get(self.region, RegionStats()).peak
            super()._add(t)
            if self.regions.get(self.region, RegionStats()).peak > before:
                self.peak_resizes[self.region] = len(self.resize_log)
            serial = self._serial_of.get(id(t.untyped_storage()))
            if serial is not None and serial not in self.shapes:
                self.shapes[serial] = f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"

        def resized(self, t: Any) -> None:
            st = t.untyped_storage()
            serial = self._serial_of.get(id(st))
            if serial is None:
                return
            nbytes = int(st.nbytes())
            self.current += nbytes - self.sizes[serial]
            self.resize_log.append((serial, self.sizes[serial]))
            self.sizes[serial] = nbytes
            stats = self.regions.setdefault(self.region, RegionStats())
            if self.current > stats.peak:
                stats.peak, stats.peak_event = self.current, len(self.events) - 1
                self.peak_resizes[self.region] = len(self.resize_log)

        def sizes_at_peak(self, region: str) -> dict[int, int]:
            """serial -> bytes at ``region``'s peak (the resizes after it undone)."""
            sizes = dict(self.sizes)
            for serial, before in reversed(self.resize_log[self.peak_resizes.get(region, len(self.resize_log)):]):
                sizes[serial] = before
            return sizes

    return ShardRecorder()


def _recorder() -> Any:
    """:func:`resize_recorder`, following FSDP2's storage resizes.

    FSDP2 frees an unsharded parameter by ``untyped_storage().resize_(0)`` and re-allocates it in place
    (torch 2.13 ``fsdp/_fully_shard/_fsdp_param.py`` ``free_storage`` / ``alloc_storage``): both functions are
    wrapped to report the new size.
    """
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    rec = resize_recorder()
    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(t: Any) -> None:
        alloc(t)
        rec.resized(t)

    def free_storage(t: Any) -> None:
        free(t)
        rec.resized(t)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    return rec


def _wrap(model: Any, mp: str) -> None:
    """accelerate 1.15 fsdp2_prepare_model's units, with its MixedPrecisionPolicy for ``mp``."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()
    if mp == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                      output_dtype=torch.bfloat16)
    for layer in model.model.layers:
        fully_shard(layer, reshard_after_forward=True, mp_policy=policy)
    fully_shard(model.model.embed_tokens, reshard_after_forward=True, mp_policy=policy)
    fully_shard([model.model.norm, model.lm_head], reshard_after_forward=False, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def regions_around_loss(trainer: Any, rec: Any, key: Callable[[], str]) -> None:
    """Make a real ``transformers.Trainer``'s ``compute_loss`` (forward + loss; the Trainer's backward follows it)
    enter the recorder's ``forward<key>`` region before it and ``backward<key>`` after it; ``key()`` is called once a
    micro-step, first."""
    step_loss = trainer.compute_loss

    def compute_loss(*a: Any, **k: Any) -> Any:
        suffix = key()
        rec.enter_region(f"forward{suffix}")
        out = step_loss(*a, **k)
        rec.enter_region(f"backward{suffix}")
        return out

    trainer.compute_loss = compute_loss


def breakdown(rec: Any, region: str, kib: bool = False) -> str:
    """Storages alive at a region's peak of a :func:`resize_recorder`, grouped by (region allocated in, size at the
    peak, shape), largest first: in MiB (groups of 0.5 MiB and more), or with ``kib`` in KiB (8 KiB and more)."""
    from collections import Counter

    unit, name, floor, digits = (2**10, "KiB", 2**13, 1) if kib else (2**20, "MiB", 2**19, 3)
    stats = rec.regions[region]
    live = rec.live_at(stats.peak_event)
    sizes = rec.sizes_at_peak(region)
    groups = Counter((rec.tags[s], sizes[s], rec.shapes.get(s, "")) for s in live)
    summed = sum(sizes[s] for s in live)
    lines = [f"{region}: peak {stats.peak / unit:.{digits if kib else 2}f} {name} ({stats.peak} B; storages alive "
             f"then {summed} B)"]
    for (tag, size, shape), n in sorted(groups.items(), key=lambda kv: -kv[0][1] * kv[1]):
        if size * n >= floor:
            lines.append(f"    {tag:12} {size / unit:9.{digits}f} {name} x {n}  {shape}")
    return "\n".join(lines)


def _rank(rank: int, world: int, mp: str, out: str, port: int, breakdown: bool = False, seq: int = SEQ) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    warnings.filterwarnings("ignore")

    import torch
    import torch.distributed as dist
    import transformers

    from benchmarks.cpu_truth import LLAMA

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k not in ("model_type", "architectures")})
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.train()
        _wrap(model, mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        ids = torch.randint(0, cfg.vocab_size, (BATCH, seq))
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if mp == "bf16" else torch.autocast("cpu", enabled=False)
        rec = _recorder()
        rec.track_reachable()
        rec.track([ids])
        # "layers": from the gradient reaching the final norm's output (the LM head's backward is done) on
        step_of = {"n": 0}

        def mark(_m: Any, _i: Any, out: Any) -> None:
            out.register_hook(lambda _g: rec.enter_region(f"layers{step_of['n']}"))

        model.model.norm.register_forward_hook(mark)
        with rec:
            for step in range(2):
                step_of["n"] = step
                rec.enter_region(f"forward{step}")
                with ctx:
                    loss = model(input_ids=ids, labels=ids).loss
                rec.enter_region(f"backward{step}")
                loss.backward()
                del loss
                rec.enter_region(f"optimizer{step}")
                opt.step()
                opt.zero_grad(set_to_none=True)
            rec.enter_region("done")
        regions = ("forward", "backward", "layers", "optimizer")
        peaks = {r: rec.regions[f"{r}1"].peak for r in regions}
        if breakdown and rank == 0:
            print("\n".join(breakdown(rec, f"{r}1") for r in regions), flush=True)
        with open(f"{out}.{rank}", "w", encoding="utf-8") as fh:
            json.dump(peaks, fh)
    finally:
        dist.destroy_process_group()


def measure(mp: str, port: int | None = None, breakdown: bool = False, seq: int = SEQ) -> list[dict[str, int]]:
    """Per-rank live-tensor peaks of the second real FSDP2 step, by region (forward, backward, optimizer), at
    ``seq`` tokens per row."""
    import torch.multiprocessing as mp_

    from benchmarks.gloo_rank import free_port

    port = port or int(free_port())  # other runs on the machine may hold a fixed port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "peaks")
        mp_.start_processes(_rank, args=(2, mp, out, port, breakdown, seq), nprocs=2, join=True, start_method="fork")
        rows = []
        for rank in range(2):
            with open(f"{out}.{rank}", encoding="utf-8") as fh:
                rows.append(json.load(fh))
    return rows


def estimate_for(mp: str, seq: int = SEQ) -> Any:
    """fitcheck's report for the same run (2 processes, FSDP2 FULL_SHARD, fp32 load, device_type cpu)."""
    from benchmarks.cpu_truth import LLAMA, Row, spec_for
    from fitcheck.core import estimate
    from fitcheck.spec import FsdpSpec, ShardingSpec, Strategy

    spec = spec_for(Row("fsdp", LLAMA, seq=seq, batch=BATCH, dtype="float32", mp=mp, optim="adamw_torch"))
    spec = replace(spec, sharding=ShardingSpec(Strategy.FSDP, 2, 1, None, FsdpSpec(version=2)))
    return estimate(spec)


def main(argv: list[str]) -> int:
    """Print estimate vs real per rank and mode; exit 1 when a row is off by more than 2 %.

    ``--breakdown`` also prints rank 0's live storages at each region's peak; ``no`` / ``bf16`` run one mode.
    """
    breakdown = "--breakdown" in argv
    print(f"{'mixed precision':16} {'rank':>4} {'real MiB':>10} {'est MiB':>10} {'error':>8}  real by region")
    worst = 0.0
    for mp in [m for m in MODES if m in argv] or MODES:
        report = estimate_for(mp)
        est = report.peak_allocated_bytes
        for rank, peaks in enumerate(measure(mp, None, breakdown)):
            real = max(peaks.values())
            err = (est - real) / real * 100
            worst = max(worst, abs(err))
            regions = ", ".join(f"{k} {v / 2**20:.2f}" for k, v in peaks.items())
            print(f"{mp:16} {rank:>4} {real / 2**20:10.2f} {est / 2**20:10.2f} {err:+7.2f}%  {regions}")
        print(f"{'':16} estimate peak phase: {report.peak_phase.value}")
    print(f"worst |error| {worst:.2f}%")
    return 0 if worst <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
