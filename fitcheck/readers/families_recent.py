"""Pure-Python inventories of the 2025 decoders: Qwen3, Qwen3-MoE, Gemma-3 (text), OLMo-2, gpt-oss, DeepSeek-V3.

Each function mirrors the ``__init__`` of the transformers 5.23 classes (``transformers/models/<family>/
modeling_<family>.py``) and the defaults of its config class (``configuration_<family>.py``); the tests check
every catalog config against ``from_config`` on the meta device, name by name and shape by shape
(tests/test_inventory_meta.py). What the families add over Llama:

- Qwen3 / Gemma-3: ``q_norm`` / ``k_norm`` RMSNorms over ``head_dim`` (modeling_qwen3.py ``Qwen3Attention``).
- OLMo-2: ``q_norm`` / ``k_norm`` over the full q / kv width, norms after attention and MLP, none before.
- Qwen3-MoE / gpt-oss / DeepSeek-V3: fused 3-D experts and a bare router parameter (no ``nn.Linear``).
- gpt-oss: biases everywhere, a per-head attention sink, experts stored transposed ``(E, in, out)`` with biases.
- DeepSeek-V3: Multi-head Latent Attention (low-rank q and kv projections with their norms) and a shared
  expert; the first ``first_k_dense_replace`` layers are dense, so their MLP tensors keep their layer index.
"""

from __future__ import annotations

from fitcheck.readers.families_base import ConfigView, InventoryBuilder, NotPureFamilyError
from fitcheck.readers.families_dense import _attention, _gated_mlp, _layer_norms, _shape
from fitcheck.spec import Kind, ModelShape, ParamEntry, Role

Family = tuple[list[ParamEntry], ModelShape]

_LAYER = "model.layers.*"
_PRE_POST = ("input_layernorm", "post_attention_layernorm")


def _kv(cfg: ConfigView, heads: int, default: int | None) -> int:
    """num_key_value_heads: absent -> the class default; explicit null (or no default) -> num_attention_heads."""
    value = cfg.opt_int("num_key_value_heads")
    if value:
        return value
    return heads if cfg.present("num_key_value_heads") or default is None else default


