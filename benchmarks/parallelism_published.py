"""Context- and tensor-parallel estimates next to published GPU measurements (torchtitan).

Run: ``PYTHONPATH=. python benchmarks/parallelism_published.py``. CPU only, no torch import.

Each row of ``benchmarks/data/parallelism_published.json`` is a published run with its source and the
``fitcheck estimate`` flags that describe it on the Hugging Face stack; the script prints the estimate's peak
reserved memory (torchtitan publishes ``max_memory_reserved``) next to the published figure, the signed error,
and the per-rank terms that make the CP rows flat (each rank holds ``seq / cp`` tokens and ``1 / (dp_shard x
cp)`` of the states). A second table shows the same estimates with the model-state and activation split, so a
difference can be traced to its term. Differences between the stacks are printed under the table.
"""

from __future__ import annotations

import json
from pathlib import Path

from fitcheck.cli import spec_from_values
from fitcheck.core import estimate

DATA = Path(__file__).resolve().parent / "data" / "parallelism_published.json"
GIB = 1024**3


def _values(argv: list[str]) -> dict[str, object]:
    """``--flag value`` pairs (a flag followed by another flag is a bare boolean) as estimate values."""
    out: dict[str, object] = {}
    i = 0
    while i < len(argv):
        key = argv[i].lstrip("-")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[key] = argv[i + 1]
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def main() -> None:
    data = json.loads(DATA.read_text())
    print(f"{'row':<14} {'layout':<22} {'seq':>7} {'published':>10} {'estimate':>9} {'error':>7}  "
          f"{'states':>7} {'activ.':>7} {'logits':>7} {'cp/sp buf':>9}")
    errors = []
    for row in data["rows"]:
        spec, _ = spec_from_values(_values(row["argv"]), {})
        rep = estimate(spec)
        par = spec.sharding.parallelism
        layout = " x ".join(f"{k} {v}" for k, v in (par.as_dict() if par else {}).items() if v > 1)
        at = rep.at_peak()
        states = sum(v for k, v in at.items() if k.split(".")[0] in ("weights", "gradients", "optimizer", "master"))
        acts = sum(v for k, v in at.items() if k.startswith("activations") or k == "inputs.ids")
        buf = sum(c.peak_bytes for c in rep.components
                  if c.name in ("parallel.cp_ring_attention", "parallel.ulysses_all_to_all"))
        est = rep.peak_reserved_bytes / GIB
        err = (est - row["published_gib"]) / row["published_gib"]
        if row.get("comparable", True):
            errors.append(abs(err))
        print(
            f"{'' if row.get('comparable', True) else '*'}{row['id']:<14} {layout:<22} {spec.batch.seq_len:>7} "
            f"{row['published_gib']:>9.1f}G {est:>8.1f}G "
            f"{err:>+7.1%}  {states / GIB:>6.1f}G {acts / GIB:>6.1f}G {at.get('logits.loss', 0) / GIB:>6.1f}G "
            f"{buf / GIB:>8.2f}G"
        )
    errors.sort()
    print(
        f"\nmedian |error| {errors[len(errors) // 2]:.1%}, largest {errors[-1]:.1%} over {len(errors)} comparable "
        "rows (estimate = peak reserved at the peak phase; terms at the peak phase; cp/sp buf = largest phase)"
    )
    for row in data["rows"]:
        if not row.get("comparable", True):
            print(f"  *{row['id']} not comparable: {row['why_not_comparable']}")
    print("\nsources:")
    for row in data["rows"]:
        print(f"  {row['id']}: {row['source']}\n      {row['setup']}")
    print("\nwhat differs between the stacks:")
    for line in data["differences"]:
        print(f"  - {line}")


if __name__ == "__main__":
    main()
