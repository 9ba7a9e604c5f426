"""Building blocks of the Llama-shaped decoder inventories: attention, gated MLP, norms, experts, the shape.

Shared by the RMSNorm decoder families (:mod:`.llama`, :mod:`.mistral`, :mod:`.qwen`, :mod:`.gemma`, ...);
each mirrors the ``__init__`` of the transformers 5.23 modules it names. Pure: no torch, no file reads.
"""

from __future__ import annotations

from fitcheck.families.base import ConfigView, Inventory, InventoryBuilder, mlp_kind
from fitcheck.spec import Kind, ModelShape, Role

__all__ = [
    "LAYER",
    "PRE_POST",
    "attention_linears",
    "decoder_shape",
    "fused_experts",
    "gated_mlp",
    "head_dim_of",
    "kv_heads",
    "layer_norms",
    "llama_like",
    "router",
]

LAYER = "model.layers.*"


def head_dim_of(cfg: ConfigView, hidden: int, heads: int, default: int | None = None) -> int:
    """``head_dim`` from the config, else the class default, else hidden // heads (modeling_*.py)."""
    return cfg.opt_int("head_dim") or default or hidden // heads


def attention_linears(
    b: InventoryBuilder,
    hidden: int,
    heads: int,
    kv: int,
    head_dim: int,
    layers: int,
    *,
    qkv_bias: bool,
    o_bias: bool,
) -> None:
    """q/k/v/o projections of ``<Family>Attention`` (GQA: k/v have ``kv * head_dim`` outputs)."""
    att = f"{LAYER}.self_attn"
    b.linear(f"{att}.q_proj", hidden, heads * head_dim, Role.ATTENTION, bias=qkv_bias, repeat=layers)
    b.linear(f"{att}.k_proj", hidden, kv * head_dim, Role.ATTENTION, bias=qkv_bias, repeat=layers)
    b.linear(f"{att}.v_proj", hidden, kv * head_dim, Role.ATTENTION, bias=qkv_bias, repeat=layers)
    b.linear(f"{att}.o_proj", heads * head_dim, hidden, Role.ATTENTION, bias=o_bias, repeat=layers)


def gated_mlp(b: InventoryBuilder, hidden: int, inter: int, layers: int, *, bias: bool) -> None:
    """gate_proj / up_proj / down_proj of ``<Family>MLP``."""
    mlp = f"{LAYER}.mlp"
    b.linear(f"{mlp}.gate_proj", hidden, inter, Role.MLP, bias=bias, repeat=layers)
    b.linear(f"{mlp}.up_proj", hidden, inter, Role.MLP, bias=bias, repeat=layers)
    b.linear(f"{mlp}.down_proj", inter, hidden, Role.MLP, bias=bias, repeat=layers)


def layer_norms(b: InventoryBuilder, hidden: int, layers: int, names: tuple[str, ...]) -> None:
    for name in names:
        b.norm(f"{LAYER}.{name}", hidden, bias=False, repeat=layers)


def decoder_shape(
    cfg: ConfigView,
    *,
    architecture: str,
    no_split: str,
    hidden: int,
    layers: int,
    heads: int,
    kv: int,
    head_dim: int,
    inter: int,
    vocab: int,
    tied: bool,
    max_pos_default: int,
    activation: str,
    sliding_window: int | None = None,
    experts: int = 0,
    top_k: int = 0,
    partial_rotary: float = 1.0,
) -> ModelShape:
    return ModelShape(
        family=cfg.model_type,
        architecture=architecture,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=cfg.get_int("max_position_embeddings", default=max_pos_default),
        mlp_activation=mlp_kind(activation, gated=True),
        norm="rmsnorm",
        num_experts=experts,
        experts_per_token=top_k,
        tied_embeddings=tied,
        sliding_window=sliding_window,
        causal_lm=True,
        config_dtype=cfg.config_dtype(),
        no_split_module=no_split,
        parallel_attn=False,
        partial_rotary_factor=partial_rotary,
    )


