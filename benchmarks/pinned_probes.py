"""Issue 20's done-check: at shapes off the envelope's grids, is every ``pinned: true`` answer within 2 % of the trace?

Draws runs at random (seeded): a kind (family, method, checkpointing, attention, precision), a catalog model of
that family (its real width, often not one of the grids' models), a sequence length and a micro-batch, never one
of the exact points the envelope was checked at (``envelope_ranges.py``: its two widths x 3 sequences x
micro-batch 1 and 8; ``formula_vs_trace.py``: its one model x sequence 256/2048 x micro-batch 1/4). Each draw is
estimated from the formula (the CPU spec the grids run, ``torch_adapters.cell_spec``: the answer
``fitcheck estimate --no_trace --device_type cpu`` gives); a draw whose answer says ``pinned: false`` is counted
and skipped, a pinned one is traced at its own micro-batch (fitcheck's fake-tensor trace of the real transformers
+ peft model at its own micro-batch, from one and two layer groups as the default path does) and the error is
measured per phase on the activation, logits and temporary bytes (``torch_adapters.phase_errors``: end of forward,
start of backward, during backward). A probe more than 2 % off is traced again at the model's full depth and
scored on that trace (the depth-extrapolated numbers are printed beside it when they differ).

Prints one line per pinned probe, then a table per kind (the spec's envelope key; since session 9 only a kind
with a checked range is pinned) with its probes, how many were within 2 % and the worst error, then the count
of pinned probes within 2 % and the worst error. Exit code 1 when a pinned
probe is outside 2 %.

``--recipes`` also draws what the envelope's recipe key reads (``core/activations/envelope_range.py``
``recipe_of``): the LoRA rank (4 .. 128), targets (every linear layer, peft's default q/v, or q/k/v/o), dropout
(0.05, 0.1 or none), reentrant checkpointing, and fp16 weights or fp16 autocast (one draw in eight): a recipe
no range was checked for must answer ``pinned: false``; one that is pinned is traced like any other probe.

Run: ``python benchmarks/pinned_probes.py [--seed 0] [--probes 40] [--budget 900] [--families a,b]
[--methods a,b] [--attn eager] [--recipes] [--json out.json] [--record-misses]``.

``--record-misses`` merges every probe more than 2 % off into ``fitcheck/catalog/envelope_probe_misses.json``
(package data): a kind listed there is not pinned (``core.activations.envelope.in_envelope``). ``--from-json
a.json ...`` records the misses of earlier ``--json`` runs without probing again. ``--recheck`` traces every
recorded miss again at its own model and shape (pinned or not) and drops those now within 2 %: run it after a
formula fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from fitcheck.report import Phase
from fitcheck.spec import Dtype, MixedPrecision, PrecisionSpec, TrainingSpec
from fitcheck.torch_adapters import FAMILY_MODELS, PHASES, Cell, cell_spec, phase_errors

TOLERANCE = 0.02
MODELS = Path(__file__).parents[1] / "fitcheck" / "catalog" / "models"
MISSES = Path(__file__).parents[1] / "fitcheck" / "catalog" / "envelope_probe_misses.json"
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3")
METHODS = ("full", "lora", "qlora", "dora", "qlora_noprep")
PRECISIONS = ("bf16", "autocast", "fp32", "bf16amp")
MICRO_BATCHES = (1, 2, 3, 4, 6)
# the grids' own shapes (envelope_ranges.py BATCHES / sequences(); formula_vs_trace.py grid())
GRID_BATCHES = (1, 4, 8)
GRID_SEQS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a probe changes in its cell's spec beyond the grids' recipe (``differential._LORA``: r 16, dropout
    0.05, every linear layer; non-reentrant checkpointing; the cell's precision)."""

    r: int = 16
    targets: tuple[str, ...] = ("all-linear",)
    dropout: float = 0.05
    reentrant: bool = False
    weights: str = ""  # "" (the cell's), "fp16" (fp16 weights, no autocast) or "fp16amp" (fp32 weights, fp16 autocast)

    def apply(self, spec: TrainingSpec) -> TrainingSpec:
        """The spec with this recipe."""
        lora = spec.lora and dataclasses.replace(spec.lora, r=self.r, alpha=2.0 * self.r, dropout=self.dropout,
                                                 target_modules=self.targets)
        act = dataclasses.replace(spec.activations, use_reentrant=self.reentrant and spec.activations.checkpointing)
        precision = {"fp16": PrecisionSpec(Dtype.FLOAT16, MixedPrecision.NO),
                     "fp16amp": PrecisionSpec(Dtype.FLOAT32, MixedPrecision.FP16)}.get(self.weights, spec.precision)
        return dataclasses.replace(spec, lora=lora, activations=act, precision=precision)

    def flags(self, cell: Cell) -> str:
        """The ``fitcheck estimate`` flags that change (appended to the cell's)."""
        out = []
        if cell.method not in ("full", "freeze"):  # the targets: flags(cell, model, recipe)
            out.append(f"--lora_r {self.r} --lora_alpha {2 * self.r} --lora_dropout {self.dropout}")
        if self.reentrant and cell.ckpt:
            out.append("--gradient_checkpointing_kwargs '{\"use_reentrant\": true}'")
        if self.weights:
            out.append("--dtype float16" if self.weights == "fp16" else "--dtype float32 --fp16")
        return " ".join(out)


