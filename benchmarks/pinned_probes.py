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

``--accum`` runs every draw with gradient accumulation 2, 4 or 8 (not in the envelope's key: a pinned kind is
pinned at any accumulation); its trace runs two passes and measures the second, where every gradient already
exists (``TRACED_ACCUM``; the earlier pass's gradients are taken out of its forward phases, ``traced_components``).
``--promoted`` runs one draw in three with 16-bit weights under the other 16-bit autocast (float16 + bf16,
bfloat16 + fp16: ``core/activations/promoted.py``); such a run must answer ``pinned: false``. ``--by-kind`` draws
the kinds of the pinned range rows (``envelope_ranges.json``), the least probed so far (earlier sessions'
``benchmarks/data/pinned_probes_session*.json`` and this run) most often, each inside its row's checked range, in
place of the family x method draw. These three draw after ``--recipes`` from the same generator: a seed without
them draws what it drew before.

Run: ``python benchmarks/pinned_probes.py [--seed 0] [--probes 40] [--budget 900] [--families a,b]
[--methods a,b] [--attn eager] [--recipes] [--accum] [--promoted] [--by-kind] [--json out.json]
[--user-shapes] [--record-misses]``.

``--user-shapes`` redraws each run's shape as users run it: a sequence of at least 16k where the model's limit
(with ``--by-kind``, the kind's checked range) allows, micro-batch 1 or a large one (8, or 12 / 16: above every
range's micro-batch 8, such answers must say ``pinned: false``), and a LoRA rank from 8 to 256 (above 64:
``pinned: false``). It draws last from the same generator.

A pinned answer with a finding that says part of the run is "not modelled" (issue 20: never together) is a miss,
printed ``REFUSED`` with the finding codes, not traced.

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
import re
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from fitcheck.core.activations import DEFAULT_TARGETS  # peft's default targets: the ``+qv`` rows
from fitcheck.report import Phase
from fitcheck.spec import Dtype, MixedPrecision, PrecisionSpec, TrainingSpec
from fitcheck.torch_adapters import FAMILY_MODELS, PHASES, Cell, cell_spec, components_from_trace, phase_errors

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
    # "" (the cell's), "fp16" (fp16 weights, no autocast), "fp16amp" (fp32 weights, fp16 autocast), or 16-bit
    # weights under the other 16-bit autocast (``--promoted``; ``core/activations/promoted.py``): "fp16bf16amp"
    # (float16 weights, bf16 autocast: TRL's --bf16 on a float16 config) or "bf16fp16amp" (bfloat16 under fp16)
    weights: str = ""
    accum: int = 1  # gradient_accumulation_steps (``--accum``)

    def apply(self, spec: TrainingSpec) -> TrainingSpec:
        """The spec with this recipe."""
        lora = spec.lora and dataclasses.replace(spec.lora, r=self.r, alpha=2.0 * self.r, dropout=self.dropout,
                                                 target_modules=self.targets)
        act = dataclasses.replace(spec.activations, use_reentrant=self.reentrant and spec.activations.checkpointing)
        precision = WEIGHTS[self.weights] if self.weights else spec.precision
        batch = dataclasses.replace(spec.batch, grad_accum=self.accum)
        return dataclasses.replace(spec, lora=lora, activations=act, precision=precision, batch=batch)

    def flags(self, cell: Cell) -> str:
        """The ``fitcheck estimate`` flags that change (appended to the cell's)."""
        out = []
        if cell.method not in ("full", "freeze"):  # the targets: flags(cell, model, recipe)
            out.append(f"--lora_r {self.r} --lora_alpha {2 * self.r} --lora_dropout {self.dropout}")
        if self.reentrant and cell.ckpt:
            out.append("--gradient_checkpointing_kwargs '{\"use_reentrant\": true}'")
        if self.weights:
            w = WEIGHTS[self.weights]
            out.append(f"--dtype {w.load_dtype.value}" + ("" if w.mixed_precision is MixedPrecision.NO
                                                          else f" --{w.mixed_precision.value}"))
        if self.accum > 1:
            out.append(f"--gradient_accumulation_steps {self.accum}")
        return " ".join(out)


# Recipe.weights: the precision a probe runs instead of its cell's
WEIGHTS = {"fp16": PrecisionSpec(Dtype.FLOAT16, MixedPrecision.NO),
           "fp16amp": PrecisionSpec(Dtype.FLOAT32, MixedPrecision.FP16),
           "fp16bf16amp": PrecisionSpec(Dtype.FLOAT16, MixedPrecision.BF16),
           "bf16fp16amp": PrecisionSpec(Dtype.BFLOAT16, MixedPrecision.FP16)}
PROMOTED = ("fp16bf16amp", "bf16fp16amp")
GRID_RECIPE = Recipe()
QUANTIZED = ("qlora", "qlora_noprep", "int8")
# Passes a probe with gradient accumulation traces: every pass after the first runs with every gradient already
# allocated (torch/csrc/autograd/functions/accumulate_grad.h adds into it), so pass 2 describes passes 2..n
TRACED_ACCUM = 2


def draw_holes(rng: random.Random, cell: Cell, recipe: Recipe, *, accum: bool, promoted: bool) -> Recipe:
    """``--accum``: gradient accumulation 2, 4 or 8 on every draw; ``--promoted``: one draw in three runs 16-bit
    weights under the other 16-bit autocast (the cell's precision otherwise). Drawn after ``draw_recipe`` from the
    same generator, so a seed without these flags draws what it drew before."""
    if accum:
        recipe = dataclasses.replace(recipe, accum=rng.choice((2, 4, 8)))
    if promoted and rng.random() < 1 / 3:
        recipe = dataclasses.replace(recipe, weights=rng.choice(PROMOTED))
    return recipe


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


# --user-shapes: the shapes users run that the draws above rarely reach (issue 20: ">= 32k where the model allows,
# micro-batch 1 and a large one"; LoRA ranks up to 256: peft's default 8 to the large ranks of long-context recipes)
USER_SEQ_FLOOR = 16384
USER_BATCHES = (1, 1, 8, 12, 16)
USER_RANKS = (8, 16, 32, 64, 128, 256)


def draw_user_shape(rng: random.Random, cell: Cell, recipe: Recipe, top: int) -> tuple[Cell, Recipe]:
    """``--user-shapes``: a sequence of at least 16k where ``top`` (the model's limit, or the kind's checked range
    under ``--by-kind``) allows, micro-batch 1 or a large one (8; 12 and 16 are above every range's micro-batch 8:
    they must answer ``pinned: false``) and a LoRA rank from 8 to 256 (above 64 must answer ``pinned: false``).
    Drawn after every other draw from the same generator: a seed without it draws what it drew before."""
    seq = cell.seq
    if top >= USER_SEQ_FLOOR:
        seq = 64 * round(2 ** rng.uniform(math.log2(USER_SEQ_FLOOR), math.log2(top)) / 64)
        seq = min(seq, top - top % 64)
    batch = rng.choice(USER_BATCHES)
    if seq in GRID_SEQS and batch in GRID_BATCHES:
        seq -= 64  # an exact grid point (at some width): off it
    if cell.method not in ("full", "freeze"):
        recipe = dataclasses.replace(recipe, r=rng.choice(USER_RANKS))
    return dataclasses.replace(cell, seq=seq, batch=batch), recipe


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


def pinned_rows(families: tuple[str, ...], methods: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """The range rows that pin a CPU answer (``envelope_ranges.json``: within 2 % at every shape; no ``@cuda``
    row), of these families and methods, less the kinds an earlier probe unpinned and the families whose
    backward working set is not pinned to a trace (``traits.backward_pinned`` False: the ``backward-not-pinned``
    INFO unpins every answer of theirs, ``core/activations/backward.py`` ``backward_findings``; session 20's
    seeds 2001/2002 drew olmo2, gemma2, gpt2, phi and bloom rows that way, never pinned)."""
    from fitcheck.catalog import envelope_probe_misses, envelope_ranges
    from fitcheck.families import traits_of_type

    misses = envelope_probe_misses()
    return {label: dict(row) for label, row in envelope_ranges().items()
            if row.get("within") is True and "@" not in label and label not in misses
            and label.split("/")[0] in families and label.split("/")[1] in methods
            and traits_of_type(label.split("/")[0]).backward_pinned}


def width(config: dict[str, Any]) -> int:
    """The hidden width of a catalog config (the range rows' first shape coordinate)."""
    return int(config.get("hidden_size") or config.get("n_embd") or config.get("n_embed") or 0)


def draw_from_rows(rng: random.Random, rows: dict[str, dict[str, Any]],
                   probed: dict[str, int]) -> tuple[Cell, str, dict[str, Any], str] | None:
    """``--by-kind``: one run of a pinned kind, the kinds probed least so far (``probed``: label -> probes, from
    earlier sessions' data and this run) drawn most often (weight 1 / (1 + probes)²), inside the kind's checked
    range (width, sequence, micro-batch) and off its checked shapes and the grids' points. Returns the cell, its
    model id and config and the row's recipe suffix (``+qv``), or None when no catalog model fits the row."""
    labels = sorted(rows)
    label = rng.choices(labels, [1 / (1 + probed.get(lbl, 0)) ** 2 for lbl in labels])[0]
    kind, plus, suffix = label.partition("+")
    family, method, ckpt, attn, precision = kind.split("/")
    shapes = [tuple(x) for x in rows[label]["shapes"]]
    low, high = min(x[0] for x in shapes), max(x[0] for x in shapes)
    models = [(m, c) for m, c in family_models(family) if low <= width(c) <= high]
    if not models:
        probed[label] = 10**6  # no catalog model of this family inside the row's widths: never drawn again
        return None
    model, config = rng.choice(models)
    top = min(longest(config), max(x[1] for x in shapes))
    bottom = max(min(x[1] for x in shapes), 384)
    batches = [b for b in MICRO_BATCHES if b <= max(x[2] for x in shapes)]
    for _ in range(20):
        seq = 64 * round(2 ** rng.uniform(math.log2(bottom), math.log2(max(top, bottom))) / 64)
        batch = rng.choice(batches)
        if (seq in GRID_SEQS and batch in GRID_BATCHES) or (width(config), seq, batch) in shapes or seq > top:
            continue
        return Cell(family, method, ckpt == "ckpt", attn, precision, seq, batch), model, config, plus + suffix
    return None


def traced_components(spec: TrainingSpec, traced: Any) -> tuple[Any, ...]:
    """``components_from_trace`` of a probe's trace, less the earlier passes' gradients with accumulation.

    With ``grad_accum`` passes the measured (last) pass's forward runs beside the gradients the earlier passes
    accumulated (the same storages: ``AccumulateGrad`` adds in place, torch ``autograd/functions/accumulate_grad.h``),
    which ``components_from_trace`` counts as temporaries at the end of forward and the start of backward (a
    one-pass trace, the default path's, holds none there); the formulas count them as the ``gradients`` model
    state at every phase (``core/states/model_states.py`` ``_gradient_components``: ``accum``). During backward
    ``components_from_trace`` already subtracts ``final_grads``."""

    comps = components_from_trace(traced)
    if spec.batch.grad_accum == 1:
        return comps
    out = []
    for comp in comps:
        if comp.name == "temporaries.traced":
            by_phase = {p: comp.at(p) - (min(comp.at(p), traced.final_grads) if p is not Phase.BACKWARD else 0)
                        for p in comp.by_phase}
            comp = dataclasses.replace(comp, by_phase=by_phase)
        out.append(comp)
    return tuple(out)


def probe(cell: Cell, config: dict[str, Any], *, pinned_only: bool = True,
          recipe: Recipe = GRID_RECIPE) -> tuple[str, dict[Phase, float] | str]:
    """The envelope kind of a pinned formula answer (``""``: not pinned; every answer with ``pinned_only`` off) and
    its error per phase against a trace at the same shape (or why the trace refused, or, for a pinned answer that
    says part of the run is not modelled, ``unmodelled_notes``: a miss, not traced)."""
    from fitcheck.core import estimate
    from fitcheck.core.activations import envelope_key, range_label, recipe_suffix
    from fitcheck.torch_adapters import BatchTraces, activation_trace_kwargs

    spec = cell_spec(cell, config) if recipe == GRID_RECIPE else recipe.apply(cell_spec(cell, config))
    report = estimate(spec)
    if pinned_only and not report.pinned:
        return "", ""
    key = envelope_key(spec)
    kind = "?" if key is None else range_label(key, recipe_suffix(spec) or "")  # "+qv": peft's default targets' rows
    if report.pinned and (notes := unmodelled_notes(report)):  # counted as a miss, not traced
        return kind, "NOTE: pinned next to a note saying part of the run is not modelled: " + ", ".join(notes)
    try:
        kwargs = activation_trace_kwargs(spec)
        if spec.batch.grad_accum > 1:  # the last of TRACED_ACCUM passes: every gradient exists from its start
            kwargs["grad_accum"] = min(spec.batch.grad_accum, TRACED_ACCUM)
        traced = BatchTraces(spec.model.config, kwargs, skip_first=True).result(cell.batch)
        errors = phase_errors(spec, traced_components(spec, traced))
        if max(abs(e) for e in errors.values()) > TOLERANCE:
            # BatchTraces extrapolates from one and two layer groups; where the phase's worst moment changes with
            # depth (Mistral-Small-24B full eager bf16 1 x 1792: the LM head's at 1-2 layers, the top layer's
            # softmax backward at 40) it is off the full model's own trace: a miss is confirmed at full depth
            from fitcheck.torch_adapters import trace_step

            deep = phase_errors(spec, traced_components(spec, trace_step(spec.model.config, **kwargs)))
            if deep != errors:
                print(f"  depth-extrapolated trace: {' '.join(f'{e * 100:+.2f}%' for e in errors.values())}; "
                      f"full depth: {' '.join(f'{e * 100:+.2f}%' for e in deep.values())}", flush=True)
            errors = deep
        return kind, errors
    except Exception as exc:  # the trace refused: reported, not counted as within
        return kind, f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"


# A note saying part of the run is not modelled (issue 20: never next to ``pinned: true``)
UNMODELLED = re.compile(r"not\s+modell?ed|unmodell?ed", re.IGNORECASE)


def unmodelled_notes(report: Any) -> list[str]:
    """The codes of a report's findings whose message or hint says part of the run is not modelled.

    Issue 20: "a formula note that says 'not modelled' and ``pinned: true`` never appear together". Findings are
    the answer's notes about its memory; the compute notes (``report.compute``: FLOPs and time, which ``pinned``
    does not cover) are not read."""
    return sorted({f.code for f in report.findings if UNMODELLED.search(f"{f.message} {f.hint or ''}")})


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


def earlier_probes() -> dict[str, int]:
    """Pinned probes per kind label in the earlier sessions' data (``benchmarks/data/pinned_probes_session*.json``)."""
    out: dict[str, int] = defaultdict(int)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "probes" and isinstance(value, list):
                    for row in value:
                        out[row["kind"]] += 1
                else:
                    walk(value)

    for path in sorted(Path(__file__).parent.joinpath("data").glob("pinned_probes_session*.json")):
        walk(json.loads(path.read_text()))
    return dict(out)


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
    ap.add_argument("--accum", action="store_true", help="gradient accumulation 2, 4 or 8 on every draw (traced "
                    f"with {TRACED_ACCUM} passes, the last one measured)")
    ap.add_argument("--promoted", action="store_true", help="one draw in three runs 16-bit weights under the other "
                    "16-bit autocast (float16 + bf16, bfloat16 + fp16)")
    ap.add_argument("--by-kind", action="store_true", help="draw the pinned range rows' kinds, the least probed "
                    "(earlier sessions' data and this run) most often, inside each row's checked range")
    ap.add_argument("--user-shapes", action="store_true", help="sequences >= 16k where the model (or, with "
                    "--by-kind, the kind's range) allows, micro-batch 1 or large (8, 12, 16), LoRA rank 8 .. 256")
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
    methods = tuple(ns.methods.split(","))
    rng = random.Random(ns.seed)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    unpinned = draws = promoted_draws = 0
    kinds = pinned_rows(families, methods) if ns.by_kind else {}
    probed = earlier_probes() if ns.by_kind else {}
    while len(rows) < ns.probes and draws < 50 * ns.probes:
        if ns.budget and time.perf_counter() - start > ns.budget:
            break
        suffix = ""
        if ns.by_kind:
            drawn = draw_from_rows(rng, kinds, probed)
            if drawn is None:
                continue
            cell, model, config, suffix = drawn
        else:
            cell, model, config = draw(rng, families, methods)
        if ns.attn:  # the same draws, the attention forced (the random sequence is unchanged)
            cell = dataclasses.replace(cell, attn=ns.attn)
        recipe = draw_recipe(rng, cell) if ns.recipes else GRID_RECIPE
        if suffix == "+qv" and not ns.recipes:
            recipe = dataclasses.replace(recipe, targets=DEFAULT_TARGETS)
        recipe = draw_holes(rng, cell, recipe, accum=ns.accum, promoted=ns.promoted)
        if ns.user_shapes:
            top = longest(config)
            if ns.by_kind:  # inside the kind's checked sequences
                row = kinds.get(f"{cell.family}/{cell.method}/{'ckpt' if cell.ckpt else 'nockpt'}/{cell.attn}/"
                                f"{cell.precision}{suffix}")
                top = min(top, max(x[1] for x in row["shapes"])) if row else top
            cell, recipe = draw_user_shape(rng, cell, recipe, top)
        draws += 1
        kind, result = probe(cell, config, recipe=recipe)
        promoted_draws += recipe.weights in PROMOTED
        if not kind:
            unpinned += 1
            continue
        probed[kind] = probed.get(kind, 0) + 1
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
                                                + (f" {recipe.weights}" if recipe.weights else "")
                                                + (f" accum{recipe.accum}" if recipe.accum > 1 else ""))
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
          f"{worst:+.2f} %; {time.perf_counter() - start:.0f} s"
          + (f"; {promoted_draws} draws ran 16-bit weights under the other 16-bit autocast, "
             f"{sum(1 for r in rows if r.get('recipe', {}).get('weights') in PROMOTED)} of them pinned"
             if ns.promoted else ""))
    for row in rows:
        if row["worst"] is None or abs(row["worst"]) > TOLERANCE * 100:
            print(f"  {row['kind']} {row['worst']}: fitcheck estimate {row['flags']}")
    if ns.record_misses:
        print(f"{record_misses(rows, ns.seed)} misses recorded in {MISSES}")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"seed": ns.seed, "draws": draws, "unpinned": unpinned,
                                             "promoted_draws": promoted_draws, "probes": rows}, indent=1))
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
