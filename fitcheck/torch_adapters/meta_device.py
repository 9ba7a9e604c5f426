"""Parameter inventory of any transformers architecture: build the model on the meta device and read it.

``with torch.device("meta"): AutoModelForCausalLM.from_config(config)`` allocates no memory and keeps tied
weights as one tensor (measured in the shared feasibility notes: 0.1-0.5 s even at 70B). Roles and kinds come
from the module types: ``nn.Linear`` and transformers ``Conv1D`` weights are LINEAR (what bitsandbytes
quantizes), ``nn.Embedding`` is EMBEDDING, LayerNorm/RMSNorm classes are NORM, 3-D parameters are
FUSED_EXPERTS. Names with a layer index become ``layers.*.`` entries with a repeat count.

Remote code is never run: ``auto_map`` is removed from the config and ``trust_remote_code=False`` is passed.
torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fitcheck.errors import UnsupportedModelError
from fitcheck.families import traits_of
from fitcheck.readers import ConfigView, mlp_kind
from fitcheck.spec import Kind, ModelInventory, ModelShape, ParamEntry, Role

_INDEX = re.compile(r"\.(\d+)\.")
_ATTENTION_WORDS = {"attn", "attention", "self_attn", "self_attention", "crossattention", "cross_attn"}
_POSITION_WORDS = {"wpe", "position_embeddings", "embed_positions"}
_ROUTER_WORDS = {"gate", "router"}
_HEAD_WORDS = {"score", "classifier"}
# Parameter names of gated (GLU) MLPs in transformers: Llama-style gate_proj, Phi-3 gate_up_proj, MoE experts.
_GATED_SUFFIXES = ("gate_proj.weight", "gate_up_proj.weight", "experts.gate_up_proj", "w1.weight")


def _kv_heads(model: Any) -> int:
    """K/V heads as the attention module computes them (Falcon multi_query: 1 whatever the config says)."""
    for module in model.modules():
        for attr in ("num_kv_heads", "num_key_value_heads"):
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0 and module is not model:
                return value
    return 0


def _parallel_block(model: Any, layer_class: str) -> bool:
    """Attention and MLP read the same normed input (GPT-J/Phi/Falcon style).

    From ``config.parallel_attn`` when the config has it, else from the first decoder layer: a single norm
    directly under the layer, beside attention and MLP children, is the parallel block (PhiDecoderLayer).
    """
    import torch.nn as nn

    flag = getattr(model.config, "parallel_attn", None)
    if isinstance(flag, bool):
        return flag
    layer = next((m for m in model.modules() if type(m).__name__ == layer_class), None)
    if layer is None:
        return False
    children = list(layer.named_children())
    norms = [n for n, c in children if isinstance(c, nn.LayerNorm) or type(c).__name__.endswith("Norm")]
    others = {n for n, _ in children} - set(norms)
    has_attn = any("attn" in n or "attention" in n for n in others)
    has_mlp = any("mlp" in n or "ffn" in n or "feed_forward" in n for n in others)
    return len(norms) == 1 and has_attn and has_mlp


def _partial_rotary(cfg: Any) -> float:
    """Fraction of head_dim that is rotated, as the config object resolved it (rope_parameters in v5)."""
    rope = getattr(cfg, "rope_parameters", None)
    for value in (
        rope.get("partial_rotary_factor") if isinstance(rope, dict) else None,
        getattr(cfg, "partial_rotary_factor", None),
    ):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 1.0


def _activation(model: Any) -> str:
    """The MLP activation from the config, else from the activation module classes (BLOOM's BloomGelu)."""
    cfg = model.config
    for attr in ("hidden_act", "hidden_activation", "activation_function", "activation"):
        value = getattr(cfg, attr, None)
        if isinstance(value, str) and value:
            return value
    for module in model.modules():
        name = type(module).__name__.lower()
        for act in ("gelu", "silu", "relu"):
            if act in name:
                return act
    return ""


def _kind(module: Any, param_name: str, ndim: int) -> Kind:
    import torch.nn as nn
    from transformers.pytorch_utils import Conv1D

    if ndim == 3:
        return Kind.FUSED_EXPERTS
    if isinstance(module, (nn.Linear, Conv1D)):
        return Kind.LINEAR if param_name == "weight" else Kind.BIAS
    if isinstance(module, nn.Embedding):
        return Kind.EMBEDDING
    if isinstance(module, nn.LayerNorm) or type(module).__name__.endswith(("Norm", "LayerNorm", "RMSNorm")):
        return Kind.NORM
    if param_name == "bias":
        return Kind.BIAS
    return Kind.OTHER


def _role(name: str, module: Any, kind: Kind, is_output_head: bool) -> Role:
    segments = name.split(".")
    module_name = segments[-2] if len(segments) > 1 else ""
    if kind is Kind.FUSED_EXPERTS or "Experts" in type(module).__name__:
        return Role.EXPERTS
    if module_name in _ROUTER_WORDS or "Router" in type(module).__name__:
        return Role.ROUTER
    if kind is Kind.BIAS:
        return Role.BIAS
    if kind is Kind.NORM:
        return Role.NORM
    if kind is Kind.EMBEDDING:
        return Role.POSITION if module_name in _POSITION_WORDS else Role.EMBEDDING
    if kind is Kind.LINEAR:
        # score / classifier: the head of *ForSequenceClassification / *ForTokenClassification (no output embeddings)
        if is_output_head or "lm_head" in segments or "predictions" in segments or segments[0] in _HEAD_WORDS:
            return Role.LM_HEAD
        if "*" not in name and _INDEX.search(name) is None:
            return Role.OTHER
        return Role.ATTENTION if _ATTENTION_WORDS & set(segments) else Role.MLP
    return Role.OTHER


def _features(module: Any, param: Any, kind: Kind) -> tuple[int, int]:
    from transformers.pytorch_utils import Conv1D

    if kind is Kind.OTHER and param.dim() == 2 and type(module).__name__.endswith("Router"):
        # A bare (experts, hidden) router weight used as F.linear(x, weight): hidden -> experts.
        return int(param.shape[1]), int(param.shape[0])
    if kind is Kind.FUSED_EXPERTS:
        # (experts, out, in) as peft's lora.ParamWrapper reads a non-transposed 3-D expert tensor; (experts, in,
        # out) for a class marked is_transposed (gpt-oss; peft 0.21 tuners/lora/layer.py ParamWrapper.update_layer)
        if getattr(module, "is_transposed", False):
            return int(param.shape[1]), int(param.shape[2])
        return int(param.shape[2]), int(param.shape[1])
    if kind is Kind.LINEAR:
        if isinstance(module, Conv1D):
            return int(module.weight.shape[0]), int(module.nf)
        return int(module.in_features), int(module.out_features)
    return 0, 0


def _auto_class(config: Mapping[str, object], task: str | None = None) -> Any:
    """The Auto class of ``task`` (seq-cls, token-cls, image-text-to-text); else AutoModelForMaskedLM when the
    checkpoint's architecture is a masked LM (BERT-like), else causal LM."""
    import transformers

    task_class = {
        "seq-cls": transformers.AutoModelForSequenceClassification,
        "token-cls": transformers.AutoModelForTokenClassification,
        "image-text-to-text": transformers.AutoModelForImageTextToText,
    }.get(task or "")
    if task_class is not None:
        return task_class

    archs = config.get("architectures")
    first = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    model_type = str(config.get("model_type", ""))
    causal = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = transformers.models.auto.modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if first.endswith("ForMaskedLM") or (model_type in masked and model_type not in causal):
        return transformers.AutoModelForMaskedLM
    if model_type in causal:
        return transformers.AutoModelForCausalLM
    return transformers.AutoModel


def build_meta_model(config: Mapping[str, object], task: str | None = None) -> Any:
    """The transformers model for ``config`` on the meta device (no memory, no remote code).

    Raises:
        UnsupportedModelError: transformers does not know the ``model_type`` (remote-code architectures), or
            cannot build it.
    """
    import torch
    from transformers import CONFIG_MAPPING

    model_type = str(config.get("model_type", ""))
    if model_type not in CONFIG_MAPPING:
        remote = (
            " It declares auto_map (remote code), which fitcheck never runs." if "auto_map" in config else ""
        )
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not built into the installed transformers.{remote} "
            "Pass the config.json of an architecture transformers ships, or upgrade transformers."
        )
    # auto_map would point at remote code; quantization_config is reported by the inventory, not applied here
    # (the meta model is the unquantized architecture; quantized bytes are computed from QuantSpec).
    clean = {k: v for k, v in config.items() if k not in ("auto_map", "quantization_config")}
    try:
        cfg = CONFIG_MAPPING[model_type].from_dict(clean)
        with torch.device("meta"):
            return _auto_class(config, task).from_config(cfg, trust_remote_code=False)
    except (ValueError, TypeError, KeyError, AttributeError, RuntimeError, AssertionError) as exc:
        raise UnsupportedModelError(
            f"transformers could not build model_type {model_type!r} from this config.json: {exc}"
        ) from exc


