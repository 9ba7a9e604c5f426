"""An experiment (not what ``fitcheck estimate`` answers): DeepSpeed's whole run replayed through the caching allocator.

The H200 Trainer runs (``benchmarks/data/trainer_gpu_nvidia_h200.json``, Llama-3.2-1B, bf16, 4 x 1024, one
process) reserve far more than they allocate under DeepSpeed (ZeRO-2: 36.69 GiB reserved, 28.74 allocated). This
takes the plain Trainer's whole run as the default path composes it (``fitcheck.torch_adapters.whole_run_events``:
traced forward/backward, three steps) and rewrites it into DeepSpeed's, read from deepspeed 0.19.8:

* ``deepspeed.initialize``. ZeRO-2 (``stage_1_and_2.py``): the flat bf16 copy of the parameters
  (``flatten_dense_tensors_aligned``), a bf16 clone of the partition and its fp32 master (``.clone().float()``), then
  the original parameter storages and the clone are freed. ZeRO-3 (``stage3.py``): the per-parameter partitions are
  moved into one flat buffer through the host with ``empty_cache()`` in between (``zero/utils.py`` ``defragment``);
  per sub-group (``_create_fp16_sub_groups``: parameters until ``sub_group_size`` 1e9 is reached) ``converted =
  fp16.to(fp32)`` and ``converted.clone()`` (the previous sub-group's ``converted`` is freed when the name is bound
  again); ``initialize_optimizer_states``' zeroed fp32 gradient of the largest sub-group, dropped at its end; then
  ``grad_partitions_flat_buffer``.
* backward: every ``.grad`` autograd makes is copied into the reduce bucket and dropped (``stage_1_and_2.py``
  ``reduce_independent_p_g_buckets_and_remove_grads``; ``stage3.py`` ``partition_grads``); ZeRO-2 keeps the gradient
  partition in ``reduction_stream``'s own pool (``core/states/deepspeed_streams.py``), added at the end.
* the optimizer step, per group (ZeRO-2) or sub-group (ZeRO-3, ``_prepare_fp32_grad_for_sub_group``): the bf16
  gradients flattened, ``.to(fp32)``, Adam's two fp32 states of the flat partition made at the first step, the fp32
  gradient released. The torch optimizer's own per-parameter events are dropped.

Result (GiB, allocated / reserved peaks per phase as ``trainer_gpu.py`` measured them on the H200;
``PYTHONPATH=.:benchmarks python benchmarks/deepspeed_reserved_replay.py``, ~15 s):

========  ===============  ===============  ===============
run       prepare          step 1           steps 2-3
========  ===============  ===============  ===============
ZeRO-2    11.51 / 11.52    23.02 / 36.66    28.68 / 36.66
measured  11.51 / 11.51    23.08 / 36.69    28.74 / 36.69
ZeRO-3    10.64 / 14.38    21.78 / 30.32    30.98 / 34.23
measured  10.64 / 14.38    21.82 / 30.39    31.05 / 34.30
========  ===============  ===============  ===============

Every phase within 0.3 %. What ``fitcheck estimate`` answers for the same rows (the published gap on the default
stream plus ``core/states/deepspeed_streams.py``) is -11.6 % (ZeRO-2) and -5.4 % (ZeRO-3) on steps 2-3 reserved.
Not wired into the estimate yet: the rewrite is written for these rows' setting (one process, a bf16-loaded
model, full fine-tune, the Trainer's torch optimizer, no offload, no accumulation).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

Event = tuple[int, int, str]
G = 2**30
SUB_GROUP_SIZE = 1_000_000_000  # deepspeed 0.19.8 zero/config.py sub_group_size default
# the H200 rows (GiB): prepare, step 1, steps 2-3 (max_memory_allocated / max_memory_reserved)
MEASURED = {2: ((11.51, 11.51), (23.08, 36.69), (28.74, 36.69)), 3: ((10.64, 14.38), (21.82, 30.39), (31.05, 34.30))}


def _spec() -> Any:
    from gpu_truth import parse_values
    from trainer_gpu import MODEL, estimate_argv

    from fitcheck.catalog import find_catalog_config
    from fitcheck.cli import spec_from_values

    work = Path(tempfile.mkdtemp(prefix="ds_replay_"))
    (work / "model").mkdir()
    found = find_catalog_config(MODEL)
    assert found is not None
    (work / "model" / "config.json").write_text(json.dumps(found[0]), encoding="utf-8")
    values = parse_values(estimate_argv(work / "model", "trainer bf16 full", work))
    values["gpu"] = "H200"
    return spec_from_values(values, {})[0]


def _groups(config: dict[str, Any], stage: int) -> list[int]:
    """The Trainer's two parameter groups (decay: every weight matrix in ``named_parameters`` order; no decay: the
    norms), ZeRO-3's decay group cut into sub-groups."""
    h, n_layers, vocab, inter = (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"],
                                 config["intermediate_size"])
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    # q, k, v, o, gate, up, down of each layer (modeling_llama.py order); the tied head counted once
    decay = [vocab * h] + [h * h, h * kv, h * kv, h * h, h * inter, h * inter, inter * h] * n_layers
    no_decay = (2 * n_layers + 1) * h
    if stage != 3:
        return [sum(decay), no_decay]
    subs, acc = [], 0
    for numel in decay:
        acc += numel
        if acc >= SUB_GROUP_SIZE:
            subs.append(acc)
            acc = 0
    return [*subs, *([acc] if acc else []), no_decay]


