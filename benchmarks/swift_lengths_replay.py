"""ms-swift's benchmark rows (SWIFT-*) replayed with variable lengths: how much the caching allocator keeps reserved.

The ms-swift benchmark (modelscope/ms-swift docs/source_en/LLM/Benchmark.md @46922151, numbers from "Update
benchmark 0101", 97e4d198b) trains on cls-fudan-news-zh with ``truncation_strategy='delete'`` (the SftArguments
default, swift/llm/utils/argument.py @97e4d198b): ``_encode`` returns None for a sample longer than ``max_length``
(swift/llm/utils/template.py @97e4d198b, lines 219-221) and ``dataset_map`` drops it (swift/llm/utils/utils.py,
line 280). So no batch is cut to ``max_length``: every step has the length of its longest sample (``data_collate_fn``
pads to the longest, ``padding_to=None``), anywhere from 91 tokens up to ``max_length``, in the random order of
the train sampler. The reported figure is ``torch.cuda.max_memory_reserved`` at the end of ``trainer.train``
(swift/trainers/trainers.py @97e4d198b, ``Seq2SeqTrainer.train``): the whole run's reserved peak.

The dataset's per-sample lengths are not published: only its size (4959 rows) and token statistics
(3234.4 +- 2547.5, min 91, max 19548; docs/source_en/LLM/Supported-models-datasets.md line 338 @46922151). This
script draws lengths from a log-normal with that mean and standard deviation (clipped to the stated min/max; an
assumption, not the dataset), keeps those <= max_length, shuffles them, batches and pads them as the run does,
rounds each padded length up to a multiple of ``--round`` tokens (one fake-tensor trace per distinct length),
and replays every step through fitcheck's caching-allocator model (``replay_whole_lengths``). It prints the
replayed reserved peak next to the fixed-length one and the published figure. It illustrates the mechanism; it
is not a row estimate (the run's own length sequence is unknown).

Seed 0, ``--round 16`` (session 14): SWIFT-1 (1827 steps, 111 distinct lengths, 5 new longest) replays to
35.25 GiB reserved (fixed 2048: 19.26; published 27.74; the same setting with batches cut to 2048, SWIFT-D1:
18.91), SWIFT-12 (micro-batch 2: 914 steps, 86 distinct lengths, 4 new longest) to 46.06 GiB (fixed: 24.00;
published 43.11; SWIFT-D11: 24.26). Those session-14 figures include a replay creep fixed in session 15: the
deepened traces left one 64 KiB autocast cast per added layer allocated every step (``allocator_deepen``: the
autocast cache's hash-ordered free run), about 3.5-5.6 MiB a step, 4.64 GiB of SWIFT-1's variable-length allocated
peak (23.13 GiB against 18.49) and 2.28 GiB of SWIFT-12's (24.77 against 22.49); since the fix, allocated at every
step boundary returns to the first step's (``replay_whole_lengths`` of [2048, 1024] x 4 + [2048]). Not re-run
since. It shows the mechanism's size; it is not a measurement. SWIFT-4 (512) at ``--round 1``: seed 0 (59 steps, 3 new
longest) 17.60 GiB, seed 1 (66 steps, 5 new longest) 19.02 GiB, fixed 15.73; published 18.01, SWIFT-D3 15.55.

    PYTHONPATH=. python benchmarks/swift_lengths_replay.py --row SWIFT-1 [--seed 0] [--round 16]

CPU only; about 4 s of tracing per distinct length and 0.2-0.5 s of replay per step on a shared CPU (SWIFT-1 at
``--round 16``: 16 minutes).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_rows import GIB, Plan, inventory_for, load_rows, plan_row

DATASET_ROWS = 4959  # Supported-models-datasets.md line 338 @46922151
MEAN, SD, LO, HI = 3234.4, 2547.5, 91, 19548  # the same line's token statistics
SAMPLE_ABOVE_2048 = 1000  # run_single.py: train_dataset_sample = 1000 when max_length > 2048


def lengths_for(max_length: int, micro_batch: int, seed: int, round_to: int) -> list[int]:
    """Padded lengths of the run's steps, in order, under the log-normal assumption (module docstring)."""
    rng = random.Random(seed)
    sigma = math.sqrt(math.log(1 + (SD / MEAN) ** 2))
    mu = math.log(MEAN) - sigma**2 / 2
    rows = [min(HI, max(LO, round(rng.lognormvariate(mu, sigma)))) for _ in range(DATASET_ROWS)]
    if max_length > 2048:
        rows = rows[:SAMPLE_ABOVE_2048]
    kept = [n for n in rows if n <= max_length]  # truncation_strategy 'delete'
    rng.shuffle(kept)
    batches = [max(kept[i:i + micro_batch]) for i in range(0, len(kept), micro_batch)]
    return [min(max_length, -(-n // round_to) * round_to) for n in batches]


def main(argv: Sequence[str]) -> int:
    """Replay one SWIFT row's steps at variable lengths and print the reserved peaks (GiB)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--row", default="SWIFT-1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--round", type=int, default=16, help="round padded lengths up to a multiple of this")
    args = ap.parse_args(list(argv))
    from fitcheck.torch_adapters import replay_whole_lengths

    row = next(r for r in load_rows() if r["id"] == args.row)
    plan = plan_row({**row, "not_comparable": None})  # the row's run as fitcheck reads it, whatever its figure
    if not isinstance(plan, Plan):
        raise SystemExit(f"{args.row}: {plan.reason}")
    spec = plan.build(inventory_for(plan.model))
    mb, max_length = spec.batch.micro_batch, spec.batch.seq_len
    lengths = lengths_for(max_length, mb, args.seed, args.round)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed, _ = replay_whole_lengths(spec, [max_length, max_length])
        varied, _ = replay_whole_lengths(spec, lengths)
    records = sum(1 for i, n in enumerate(lengths) if n > max(lengths[:i], default=0))
    took = time.perf_counter() - started
    print(f"{args.row}: {len(lengths)} steps (micro-batch {mb}, lengths {min(lengths)}..{max(lengths)}, "
          f"{len(set(lengths))} distinct, {records} new longest), seed {args.seed}, {took:.0f} s")
    for label, r in ((f"fixed {max_length}:     ", fixed), ("variable lengths:", varied)):
        print(f"  {label} allocated {r.peak_allocated / GIB:6.2f}  reserved {r.peak_reserved / GIB:6.2f}")
    print(f"  published max_memory_reserved: {float(row['memory_gib']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