def _collapse(model: Any) -> tuple[list[ParamEntry], int]:
    """Entries with the first layer index replaced by ``*``.

    A name is collapsed only when every index of its layer list has it with the same shape; otherwise (MoE
    every other layer, a dense layer among sparse ones) each instance keeps its index, so layer-selective
    training (``layers_to_transform``, first-k-layers freezing) still sees where each tensor lives.
    """
    modules = dict(model.named_modules())
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    groups: dict[str, list[tuple[str, Any, Any]]] = {}
    indices: dict[str, set[str]] = {}  # layer-list prefix -> every index seen under it
    for name, param in model.named_parameters():  # default remove_duplicate=True: tied tensors once
        module_path, _, _ = name.rpartition(".")
        pattern = _INDEX.sub(".*.", name, count=1)
        match = _INDEX.search(name)
        if match is not None:
            indices.setdefault(name[: match.start()], set()).add(match.group(1))
        groups.setdefault(pattern, []).append((name, param, modules[module_path]))
    entries: list[ParamEntry] = []
    max_repeat = 0
    for pattern, members in groups.items():
        shapes = {tuple(p.shape) for _, p, _ in members}
        full = "*" not in pattern or len(members) == len(indices[pattern.split(".*.", 1)[0]])
        collapse = len(shapes) == 1 and full
        rows = [(pattern, members)] if collapse else [(n, [(n, p, m)]) for n, p, m in members]
        for entry_name, group in rows:
            _, param, module = group[0]
            param_name = entry_name.rsplit(".", 1)[-1]
            kind = _kind(module, param_name, param.dim())
            in_f, out_f = _features(module, param, kind)
            entries.append(
                ParamEntry(
                    name=entry_name,
                    shape=tuple(int(d) for d in param.shape),
                    role=_role(entry_name, module, kind, output is not None and module is output),
                    kind=kind,
                    repeat=len(group),
                    module=entry_name.split(".")[-2] if "." in entry_name else "",
                    in_features=in_f,
                    out_features=out_f,
                )
            )
            max_repeat = max(max_repeat, len(group) if "*" in entry_name else 0)
    return entries, max_repeat


