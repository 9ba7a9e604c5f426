"""Tensor parallelism as transformers 5.23 applies it: which parameters each rank holds a slice of.

transformers shards a model by its config's ``base_model_tp_plan`` (module pattern -> style), the model
class's ``_tp_plan`` (``{"lm_head": "colwise_gather_output"}``) and, when the base model has a plan and an
``nn.Embedding`` ``embed_tokens``, ``{"embed_tokens": "embedding_rowwise"}`` (``distributed/mixin.py``); the
styles are in ``distributed/tensor_parallel.py``:

- ``colwise`` / ``packed_colwise`` / ``colwise_gather_output``: ``nn.Linear`` weight split on dim 0 (output
  features), bias split too; the output stays sharded (``colwise``: heads or MLP columns per rank) or is
  all-gathered (``colwise_gather_output``: the LM head's logits, Phi-3's fused qkv/gate_up).
- ``rowwise`` / ``rowwise_split_input``: weight split on dim 1 (input features), bias replicated; the output
  is all-reduced (full hidden size on every rank).
- ``embedding_rowwise`` (``EmbeddingParallel(shard_dim=0)``): the input embedding split by vocabulary rows,
  the partial lookups summed (an all-reduce of ``b·s·h``).
- anything else (``replicated_with_grad_allreduce``, no rule: norms, routers): replicated.

So under ``tp_size = t`` a rank holds 1/t of every attention and MLP projection, of the input embedding and
of the LM head, and the full norms; its activations inside attention (heads) and MLP (intermediate columns) are
1/t, those on the residual stream (hidden size) are full, and the logits are full (gathered output).

The plans below are transformers 5.23's, per ``model_type`` (``models/*/configuration_*.py``
``base_model_tp_plan``; every causal-LM class's ``_tp_plan``); ``tests/test_parallelism.py`` checks them
against the installed transformers and checks every rank-local shape against a real
``from_pretrained(tp_plan="auto")`` load on torch's fake process group. Families without a plan (GPT-2,
BERT, Falcon, BLOOM) cannot be run with ``tp_size > 1``.
"""

from __future__ import annotations

import fnmatch
from dataclasses import replace

from fitcheck.spec import Kind, ModelInventory, ModelShape, ParamEntry

# transformers 5.23 base_model_tp_plan of each family: ``ModelShape.traits.tp_plan`` (fitcheck/families).
# <Family>ForCausalLM._tp_plan (modeling_<family>.py): the LM head is split by vocabulary, logits gathered.
LM_HEAD_STYLE = "colwise_gather_output"
# transformers 5.23 distributed/mixin.py: added for an nn.Embedding embed_tokens when the base model has a plan.
EMBEDDING_STYLE = "embedding_rowwise"

_COLWISE = ("colwise", "packed_colwise", "colwise_gather_output", "embedding_rowwise")
_ROWWISE = ("rowwise", "rowwise_split_input")

SRC_TP = (
    "transformers 5.23 distributed/tensor_parallel.py (colwise: weight dim 0 and bias split; rowwise: weight "
    "dim 1 split, bias replicated, output all-reduced; embedding_rowwise: vocabulary rows split) with the "
    "family's base_model_tp_plan, _tp_plan {'lm_head': 'colwise_gather_output'} and distributed/mixin.py's "
    "embed_tokens rule"
)


def tp_plan(shape: ModelShape) -> dict[str, str] | None:
    """The family's ``base_model_tp_plan`` plus the LM head rule, or None when transformers has none."""
    plan = shape.traits.tp_plan
    if plan is None:
        return None
    return {"embed_tokens": EMBEDDING_STYLE, **dict(plan), "lm_head": LM_HEAD_STYLE}


def style_of(entry: ParamEntry, plan: dict[str, str]) -> str | None:
    """The tp style that applies to a parameter (by its module path), or None (replicated)."""
    name = entry.name
    for prefix in ("model.language_model.", "model.", ""):
        if name.startswith(prefix):
            rel = name[len(prefix) :]
            break
    module = rel.rsplit(".", 1)[0] if entry.kind is not Kind.FUSED_EXPERTS else rel
    for pattern, style in plan.items():
        if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(rel, pattern):
            return style
    return None


def _split_dim(entry: ParamEntry, style: str, is_bias: bool) -> int | None:
    """Which dimension of the stored tensor is divided (None: kept whole)."""
    if style in _COLWISE:
        if entry.kind is Kind.FUSED_EXPERTS and len(entry.shape) == 3:
            return 1  # (experts, 2*intermediate, hidden): transformers 5 stores out features on dim 1
        return 0
    if style in _ROWWISE:
        if is_bias:
            return None
        if entry.kind is Kind.FUSED_EXPERTS and len(entry.shape) == 3:
            return 2  # (experts, hidden, intermediate): in features on the last dim
        return 1 if len(entry.shape) >= 2 else None
    return None


def local_entry(entry: ParamEntry, style: str | None, tp: int) -> ParamEntry:
    """The slice of one parameter that a tensor-parallel rank holds (ceil division, as torch.chunk)."""
    if style is None or tp == 1:
        return entry
    is_bias = entry.name.endswith(".bias")
    dim = _split_dim(entry, style, is_bias)
    if dim is None or dim >= len(entry.shape):
        return entry
    shape = list(entry.shape)
    shape[dim] = -(-shape[dim] // tp)
    out_f, in_f = entry.out_features, entry.in_features
    if style in _COLWISE and out_f:
        out_f = -(-out_f // tp)
    elif style in _ROWWISE and in_f and not is_bias:
        in_f = -(-in_f // tp)
    return replace(entry, shape=tuple(shape), out_features=out_f, in_features=in_f)


def splits_activations(plan: dict[str, str]) -> bool:
    """True when attention heads and MLP columns stay sharded between the colwise and rowwise layers."""
    return any(v == "colwise" for k, v in plan.items() if "attn" in k)


def local_inventory(inventory: ModelInventory, tp: int) -> ModelInventory:
    """The model as one tensor-parallel rank holds it: split parameters and, when activations are split,
    the per-rank attention heads and MLP width (hidden size, vocabulary and the residual stream are whole).

    Args:
        inventory: The whole model.
        tp: ``tp_size``.

    Returns:
        The rank-local inventory (the same inventory when ``tp == 1``).

    Raises:
        ValueError: The family has no tp_plan in transformers 5.23.
    """
    if tp == 1:
        return inventory
    shape = inventory.shape
    plan = tp_plan(shape)
    if plan is None:
        raise ValueError(f"model_type {shape.family!r} has no tp_plan in transformers 5.23")
    params = tuple(local_entry(p, style_of(p, plan), tp) for p in inventory.params)
    local_shape: ModelShape = shape
    if splits_activations(plan):
        local_shape = replace(
            shape,
            num_heads=max(1, shape.num_heads // tp),
            num_kv_heads=max(1, shape.num_kv_heads // tp),
            intermediate_size=max(1, -(-shape.intermediate_size // tp)),
        )
    return replace(inventory, params=params, shape=local_shape)


def tp_divisibility_problems(shape: ModelShape, tp: int) -> list[str]:
    """What ``tp_size`` must divide for the colwise/rowwise split to keep whole heads."""
    out = []
    for name, value in (
        ("num_attention_heads", shape.num_heads),
        ("num_key_value_heads", shape.num_kv_heads),
        ("intermediate_size", shape.intermediate_size),
    ):
        if value % tp:
            out.append(f"{name}={value} is not divisible by tp_size={tp}")
    return out