GRID_RECIPE = Recipe()
QUANTIZED = ("qlora", "qlora_noprep", "int8")


def draw_recipe(rng: random.Random, cell: Cell) -> Recipe:
    """A random recipe for a cell (``--recipes``)."""
    targets: tuple[str, ...] = ("all-linear",)
    if cell.family not in ("gpt2", "falcon", "bloom"):  # fused q/k/v (c_attn, query_key_value): no q_proj
        targets = rng.choice((targets, targets, ("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj")))
    weights = rng.choice(("fp16", "fp16amp")) if rng.random() < 0.125 and cell.method not in QUANTIZED else ""
    recipe = Recipe(rng.choice((4, 8, 16, 32, 64, 128)), targets, rng.choice((0.05, 0.1, 0.0)),
                    rng.random() < 0.25, weights)
    if cell.method in ("full", "freeze"):  # no adapters: only checkpointing and precision apply
        recipe = dataclasses.replace(recipe, r=GRID_RECIPE.r, targets=GRID_RECIPE.targets, dropout=GRID_RECIPE.dropout)
    return recipe


def family_models(family: str) -> list[tuple[str, dict[str, Any]]]:
    """Catalog models of a family (text-only): (Hub id, config.json)."""
    out = []
    for path in sorted(MODELS.rglob("config.json")):
        config = json.loads(path.read_text())
        if config.get("model_type") == family:
            out.append((str(path.parent.relative_to(MODELS)), config))
    return out


def longest(config: dict[str, Any]) -> int:
    """The longest sequence a probe uses: the model's limit, at most 32k, below a banded sliding window
    (beyond it the estimate is never pinned: ``recipe_gaps.sliding_window_findings``)."""
    top = min(int(config.get("max_position_embeddings") or config.get("n_positions") or 2048), 32768)
    window = config.get("sliding_window")
    if isinstance(window, int) and config.get("use_sliding_window", True) is not False:
        top = min(top, window - 1)
    return top


def draw(rng: random.Random, families: tuple[str, ...], methods: tuple[str, ...]) -> tuple[Cell, str, dict[str, Any]]:
    """One random run off the grids' points: the cell, its model id and config."""
    while True:
        family = rng.choice(families)
        method = rng.choice(methods)
        precision = rng.choice(PRECISIONS)
        if precision == "bf16amp" and method not in ("lora", "dora"):
            continue
        model, config = rng.choice(family_models(family))
        top = longest(config)
        seq = 64 * round(2 ** rng.uniform(math.log2(384), math.log2(top)) / 64)
        batch = rng.choice(MICRO_BATCHES)
        if seq in GRID_SEQS and batch in GRID_BATCHES:
            continue  # an exact grid point (at some width): not a probe
        return Cell(family, method, rng.random() < 0.6, rng.choice(("sdpa", "sdpa", "eager")), precision, seq,
                    batch), model, config


def probe(cell: Cell, config: dict[str, Any], *, pinned_only: bool = True,
          recipe: Recipe = GRID_RECIPE) -> tuple[str, dict[Phase, float] | str]:
    """The envelope kind of a pinned formula answer (``""``: not pinned; every answer with ``pinned_only`` off) and
    its error per phase against a trace at the same shape (or why the trace refused)."""
    from fitcheck.core import estimate
    from fitcheck.core.activations import envelope_key, range_label, recipe_suffix
    from fitcheck.torch_adapters import BatchTraces, activation_trace_kwargs, components_from_trace

    spec = cell_spec(cell, config) if recipe == GRID_RECIPE else recipe.apply(cell_spec(cell, config))
    if pinned_only and not estimate(spec).pinned:
        return "", ""
    key = envelope_key(spec)
    kind = "?" if key is None else range_label(key, recipe_suffix(spec) or "")  # "+qv": peft's default targets' rows
    try:
        kwargs = activation_trace_kwargs(spec)
        traced = BatchTraces(spec.model.config, kwargs, skip_first=True).result(cell.batch)
        errors = phase_errors(spec, components_from_trace(traced))
        if max(abs(e) for e in errors.values()) > TOLERANCE:
            # BatchTraces extrapolates from one and two layer groups; where the phase's worst moment changes with
            # depth (Mistral-Small-24B full eager bf16 1 x 1792: the LM head's at 1-2 layers, the top layer's
            # softmax backward at 40) it is off the full model's own trace: a miss is confirmed at full depth
            from fitcheck.torch_adapters import trace_step

            deep = phase_errors(spec, components_from_trace(trace_step(spec.model.config, **kwargs)))
            if deep != errors:
                print(f"  depth-extrapolated trace: {' '.join(f'{e * 100:+.2f}%' for e in errors.values())}; "
                      f"full depth: {' '.join(f'{e * 100:+.2f}%' for e in deep.values())}", flush=True)
            errors = deep
        return kind, errors
    except Exception as exc:  # the trace refused: reported, not counted as within
        return kind, f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"


