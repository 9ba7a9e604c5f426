"""Pinned means checked at this shape: the recipe part of a kind's key and the range of shapes it was checked at.

A kind of run (``envelope.envelope_key``: family, method, checkpointing, attention, precision) is checked by
``benchmarks/envelope_ranges.py`` with one per-token recipe — TRL's LoRA defaults (r 16, alpha 32, dropout 0.05,
every linear layer), transformers' loss, no Liger, no activation offloading, text inputs — over a range of shapes
(sequence lengths, micro-batches, widths); a second recipe, peft's default targets (q_proj and v_proj, the rest
as TRL's), has its own rows (``label+qv``). ``recipe_of`` says which recipe a spec runs; a spec is pinned only
when its recipe is one checked and its shape is inside the range its kind was checked over with it
(``shape_in_range``), with every phase's activation/logits error within 2 % at every shape checked. Pure: the
checked ranges are data, passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fitcheck.core.states import trl_module_cast
from fitcheck.spec import TrainingSpec

# The recipe the range grid runs (differential._LORA: TRL ModelConfig defaults on every linear layer).
CHECKED_RECIPE = ("all-linear", "r<=64", "dropout")
NO_ADAPTER_RECIPE = ("-", "-", "-")
# peft's default targets for the Llama-style families (peft 0.21.2 utils/constants.py
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING; readers/run_args.py PEFT_DEFAULT_TARGETS): a second recipe,
# range-checked with ``benchmarks/envelope_ranges.py --targets q,v`` into rows labelled ``label+qv``
DEFAULT_TARGETS = ("q_proj", "v_proj")
QV_RECIPE = ("q,v", CHECKED_RECIPE[1], CHECKED_RECIPE[2])
# label suffix of the range rows of each recipe that has rows
RECIPE_SUFFIXES = {CHECKED_RECIPE: "", QV_RECIPE: "+qv"}
# Above this rank the adapters' own activations (b·s·r per adapted layer) stop being negligible next to the
# layer's; the grid ran r 16 (peft tuners/lora/layer.py: lora_A's output is saved for lora_B's backward).
RANK_CLASS_LIMIT = 64


def unchecked_step(spec: TrainingSpec) -> str | None:
    """What a run's step does that no range row ran (the rows run transformers' loss on text inputs, no Liger, no
    offloading, non-reentrant checkpointing), or None.

    Reentrant checkpointing (``gradient_checkpointing_kwargs={"use_reentrant": True}``: LLaMA-Factory's
    ``use_reentrant_gc`` default, transformers 4.x's default) keeps a recomputed layer's whole graph until torch
    2.13 ``utils/checkpoint.py`` ``CheckpointFunction.backward`` returns (it runs ``torch.autograd.backward`` on the
    recomputed outputs, whose nodes hold every tensor the layer saved), where the non-reentrant recomputation the
    rows ran frees each saved tensor as its node runs: the worst moment during backward differs (off-grid probes,
    ``benchmarks/pinned_probes.py --recipes``, traced reentrant: Qwen2.5-7B full bf16 3 x 2200 -6.7 %, Llama-3.1-8B
    LoRA eager fp32 1 x 3000 -1.8 %, 8-bit LoRA bf16 2 x 1536 +9.9 %).
    """
    act = spec.activations
    if act.liger is not None:
        return "Liger kernels"
    if act.loss != "torch":
        return f"the {act.loss} loss"
    if act.offload_activations:
        return "activation offloading"
    if spec.model.shape.task == "image-text-to-text":
        return "vision inputs"
    if act.checkpointing and act.use_reentrant:
        return "reentrant checkpointing"
    if trl_module_cast(spec):  # its bf16 embedding / head (core/states/trl_adapters.py): no range row ran it
        return f"TRL {spec.stack.get('trl')}'s SFTTrainer casts (peft_module_casting_to_bf16)"
    return None


def recipe_of(spec: TrainingSpec) -> tuple[str, str, str] | None:
    """What changes the per-token recipe besides the envelope key: adapter targets, rank class, dropout.

    Returns:
        ``(targets, rank class, dropout)``: ``("all-linear", "r<=64", "dropout")`` for TRL's default adapters,
        ``"q,v"`` targets for peft's default ones, ``NO_ADAPTER_RECIPE`` without adapters; None for runs no range
        was checked for (``unchecked_step``: Liger kernels, a fused or chunked loss, activation offloading, vision
        inputs, reentrant checkpointing).
    """
    if unchecked_step(spec) is not None:
        return None
    lora = spec.lora
    if lora is None:
        return NO_ADAPTER_RECIPE
    targets = "all-linear" if tuple(lora.target_modules) == ("all-linear",) else "subset"
    if sorted(lora.target_modules) == list(DEFAULT_TARGETS) and not lora.target_regex:
        targets = QV_RECIPE[0]
    rank = f"r<={RANK_CLASS_LIMIT}" if lora.r <= RANK_CLASS_LIMIT else f"r>{RANK_CLASS_LIMIT}"
    return (targets, rank, "dropout" if lora.dropout > 0 else "no-dropout")


def recipe_suffix(spec: TrainingSpec) -> str | None:
    """The label suffix of the range rows that can pin this spec's recipe (``""``: the grid's own recipe, or no
    adapters; ``"+qv"``: peft's default targets), or None for a recipe no range was checked for."""
    recipe = recipe_of(spec)
    if spec.lora is None:
        return "" if recipe == NO_ADAPTER_RECIPE else None
    return None if recipe is None else RECIPE_SUFFIXES.get(recipe)


def shape_of(spec: TrainingSpec) -> tuple[int, int, int]:
    """``(width, sequence, micro-batch)`` of a spec, as the range grid records its shapes."""
    return (spec.model.shape.hidden_size, spec.batch.seq_len, spec.batch.micro_batch)


def shape_in_range(spec: TrainingSpec, shapes: Sequence[Sequence[int]]) -> bool:
    """Whether a spec's shape lies inside the shapes its kind was checked at.

    Inside means: the width between the narrowest and the widest model checked, the sequence between the
    shortest and the longest checked, the micro-batch at most the largest checked (activations are affine in
    the micro-batch at a fixed sequence, ``torch_adapters/trace_batch.py``; 1 is always checked).

    Args:
        spec: The run.
        shapes: ``(width, sequence, micro-batch)`` of every shape checked.
    """
    if not shapes:
        return False
    width, seq, batch = shape_of(spec)
    widths = [s[0] for s in shapes]
    seqs = [s[1] for s in shapes]
    return (min(widths) <= width <= max(widths) and min(seqs) <= seq <= max(seqs)
            and 1 <= batch <= max(s[2] for s in shapes))


# Suffix of a label checked on CUDA specs against the CUDA-emulating trace (``benchmarks/envelope_ranges.py
# --device cuda``; ``torch_adapters/cuda_emulation.py``); a label without it was checked on CPU specs and traces.
CUDA_SUFFIX = "@cuda"


def range_label(key: tuple[str, str, bool, str, str], suffix: str = "") -> str:
    """The label of a kind in the range data: ``family/method/ckpt|nockpt/attn/precision`` (+ ``suffix``)."""
    family, method, ckpt, attn, precision = key
    return f"{family}/{method}/{'ckpt' if ckpt else 'nockpt'}/{attn}/{precision}{suffix}"


def checked_at_shape(spec: TrainingSpec, key: tuple[str, str, bool, str, str] | None,
                     ranges: Mapping[str, Mapping[str, object]], suffix: str = "") -> bool:
    """Whether the range data pins this spec: its recipe has range rows (``recipe_suffix``), its kind (the row
    ``range_label(key, recipe suffix + suffix)``) was within 2 % at every shape and phase checked, and its shape is
    inside that range."""
    rs = recipe_suffix(spec)
    if key is None or rs is None:
        return False
    row = ranges.get(range_label(key, rs + suffix))
    if row is None or row.get("within") is not True:
        return False
    shapes = row.get("shapes")
    return isinstance(shapes, list) and shape_in_range(spec, shapes)