def llama_like(
    cfg: ConfigView,
    *,
    prefix: str,
    vocab_default: int,
    hidden_default: int,
    inter_default: int,
    layers_default: int,
    heads_default: int,
    kv_default: int | None,
    head_dim_default: int | None,
    max_pos_default: int,
    tie_default: bool,
    qkv_bias: bool,
    o_bias: bool,
    mlp_bias: bool,
    norms: tuple[str, ...],
    act_keys: tuple[str, ...] = ("hidden_act",),
    act_default: str = "silu",
    sliding_window: int | None = None,
) -> Inventory:
    """The Llama-shaped decoder (embed, N x [attention, gated MLP, RMSNorms], final norm, lm_head)."""
    vocab = cfg.get_int("vocab_size", default=vocab_default)
    hidden = cfg.get_int("hidden_size", default=hidden_default)
    inter = cfg.get_int("intermediate_size", default=inter_default)
    layers = cfg.get_int("num_hidden_layers", default=layers_default)
    heads = cfg.get_int("num_attention_heads", default=heads_default)
    # Absent key -> the config class default; explicit null -> num_attention_heads (each class __post_init__).
    kv_present = cfg.present("num_key_value_heads")
    kv = cfg.opt_int("num_key_value_heads") or (heads if kv_present or kv_default is None else kv_default)
    head_dim = head_dim_of(cfg, hidden, heads, head_dim_default)
    tied = cfg.get_bool("tie_word_embeddings", default=tie_default)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    attention_linears(b, hidden, heads, kv, head_dim, layers, qkv_bias=qkv_bias, o_bias=o_bias)
    gated_mlp(b, hidden, inter, layers, bias=mlp_bias)
    layer_norms(b, hidden, layers, norms)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = decoder_shape(
        cfg,
        architecture=f"{prefix}ForCausalLM",
        no_split=f"{prefix}DecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos_default=max_pos_default,
        activation=cfg.get_str(*act_keys, default=act_default),
        sliding_window=sliding_window,
    )
    return b.params, shape


PRE_POST = ("input_layernorm", "post_attention_layernorm")


def kv_heads(cfg: ConfigView, heads: int, default: int | None) -> int:
    """num_key_value_heads: absent -> the class default; explicit null (or no default) -> num_attention_heads."""
    value = cfg.opt_int("num_key_value_heads")
    if value:
        return value
    return heads if cfg.present("num_key_value_heads") or default is None else default


def fused_experts(b: InventoryBuilder, prefix: str, experts: int, hidden: int, inter: int, *, repeat: int,
             transposed: bool = False, bias: bool = False) -> None:
    """Fused 3-D expert tensors (transformers 5 ``<Family>Experts``).

    ``in_features`` / ``out_features`` are one expert's matmul (peft 0.21 ``lora.ParamWrapper``): stored
    ``(E, out, in)``, or ``(E, in, out)`` for a transposed class (gpt-oss ``is_transposed=True``).
    """
    gate_up = (experts, hidden, 2 * inter) if transposed else (experts, 2 * inter, hidden)
    down = (experts, inter, hidden) if transposed else (experts, hidden, inter)
    b.add(f"{prefix}.gate_up_proj", gate_up, Role.EXPERTS, Kind.FUSED_EXPERTS, repeat=repeat,
          in_features=hidden, out_features=2 * inter)
    if bias:
        b.add(f"{prefix}.gate_up_proj_bias", (experts, 2 * inter), Role.EXPERTS, Kind.OTHER, repeat=repeat)
    b.add(f"{prefix}.down_proj", down, Role.EXPERTS, Kind.FUSED_EXPERTS, repeat=repeat,
          in_features=inter, out_features=hidden)
    if bias:
        b.add(f"{prefix}.down_proj_bias", (experts, hidden), Role.EXPERTS, Kind.OTHER, repeat=repeat)


def router(b: InventoryBuilder, name: str, experts: int, hidden: int, *, repeat: int, bias: bool = False) -> None:
    """A ``<Family>TopKRouter``: a bare ``(E, h)`` weight used as ``F.linear`` (bitsandbytes leaves it alone)."""
    b.add(f"{name}.weight", (experts, hidden), Role.ROUTER, Kind.OTHER, repeat=repeat,
          in_features=hidden, out_features=experts)
    if bias:
        b.add(f"{name}.bias", (experts,), Role.ROUTER, Kind.BIAS, repeat=repeat)