def flags(cell: Cell, model: str, recipe: Recipe | None = None) -> str:
    """The ``fitcheck estimate`` flags of a probe (to rerun it with ``--no_trace`` and ``--trace``)."""
    out = [f"--model_name_or_path {model} --device_type cpu --per_device_train_batch_size {cell.batch}",
           f"--max_seq_length {cell.seq} --attn_implementation {cell.attn}"]
    quantized = cell.method in ("qlora", "qlora_noprep", "int8")
    dtype = {"bf16": "bfloat16", "bf16amp": "bfloat16", "fp32": "float32",
             "autocast": "bfloat16" if quantized else "float32"}[cell.precision]
    out.append(f"--dtype {dtype}" + (" --bf16" if cell.precision in ("autocast", "bf16amp") else ""))
    if cell.ckpt:
        out.append("--gradient_checkpointing")
    if cell.method == "freeze":  # the grids' freeze runs a 4-layer copy (differential.FREEZE_DEPTH): no CLI twin
        return " ".join(out) + " --trainable_layers 3 (on a 4-layer copy of the model)"
    if cell.method != "full":
        targets = " ".join((recipe or GRID_RECIPE).targets)
        out.append(f"--use_peft --lora_target_modules {targets}" + (" --use_dora" if cell.method == "dora" else ""))
    if quantized and cell.method != "int8":
        out.append("--load_in_4bit --bnb_4bit_quant_type nf4 --use_bnb_nested_quant")
    if cell.method == "int8":
        out.append("--load_in_8bit")
    return " ".join(out)


def record_misses(rows: list[dict[str, Any]], seed: int | None) -> int:
    """Merge the probes more than 2 % off into ``MISSES``; the number recorded."""
    misses: dict[str, list[dict[str, Any]]] = json.loads(MISSES.read_text()) if MISSES.is_file() else {}
    added = 0
    for row in rows:
        if row.get("worst") is None or abs(row["worst"]) <= TOLERANCE * 100:
            continue
        entry = {"model": row["model"], "seq": row["seq"], "batch": row["batch"], "errors": row["errors"],
                 "seed": row.get("seed", seed), **({"recipe": row["recipe"]} if "recipe" in row else {})}
        known = misses.setdefault(row["kind"], [])
        if not any((m["model"], m["seq"], m["batch"]) == (entry["model"], entry["seq"], entry["batch"]) for m in known):
            known.append(entry)
            added += 1
    MISSES.write_text(json.dumps(misses, indent=1, sort_keys=True) + "\n")
    return added


def recheck() -> int:
    """Trace every recorded miss again at its model and shape; keep those still more than 2 % off. Exit code 1
    when one is kept."""
    misses: dict[str, list[dict[str, Any]]] = json.loads(MISSES.read_text()) if MISSES.is_file() else {}
    kept: dict[str, list[dict[str, Any]]] = {}
    for kind, probes in sorted(misses.items()):
        family, method, ckpt, attn, precision = kind.split("+")[0].split("/")
        for miss in probes:
            config = json.loads((MODELS / miss["model"] / "config.json").read_text())
            cell = Cell(family, method, ckpt == "ckpt", attn, precision, miss["seq"], miss["batch"])
            recipe = GRID_RECIPE
            if "recipe" in miss:
                recipe = Recipe(**{**miss["recipe"], "targets": tuple(miss["recipe"]["targets"])})
            _, result = probe(cell, config, pinned_only=False, recipe=recipe)
            if isinstance(result, str):
                worst, errors = None, miss["errors"]
            else:
                errors = {p.value: round(e * 100, 2) for p, e in result.items()}
                worst = max(errors.values(), key=abs)
            still = worst is None or abs(worst) > TOLERANCE * 100
            print(f"{'KEPT' if still else 'fixed':6} {kind:45} {miss['model']:40} {miss['batch']} x {miss['seq']:<6} "
                  f"{worst if worst is not None else result}")
            if still:
                kept.setdefault(kind, []).append({**miss, "errors": errors})
    MISSES.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    return 1 if kept else 0


