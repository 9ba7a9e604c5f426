"""Pure-Python inventories of the RMSNorm decoders: Llama, Mistral, Mixtral, Qwen2, Gemma, Gemma-2, Phi-3.

Each function mirrors the ``__init__`` of the transformers 5.23 classes (``transformers/models/<family>/
modeling_<family>.py``) and the defaults of its config class (``configuration_<family>.py``); the tests
check every catalog config against ``from_config`` on the meta device, name by name and shape by shape.
"""

from __future__ import annotations

from fitcheck.readers.families_base import ConfigView, InventoryBuilder, mlp_kind
from fitcheck.spec import Kind, ModelShape, ParamEntry, Role

Family = tuple[list[ParamEntry], ModelShape]

_LAYER = "model.layers.*"


def _head_dim(cfg: ConfigView, hidden: int, heads: int, default: int | None = None) -> int:
    """``head_dim`` from the config, else the class default, else hidden // heads (modeling_*.py)."""
    return cfg.opt_int("head_dim") or default or hidden // heads


def _attention(
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
    att = f"{_LAYER}.self_attn"
    b.linear(f"{att}.q_proj", hidden, heads * head_dim, Role.ATTENTION, bias=qkv_bias, repeat=layers)
    b.linear(f"{att}.k_proj", hidden, kv * head_dim, Role.ATTENTION, bias=qkv_bias, repeat=layers)
    b.linear(f"{att}.v_proj", hidden, kv * head_dim, Role.ATTENTION, bias=qkv_bias, repeat=layers)
    b.linear(f"{att}.o_proj", heads * head_dim, hidden, Role.ATTENTION, bias=o_bias, repeat=layers)


def _gated_mlp(b: InventoryBuilder, hidden: int, inter: int, layers: int, *, bias: bool) -> None:
    """gate_proj / up_proj / down_proj of ``<Family>MLP``."""
    mlp = f"{_LAYER}.mlp"
    b.linear(f"{mlp}.gate_proj", hidden, inter, Role.MLP, bias=bias, repeat=layers)
    b.linear(f"{mlp}.up_proj", hidden, inter, Role.MLP, bias=bias, repeat=layers)
    b.linear(f"{mlp}.down_proj", inter, hidden, Role.MLP, bias=bias, repeat=layers)


def _layer_norms(b: InventoryBuilder, hidden: int, layers: int, names: tuple[str, ...]) -> None:
    for name in names:
        b.norm(f"{_LAYER}.{name}", hidden, bias=False, repeat=layers)


def _shape(
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


def _llama_like(
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
) -> Family:
    """The Llama-shaped decoder (embed, N x [attention, gated MLP, RMSNorms], final norm, lm_head)."""
    vocab = cfg.get_int("vocab_size", default=vocab_default)
    hidden = cfg.get_int("hidden_size", default=hidden_default)
    inter = cfg.get_int("intermediate_size", default=inter_default)
    layers = cfg.get_int("num_hidden_layers", default=layers_default)
    heads = cfg.get_int("num_attention_heads", default=heads_default)
    # Absent key -> the config class default; explicit null -> num_attention_heads (each class __post_init__).
    kv_present = cfg.present("num_key_value_heads")
    kv = cfg.opt_int("num_key_value_heads") or (heads if kv_present or kv_default is None else kv_default)
    head_dim = _head_dim(cfg, hidden, heads, head_dim_default)
    tied = cfg.get_bool("tie_word_embeddings", default=tie_default)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    _attention(b, hidden, heads, kv, head_dim, layers, qkv_bias=qkv_bias, o_bias=o_bias)
    _gated_mlp(b, hidden, inter, layers, bias=mlp_bias)
    _layer_norms(b, hidden, layers, norms)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(
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


_PRE_POST = ("input_layernorm", "post_attention_layernorm")


def llama(cfg: ConfigView) -> Family:
    """LlamaForCausalLM (configuration_llama.py defaults; attention_bias / mlp_bias flags)."""
    attention_bias = cfg.get_bool("attention_bias", default=False)
    return _llama_like(
        cfg,
        prefix="Llama",
        vocab_default=32000,
        hidden_default=4096,
        inter_default=11008,
        layers_default=32,
        heads_default=32,
        kv_default=None,
        head_dim_default=None,
        max_pos_default=2048,
        tie_default=False,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=cfg.get_bool("mlp_bias", default=False),
        norms=_PRE_POST,
    )


def mistral(cfg: ConfigView) -> Family:
    """MistralForCausalLM: no biases; sliding_window defaults to 4096 when the key is absent."""
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 4096
    return _llama_like(
        cfg,
        prefix="Mistral",
        vocab_default=32000,
        hidden_default=4096,
        inter_default=14336,
        layers_default=32,
        heads_default=32,
        kv_default=8,
        head_dim_default=None,
        max_pos_default=131072,
        tie_default=False,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        norms=_PRE_POST,
        sliding_window=window,
    )


def qwen2(cfg: ConfigView) -> Family:
    """Qwen2ForCausalLM: q/k/v biases, no o_proj bias; sliding window only with use_sliding_window."""
    window = cfg.opt_int("sliding_window") if cfg.get_bool("use_sliding_window", default=False) else None
    return _llama_like(
        cfg,
        prefix="Qwen2",
        vocab_default=151936,
        hidden_default=4096,
        inter_default=22016,
        layers_default=32,
        heads_default=32,
        kv_default=32,
        head_dim_default=None,
        max_pos_default=32768,
        tie_default=False,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        norms=_PRE_POST,
        sliding_window=window,
    )


def gemma(cfg: ConfigView) -> Family:
    """GemmaForCausalLM: head_dim defaults to 256, tied embeddings by default, GELU-tanh gated MLP."""
    attention_bias = cfg.get_bool("attention_bias", default=False)
    return _llama_like(
        cfg,
        prefix="Gemma",
        vocab_default=256000,
        hidden_default=3072,
        inter_default=24576,
        layers_default=28,
        heads_default=16,
        kv_default=16,
        head_dim_default=256,
        max_pos_default=8192,
        tie_default=True,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=False,
        norms=_PRE_POST,
        act_keys=("hidden_activation", "hidden_act"),
        act_default="gelu_pytorch_tanh",
    )


def gemma2(cfg: ConfigView) -> Family:
    """Gemma2ForCausalLM: four RMSNorms per layer; alternating sliding (default 4096) and global layers."""
    attention_bias = cfg.get_bool("attention_bias", default=False)
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 4096
    return _llama_like(
        cfg,
        prefix="Gemma2",
        vocab_default=256000,
        hidden_default=2304,
        inter_default=9216,
        layers_default=26,
        heads_default=8,
        kv_default=4,
        head_dim_default=256,
        max_pos_default=8192,
        tie_default=True,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=False,
        norms=(
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        act_keys=("hidden_activation", "hidden_act"),
        act_default="gelu_pytorch_tanh",
        sliding_window=window,
    )


def mixtral(cfg: ConfigView) -> Family:
    """MixtralForCausalLM with transformers 5 fused experts.

    ``mlp.gate`` is ``MixtralTopKRouter`` (a bare ``(E, h)`` parameter, not an ``nn.Linear``: bitsandbytes
    does not quantize it); ``mlp.experts`` is ``MixtralExperts`` with 3-D ``gate_up_proj (E, 2I, h)`` and
    ``down_proj (E, h, I)`` (modeling_mixtral.py). ``in_features``/``out_features`` of the expert tensors are
    those of one expert's matmul, as peft's ``ParamWrapper`` reads them.
    """
    vocab = cfg.get_int("vocab_size", default=32000)
    hidden = cfg.get_int("hidden_size", default=4096)
    inter = cfg.get_int("intermediate_size", default=14336)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv_present = cfg.present("num_key_value_heads")
    kv = cfg.opt_int("num_key_value_heads") or (heads if kv_present else 8)
    head_dim = _head_dim(cfg, hidden, heads)
    experts = cfg.get_int("num_local_experts", "num_experts", default=8)
    top_k = cfg.get_int("num_experts_per_tok", default=2)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    _attention(b, hidden, heads, kv, head_dim, layers, qkv_bias=False, o_bias=False)
    b.add(
        f"{_LAYER}.mlp.gate.weight",
        (experts, hidden),
        Role.ROUTER,
        Kind.OTHER,
        repeat=layers,
        in_features=hidden,
        out_features=experts,
    )
    b.add(
        f"{_LAYER}.mlp.experts.gate_up_proj",
        (experts, 2 * inter, hidden),
        Role.EXPERTS,
        Kind.FUSED_EXPERTS,
        repeat=layers,
        in_features=hidden,
        out_features=2 * inter,
    )
    b.add(
        f"{_LAYER}.mlp.experts.down_proj",
        (experts, hidden, inter),
        Role.EXPERTS,
        Kind.FUSED_EXPERTS,
        repeat=layers,
        in_features=inter,
        out_features=hidden,
    )
    _layer_norms(b, hidden, layers, _PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(
        cfg,
        architecture="MixtralForCausalLM",
        no_split="MixtralDecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos_default=131072,
        activation=cfg.get_str("hidden_act", default="silu"),
        sliding_window=cfg.opt_int("sliding_window"),
        experts=experts,
        top_k=top_k,
    )
    return b.params, shape


def phi3(cfg: ConfigView) -> Family:
    """Phi3ForCausalLM: fused ``qkv_proj`` and ``gate_up_proj`` (modeling_phi3.py), no biases."""
    vocab = cfg.get_int("vocab_size", default=32064)
    hidden = cfg.get_int("hidden_size", default=3072)
    inter = cfg.get_int("intermediate_size", default=8192)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = cfg.opt_int("num_key_value_heads") or heads
    head_dim = _head_dim(cfg, hidden, heads)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    att, mlp = f"{_LAYER}.self_attn", f"{_LAYER}.mlp"
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    b.linear(f"{att}.o_proj", heads * head_dim, hidden, Role.ATTENTION, bias=False, repeat=layers)
    b.linear(
        f"{att}.qkv_proj", hidden, (heads + 2 * kv) * head_dim, Role.ATTENTION, bias=False, repeat=layers
    )
    b.linear(f"{mlp}.gate_up_proj", hidden, 2 * inter, Role.MLP, bias=False, repeat=layers)
    b.linear(f"{mlp}.down_proj", inter, hidden, Role.MLP, bias=False, repeat=layers)
    _layer_norms(b, hidden, layers, _PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(
        cfg,
        architecture="Phi3ForCausalLM",
        no_split="Phi3DecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        head_dim=head_dim,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos_default=4096,
        activation=cfg.get_str("hidden_act", default="silu"),
        sliding_window=cfg.opt_int("sliding_window"),
        partial_rotary=cfg.partial_rotary_factor(1.0),
    )
    return b.params, shape