def deepspeed_run(events: list[Event], numel: int, groups: list[int], stage: int) -> list[Event]:
    """The plain Trainer's run rewritten into DeepSpeed's (module docstring); ``("empty_cache", 0, ...)`` marks
    ``torch.cuda.empty_cache``."""
    setup = [s for s, n, t in events if t == "setup" and n > 0]
    size = {s: n for s, n, _ in events if n > 0}
    grads: set[int] = set()  # what backward made and the optimizer found alive: the .grad tensors
    live: dict[int, str] = {}
    prev = ""
    for s, n, t in events:
        if t.startswith("optimizer") and not prev.startswith("optimizer"):
            grads |= {x for x, tag in live.items() if tag.startswith("backward") and not tag.startswith("backward_s")}
        if n > 0:
            live[s] = t
        else:
            live.pop(s, None)
        prev = t
    out: list[Event] = []
    serial = [10**12]

    def new(nbytes: int, tag: str) -> int:
        serial[0] += 1
        out.append((serial[0], nbytes, tag))
        return serial[0]

    first, prev = True, ""
    for s, n, t in events:
        if t.startswith("optimizer"):
            if not prev.startswith("optimizer"):
                for g in groups:
                    cat, fp32 = new(2 * g, t), new(4 * g, t)
                    out.append((cat, -2 * g, t))
                    if first:
                        new(4 * g, t)
                        new(4 * g, t)
                    out.append((fp32, -4 * g, t))
                first = False
        elif t == "setup" and n > 0 and s == setup[-1]:
            out.append((s, n, t))
            if stage == 3:
                out += [(p, -size[p], t) for p in setup]
                out.append((0, 0, "empty_cache"))
                new(2 * numel, t)
                converted, prior = None, 0
                for g in groups:
                    now = new(4 * g, t)
                    if converted is not None:
                        out.append((converted, -4 * prior, t))
                    new(4 * g, t)
                    converted, prior = now, g
                if converted is not None:
                    out.append((converted, -4 * prior, t))
                # initialize_optimizer_states: a zeroed fp32 gradient of the largest sub-group, dropped at its end
                zeros = new(4 * max(groups), t)
                out.append((zeros, -4 * max(groups), t))
                new(2 * numel, t)
            else:
                new(2 * numel, t)
                clone = new(2 * numel, t)
                new(4 * numel, t)
                out.append((clone, -2 * numel, t))
                out += [(p, -size[p], t) for p in setup]
        elif s in grads:
            if n > 0:
                out += [(s, n, t), (s, -n, t)]
        else:
            out.append((s, n, t))
        prev = t
    alive: set[int] = set()
    clean: list[Event] = []
    for s, n, t in out:  # the parameters' own frees later in the run are gone with them
        if t == "empty_cache" or n > 0 or s in alive:
            clean.append((s, n, t))
            (alive.add if n > 0 else alive.discard)(s)
    return clean


def replay_phases(events: list[Event]) -> list[tuple[float, float]]:
    """(prepare, step 1, steps 2-3) peaks (allocated, reserved) in GiB; allocated peaks reset after prepare and
    after step 1, as ``trainer_gpu.py`` measured."""
    from fitcheck.core.caching import CachingAllocator

    alloc = CachingAllocator(None)
    handles: dict[int, int] = {}
    out: list[tuple[float, float]] = []
    in_setup, prev = True, ""
    for k, (s, n, t) in enumerate(events, 1):
        ends_step1 = len(out) == 1 and prev.startswith("optimizer") and not t.startswith("optimizer")
        if (in_setup and t not in ("setup", "empty_cache")) or ends_step1:
            in_setup = False
            out.append((alloc.stats.peak_allocated / G, alloc.stats.peak_reserved / G))
            alloc.stats.peak_allocated = alloc.stats.allocated
        prev = t
        if t == "empty_cache":
            alloc.empty_cache()
        elif n > 0:
            handles[s] = k
            alloc.malloc(k, n)
        elif s in handles:
            alloc.free(handles.pop(s))
    return [*out, (alloc.stats.peak_allocated / G, alloc.stats.peak_reserved / G)]


def main() -> int:
    """Print the replay next to the H200 measurements."""
    from fitcheck.torch_adapters import whole_run_events

    spec = _spec()
    events = whole_run_events(spec)
    numel = spec.model.total_params
    print(f"{'':7}{'prepare a/r':>15} {'step 1 a/r':>15} {'steps 2-3 a/r':>15}   (replayed; measured below)")
    for stage in (2, 3):
        groups = _groups(spec.model.config, stage)
        assert sum(groups) == numel, (groups, numel)
        phases = replay_phases(deepspeed_run(events, numel, groups, stage))
        # ZeRO-2's gradient partition in reduction_stream's own pool: reserved from step 1's backward on, allocated
        # during backward and the step (not at the step's peak, the start of backward)
        side = 2 * numel / G if stage == 2 else 0.0
        replayed = [phases[0], (phases[1][0] + side, phases[1][1] + side), (phases[2][0], phases[2][1] + side)]
        print(f"ZeRO-{stage} " + " ".join(f"{a:7.2f}/{r:6.2f}" for a, r in replayed))
        print(f"{'':7}" + " ".join(f"{a:7.2f}/{r:6.2f}" for a, r in MEASURED[stage]) + "   measured; steps 2-3 "
              f"reserved {(replayed[2][1] - MEASURED[stage][2][1]) / MEASURED[stage][2][1] * 100:+.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