def _experts(b: InventoryBuilder, prefix: str, experts: int, hidden: int, inter: int, *, repeat: int,
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


def _router(b: InventoryBuilder, name: str, experts: int, hidden: int, *, repeat: int, bias: bool = False) -> None:
    """A ``<Family>TopKRouter``: a bare ``(E, h)`` weight used as ``F.linear`` (bitsandbytes leaves it alone)."""
    b.add(f"{name}.weight", (experts, hidden), Role.ROUTER, Kind.OTHER, repeat=repeat,
          in_features=hidden, out_features=experts)
    if bias:
        b.add(f"{name}.bias", (experts,), Role.ROUTER, Kind.BIAS, repeat=repeat)


def qwen3(cfg: ConfigView) -> Family:
    """Qwen3ForCausalLM: Llama layout, ``head_dim`` default 128, q/k RMSNorms over head_dim (modeling_qwen3.py)."""
    vocab = cfg.get_int("vocab_size", default=151936)
    hidden = cfg.get_int("hidden_size", default=4096)
    inter = cfg.get_int("intermediate_size", default=22016)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = _kv(cfg, heads, 32)
    head_dim = cfg.opt_int("head_dim") or 128
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    _attention(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    _layer_norms(b, head_dim, layers, ("self_attn.q_norm", "self_attn.k_norm"))
    _gated_mlp(b, hidden, inter, layers, bias=False)
    _layer_norms(b, hidden, layers, _PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    # configuration_qwen3.py __post_init__: sliding_window only with use_sliding_window
    window = cfg.opt_int("sliding_window") if cfg.get_bool("use_sliding_window", default=False) else None
    shape = _shape(cfg, architecture="Qwen3ForCausalLM", no_split="Qwen3DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=32768, activation=cfg.get_str("hidden_act", default="silu"),
                   sliding_window=window)
    return b.params, shape


def qwen3_moe(cfg: ConfigView) -> Family:
    """Qwen3MoeForCausalLM: Qwen3 attention; every ``decoder_sparse_step``-th layer not in ``mlp_only_layers``
    is a sparse block (router + fused experts of ``moe_intermediate_size``); ModelShape.intermediate_size is the
    per-expert width, as for Mixtral."""
    vocab = cfg.get_int("vocab_size", default=151936)
    hidden = cfg.get_int("hidden_size", default=2048)
    layers = cfg.get_int("num_hidden_layers", default=24)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = _kv(cfg, heads, 4)
    head_dim = cfg.opt_int("head_dim") or hidden // heads  # Qwen3MoeAttention: getattr(config, "head_dim", h/a)
    experts = cfg.get_int("num_experts", default=128)
    top_k = cfg.get_int("num_experts_per_tok", default=8)
    moe_inter = cfg.get_int("moe_intermediate_size", default=768)
    step = cfg.get_int("decoder_sparse_step", default=1)
    mlp_only = cfg.raw("mlp_only_layers")
    if (isinstance(mlp_only, list) and mlp_only) or step != 1 or experts <= 0:
        raise NotPureFamilyError("dense layers among sparse ones")  # meta keeps their layer indices
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    _attention(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    _layer_norms(b, head_dim, layers, ("self_attn.q_norm", "self_attn.k_norm"))
    _experts(b, f"{_LAYER}.mlp.experts", experts, hidden, moe_inter, repeat=layers)
    _router(b, f"{_LAYER}.mlp.gate", experts, hidden, repeat=layers)
    _layer_norms(b, hidden, layers, _PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    window = cfg.opt_int("sliding_window") if cfg.get_bool("use_sliding_window", default=False) else None
    shape = _shape(cfg, architecture="Qwen3MoeForCausalLM", no_split="Qwen3MoeDecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=moe_inter, vocab=vocab, tied=tied,
                   max_pos_default=32768, activation=cfg.get_str("hidden_act", default="silu"),
                   sliding_window=window, experts=experts, top_k=top_k)
    return b.params, shape


def gemma3_text(cfg: ConfigView) -> Family:
    """Gemma3ForCausalLM (``gemma3_text``): Gemma-2's four norms per layer plus q/k norms over head_dim; local
    (``sliding_window``, default 4096) and global layers interleaved by ``layer_types`` (5 local : 1 global)."""
    vocab = cfg.get_int("vocab_size", default=262_208)
    hidden = cfg.get_int("hidden_size", default=2304)
    inter = cfg.get_int("intermediate_size", default=9216)
    layers = cfg.get_int("num_hidden_layers", default=26)
    heads = cfg.get_int("num_attention_heads", default=8)
    kv = _kv(cfg, heads, 4)
    head_dim = cfg.opt_int("head_dim") or 256
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    _attention(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    _layer_norms(b, head_dim, layers, ("self_attn.q_norm", "self_attn.k_norm"))
    _gated_mlp(b, hidden, inter, layers, bias=False)
    _layer_norms(b, hidden, layers, ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                     "post_feedforward_layernorm"))
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 4096
    shape = _shape(cfg, architecture="Gemma3ForCausalLM", no_split="Gemma3DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=131_072,
                   activation=cfg.get_str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh"),
                   sliding_window=window)
    return b.params, shape


def olmo2(cfg: ConfigView) -> Family:
    """Olmo2ForCausalLM: q/k RMSNorms over the whole q / kv width; post-attention and post-feedforward norms
    only (modeling_olmo2.py ``Olmo2DecoderLayer``)."""
    vocab = cfg.get_int("vocab_size", default=50304)
    hidden = cfg.get_int("hidden_size", default=4096)
    inter = cfg.get_int("intermediate_size", default=11008)
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = _kv(cfg, heads, None)
    head_dim = cfg.opt_int("head_dim") or hidden // heads
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    _attention(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    b.norm(f"{_LAYER}.self_attn.q_norm", heads * head_dim, bias=False, repeat=layers)
    b.norm(f"{_LAYER}.self_attn.k_norm", kv * head_dim, bias=False, repeat=layers)
    _gated_mlp(b, hidden, inter, layers, bias=False)
    _layer_norms(b, hidden, layers, ("post_attention_layernorm", "post_feedforward_layernorm"))
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(cfg, architecture="Olmo2ForCausalLM", no_split="Olmo2DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=2048, activation=cfg.get_str("hidden_act", default="silu"))
    return b.params, shape


def gpt_oss(cfg: ConfigView) -> Family:
    """GptOssForCausalLM: biased q/k/v/o, one attention-sink logit per head (``self_attn.sinks``), a biased
    router, transposed fused experts with biases (modeling_gpt_oss.py). Alternating sliding (128) / full layers.

    The inventory is the logical bf16 model: the checkpoint's MXFP4 expert storage is a QuantSpec matter.
    """
    vocab = cfg.get_int("vocab_size", default=201088)
    hidden = cfg.get_int("hidden_size", default=2880)
    inter = cfg.get_int("intermediate_size", default=2880)
    layers = cfg.get_int("num_hidden_layers", default=36)
    heads = cfg.get_int("num_attention_heads", default=64)
    kv = _kv(cfg, heads, 8)
    head_dim = cfg.opt_int("head_dim") or 64
    experts = cfg.get_int("num_local_experts", default=128)
    top_k = cfg.get_int("num_experts_per_tok", "experts_per_token", default=4)
    bias = cfg.get_bool("attention_bias", default=True)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    b.add(f"{_LAYER}.self_attn.sinks", (heads,), Role.OTHER, Kind.OTHER, repeat=layers)
    _attention(b, hidden, heads, kv, head_dim, layers, qkv_bias=bias, o_bias=bias)
    _router(b, f"{_LAYER}.mlp.router", experts, hidden, repeat=layers, bias=True)
    _experts(b, f"{_LAYER}.mlp.experts", experts, hidden, inter, repeat=layers, transposed=True, bias=True)
    _layer_norms(b, hidden, layers, _PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    window = cfg.opt_int("sliding_window") if cfg.present("sliding_window") else 128
    shape = _shape(cfg, architecture="GptOssForCausalLM", no_split="GptOssDecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=head_dim, inter=inter, vocab=vocab, tied=tied,
                   max_pos_default=131072, activation=cfg.get_str("hidden_act", default="silu"),
                   sliding_window=window, experts=experts, top_k=top_k)
    return b.params, shape


def deepseek_v3(cfg: ConfigView) -> Family:
    """DeepseekV3ForCausalLM: MLA attention, ``first_k_dense_replace`` dense layers then MoE layers with a router,
    fused routed experts and a shared-expert MLP (modeling_deepseek_v3.py). The multi-token-prediction layer of
    the checkpoint is not built by transformers and is not counted.

    ModelShape follows the transformers config: ``head_dim`` = ``qk_rope_head_dim``, ``intermediate_size`` = the
    per-expert width (the dense layers' width is in the inventory).
    """
    vocab = cfg.get_int("vocab_size", default=129280)
    hidden = cfg.get_int("hidden_size", default=7168)
    inter = cfg.get_int("intermediate_size", default=18432)
    moe_inter = cfg.get_int("moe_intermediate_size", default=2048)
    layers = cfg.get_int("num_hidden_layers", default=61)
    heads = cfg.get_int("num_attention_heads", default=128)
    kv = _kv(cfg, heads, 128)
    experts = cfg.get_int("n_routed_experts", default=256)
    shared = cfg.get_int("n_shared_experts", default=1)
    top_k = cfg.get_int("num_experts_per_tok", default=8)
    dense = cfg.get_int("first_k_dense_replace", default=3)
    kv_rank = cfg.get_int("kv_lora_rank", default=512)
    q_rank = cfg.opt_int("q_lora_rank") if cfg.present("q_lora_rank") else 1536
    rope = cfg.get_int("qk_rope_head_dim", default=64)
    nope = cfg.get_int("qk_nope_head_dim", default=128)
    v_dim = cfg.get_int("v_head_dim", default=128)
    bias = cfg.get_bool("attention_bias", default=False)
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    b = InventoryBuilder()
    att = f"{_LAYER}.self_attn"
    b.embedding("model.embed_tokens", vocab, hidden)
    if q_rank is None:
        b.linear(f"{att}.q_proj", hidden, heads * (nope + rope), Role.ATTENTION, bias=False, repeat=layers)
    else:
        b.linear(f"{att}.q_a_proj", hidden, q_rank, Role.ATTENTION, bias=bias, repeat=layers)
        b.norm(f"{att}.q_a_layernorm", q_rank, bias=False, repeat=layers)
        b.linear(f"{att}.q_b_proj", q_rank, heads * (nope + rope), Role.ATTENTION, bias=False, repeat=layers)
    b.linear(f"{att}.kv_a_proj_with_mqa", hidden, kv_rank + rope, Role.ATTENTION, bias=bias, repeat=layers)
    b.norm(f"{att}.kv_a_layernorm", kv_rank, bias=False, repeat=layers)
    b.linear(f"{att}.kv_b_proj", kv_rank, heads * (nope + v_dim), Role.ATTENTION, bias=False, repeat=layers)
    b.linear(f"{att}.o_proj", heads * v_dim, hidden, Role.ATTENTION, bias=bias, repeat=layers)
    n_dense = min(max(dense, 0), layers)
    dense_ids = ["*"] if n_dense == layers else [str(i) for i in range(n_dense)]
    moe_ids = ["*"] if n_dense == 0 else [str(i) for i in range(n_dense, layers)]
    for i in dense_ids if n_dense else []:
        r = layers if i == "*" else 1
        for name, (fin, fout) in (("gate_proj", (hidden, inter)), ("up_proj", (hidden, inter)),
                                  ("down_proj", (inter, hidden))):
            b.linear(f"model.layers.{i}.mlp.{name}", fin, fout, Role.MLP, bias=False, repeat=r)
    for i in moe_ids if n_dense < layers else []:
        r = layers if i == "*" else 1
        _experts(b, f"model.layers.{i}.mlp.experts", experts, hidden, moe_inter, repeat=r)
        _router(b, f"model.layers.{i}.mlp.gate", experts, hidden, repeat=r)
        s_inter = moe_inter * shared
        for name, (fin, fout) in (("gate_proj", (hidden, s_inter)), ("up_proj", (hidden, s_inter)),
                                  ("down_proj", (s_inter, hidden))):
            b.linear(f"model.layers.{i}.mlp.shared_experts.{name}", fin, fout, Role.MLP, bias=False, repeat=r)
    _layer_norms(b, hidden, layers, _PRE_POST)
    b.norm("model.norm", hidden, bias=False)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(cfg, architecture="DeepseekV3ForCausalLM", no_split="DeepseekV3DecoderLayer", hidden=hidden,
                   layers=layers, heads=heads, kv=kv, head_dim=rope, inter=moe_inter, vocab=vocab, tied=tied,
                   max_pos_default=4096, activation=cfg.get_str("hidden_act", default="silu"),
                   experts=experts, top_k=top_k)
    return b.params, shape