def main(argv: list[str]) -> int:
    """Draw, estimate, trace the pinned probes, print the tables."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--probes", type=int, default=40, help="pinned probes to trace")
    ap.add_argument("--budget", type=float, default=0.0, help="stop after this many seconds (0: no limit)")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--json", default="", help="write every probe here")
    ap.add_argument("--record-misses", action="store_true", help=f"merge the probes outside 2 %% into {MISSES.name}")
    ap.add_argument("--from-json", nargs="+", default=(), help="record the misses of these --json outputs")
    ap.add_argument("--recheck", action="store_true", help="trace the recorded misses again; drop the fixed ones")
    ap.add_argument("--recipes", action="store_true", help="draw LoRA rank/targets/dropout, reentrant "
                    "checkpointing and fp16 too (the recipe part of the envelope's key)")
    ap.add_argument("--attn", default="", help="force this attention (sdpa / eager) on every draw (default: the "
                    "draw's own, eager one time in three)")
    ns = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    if ns.recheck:
        return recheck()
    if ns.from_json:
        old = [dict(r, seed=json.loads(Path(f).read_text())["seed"]) for f in ns.from_json
               for r in json.loads(Path(f).read_text())["probes"]]
        print(f"{record_misses(old, None)} misses recorded in {MISSES}")
        return 0
    families = tuple(f for f in ns.families.split(",") if f in FAMILY_MODELS)
    rng = random.Random(ns.seed)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    unpinned = draws = 0
    while len(rows) < ns.probes and draws < 50 * ns.probes:
        if ns.budget and time.perf_counter() - start > ns.budget:
            break
        cell, model, config = draw(rng, families, tuple(ns.methods.split(",")))
        if ns.attn:  # the same draws, the attention forced (the random sequence is unchanged)
            cell = dataclasses.replace(cell, attn=ns.attn)
        recipe = draw_recipe(rng, cell) if ns.recipes else GRID_RECIPE
        draws += 1
        kind, result = probe(cell, config, recipe=recipe)
        if not kind:
            unpinned += 1
            continue
        row: dict[str, Any] = {"kind": kind, "model": model, "seq": cell.seq, "batch": cell.batch,
                               "flags": " ".join(filter(None, (flags(cell, model, recipe), recipe.flags(cell))))}
        if recipe != GRID_RECIPE:
            row["recipe"] = dataclasses.asdict(recipe)
        if isinstance(result, str):
            row.update(refused=result, worst=None)
        else:
            row["errors"] = {p.value: round(e * 100, 2) for p, e in result.items()}
            row["worst"] = round(max(result.values(), key=abs) * 100, 2)
        rows.append(row)
        mark = "REFUSED" if row["worst"] is None else "in " if abs(row["worst"]) <= TOLERANCE * 100 else "OUT"
        errs = " ".join(f"{row['errors'][p.value]:+7.2f}%" for p in PHASES) if "errors" in row else row["refused"]
        adapters = cell.method not in ("full", "freeze")
        tag = "" if recipe == GRID_RECIPE else ((f" r{recipe.r} {','.join(recipe.targets)} d{recipe.dropout}"
                                                 if adapters else "")
                                                + (" reentrant" if recipe.reentrant and cell.ckpt else "")
                                                + (f" {recipe.weights}" if recipe.weights else ""))
        print(f"{mark:7} {kind:45} {model:40} {cell.batch} x {cell.seq:<6} {errs}{tag}", flush=True)
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_kind[row["kind"]].append(row)
    print("\n| kind | pinned probes | within 2 % | worst error (%) |\n|---|---|---|---|")
    for kind, kr in sorted(by_kind.items()):
        scored = [r["worst"] for r in kr if r["worst"] is not None]
        ok = sum(1 for w in scored if abs(w) <= TOLERANCE * 100)
        kind_worst = f"{max(scored, key=abs):+.2f}" if scored else "refused"
        print(f"| {kind} | {len(kr)} | {ok} | {kind_worst} |")
    scored = [r["worst"] for r in rows if r["worst"] is not None]
    ok = sum(1 for w in scored if abs(w) <= TOLERANCE * 100)
    worst = max(scored, key=abs) if scored else 0.0
    print(f"\nseed {ns.seed}: {draws} draws, {unpinned} not pinned; {len(rows)} pinned probes over {len(by_kind)} "
          f"kinds, {ok} within {TOLERANCE:.0%}, {len(rows) - len(scored)} refused by the tracer; worst "
          f"{worst:+.2f} %; {time.perf_counter() - start:.0f} s")
    for row in rows:
        if row["worst"] is None or abs(row["worst"]) > TOLERANCE * 100:
            print(f"  {row['kind']} {row['worst']}: fitcheck estimate {row['flags']}")
    if ns.record_misses:
        print(f"{record_misses(rows, ns.seed)} misses recorded in {MISSES}")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"seed": ns.seed, "draws": draws, "unpinned": unpinned,
                                             "probes": rows}, indent=1))
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