def _shape(model: Any, config: Mapping[str, object], layers_seen: int) -> ModelShape:
    cfg = model.config
    view = ConfigView(config)
    # composite (vision-language) configs keep the language model's widths in text_config (transformers 5.23
    # configuration_utils.py get_text_config; Qwen2_5_VLConfig has no top-level num_attention_heads)
    text = cfg.get_text_config(decoder=True)

    def attr(*names: str) -> int:
        for n in names:
            for owner in (text, cfg):
                value = getattr(owner, n, None)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
        return 0

    embed = model.get_input_embeddings()
    hidden = attr("hidden_size", "d_model", "n_embd") or int(embed.embedding_dim)
    heads = attr("num_attention_heads", "n_head", "num_heads") or 1
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    layer_class = next((n for n in no_split if "Layer" in n or "Block" in n), no_split[0] if no_split else "")
    experts = attr("num_local_experts", "num_experts", "n_routed_experts")
    tied_flag = getattr(cfg, "tie_word_embeddings", False)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = bool(tied_flag) and output is not None and output.weight is embed.weight
    gated = any(n.endswith(_GATED_SUFFIXES) for n, _ in model.named_parameters())
    return ModelShape(
        family=str(config.get("model_type", "")),
        architecture=type(model).__name__,
        hidden_size=hidden,
        num_layers=attr("num_hidden_layers", "n_layer", "num_layers") or max(layers_seen, 1),
        num_heads=heads,
        num_kv_heads=_kv_heads(model) or attr("num_key_value_heads", "num_kv_heads") or heads,
        head_dim=attr("head_dim") or max(hidden // heads, 1),
        # MoE: the per-expert width (Qwen3-MoE / DeepSeek moe_intermediate_size; Mixtral's intermediate_size is it)
        intermediate_size=(attr("moe_intermediate_size") if experts else 0)
        or attr("intermediate_size", "n_inner", "ffn_hidden_size") or 4 * hidden,
        vocab_size=attr("vocab_size") or int(embed.num_embeddings),
        max_position_embeddings=attr("max_position_embeddings", "n_positions", "seq_length"),
        mlp_activation=mlp_kind(_activation(model), gated=gated),
        norm="rmsnorm" if any("RMSNorm" in type(m).__name__ for m in model.modules()) else "layernorm",
        num_experts=experts,
        experts_per_token=attr("num_experts_per_tok", "top_k", "moe_top_k") if experts else 0,
        tied_embeddings=tied,
        sliding_window=attr("sliding_window") or None,
        causal_lm=not type(model).__name__.endswith("ForMaskedLM"),
        config_dtype=view.config_dtype(),
        no_split_module=layer_class,
        parallel_attn=_parallel_block(model, layer_class),
        partial_rotary_factor=_partial_rotary(cfg),
        traits=traits_of(config),
    )


def meta_inventory(
    config: Mapping[str, object], model_id: str, source: str, task: str | None = None
) -> ModelInventory:
    """Inventory of any architecture transformers ships, counted on the meta device.

    Args:
        config: The parsed config.json.
        model_id: What the user asked for.
        source: Where the config came from.

    Returns:
        The inventory (``counted_by="meta"``). Tied tensors appear once; the ``ModelShape`` numbers come from
        the transformers config object, with the model's modules as fallback.

    Raises:
        UnsupportedModelError: The architecture is not built into transformers or cannot be built.
    """
    model = build_meta_model(config, task)
    entries, layers_seen = _collapse(model)
    quant = config.get("quantization_config")
    return ModelInventory(
        model_id=model_id,
        shape=_shape(model, config, layers_seen),
        params=tuple(entries),
        source=source,
        counted_by="meta",
        quantization_config=quant if isinstance(quant, Mapping) else None,
        config=dict(config),
    )
