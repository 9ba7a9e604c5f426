"""Pure-Python inventories of the LayerNorm families: Phi (phi-2), GPT-2, BERT, Falcon, BLOOM.

Each function mirrors the ``__init__`` of the transformers 5.23 classes and the defaults of its config class;
options the mirror does not cover (cross-attention) raise :class:`NotPureFamilyError` so the caller falls
back to ``from_config`` on the meta device.
"""

from __future__ import annotations

from fitcheck.readers.families_base import ConfigView, InventoryBuilder, NotPureFamilyError, mlp_kind
from fitcheck.spec import Kind, ModelShape, ParamEntry, Role

Family = tuple[list[ParamEntry], ModelShape]


def _shape(
    cfg: ConfigView,
    *,
    architecture: str,
    no_split: str,
    hidden: int,
    layers: int,
    heads: int,
    kv: int,
    inter: int,
    vocab: int,
    tied: bool,
    max_pos: int,
    activation: str,
    causal_lm: bool = True,
    parallel_attn: bool = False,
    partial_rotary: float = 1.0,
    head_dim: int | None = None,
) -> ModelShape:
    return ModelShape(
        family=cfg.model_type,
        architecture=architecture,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim or hidden // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        mlp_activation=mlp_kind(activation, gated=False),
        norm="layernorm",
        tied_embeddings=tied,
        causal_lm=causal_lm,
        config_dtype=cfg.config_dtype(),
        no_split_module=no_split,
        parallel_attn=parallel_attn,
        partial_rotary_factor=partial_rotary,
    )


def phi(cfg: ConfigView) -> Family:
    """PhiForCausalLM (phi-1/1.5/2): biased q/k/v/dense and fc1/fc2, one LayerNorm per parallel block,
    optional q/k LayerNorms, ``lm_head`` with a bias (modeling_phi.py)."""
    vocab = cfg.get_int("vocab_size", default=51200)
    hidden = cfg.get_int("hidden_size", default=2048)
    inter = cfg.get_int("intermediate_size", default=8192)
    layers = cfg.get_int("num_hidden_layers", default=24)
    heads = cfg.get_int("num_attention_heads", default=32)
    kv = cfg.opt_int("num_key_value_heads") or heads
    head_dim = cfg.opt_int("head_dim") or hidden // heads
    tied = cfg.get_bool("tie_word_embeddings", default=False)
    lay = "model.layers.*"
    b = InventoryBuilder()
    b.embedding("model.embed_tokens", vocab, hidden)
    b.linear(f"{lay}.self_attn.q_proj", hidden, heads * head_dim, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.self_attn.k_proj", hidden, kv * head_dim, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.self_attn.v_proj", hidden, kv * head_dim, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.self_attn.dense", heads * head_dim, hidden, Role.ATTENTION, bias=True, repeat=layers)
    if cfg.get_bool("qk_layernorm", default=False):
        # nn.LayerNorm(hidden_size // num_attention_heads) in PhiAttention, not head_dim.
        b.norm(f"{lay}.self_attn.q_layernorm", hidden // heads, bias=True, repeat=layers)
        b.norm(f"{lay}.self_attn.k_layernorm", hidden // heads, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.fc1", hidden, inter, Role.MLP, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.fc2", inter, hidden, Role.MLP, bias=True, repeat=layers)
    b.norm(f"{lay}.input_layernorm", hidden, bias=True, repeat=layers)
    b.norm("model.final_layernorm", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied, bias=True)
    shape = _shape(
        cfg,
        architecture="PhiForCausalLM",
        no_split="PhiDecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos=cfg.get_int("max_position_embeddings", default=2048),
        activation=cfg.get_str("hidden_act", default="gelu_new"),
        parallel_attn=True,
        partial_rotary=cfg.partial_rotary_factor(0.5),
        head_dim=head_dim,
    )
    return b.params, shape


def gpt2(cfg: ConfigView) -> Family:
    """GPT2LMHeadModel: learned positions, Conv1D projections (weights stored ``(in, out)``), tied head."""
    if cfg.get_bool("add_cross_attention", default=False):
        raise NotPureFamilyError("gpt2 with add_cross_attention")
    vocab = cfg.get_int("vocab_size", default=50257)
    hidden = cfg.get_int("n_embd", "hidden_size", default=768)
    layers = cfg.get_int("n_layer", "num_hidden_layers", default=12)
    heads = cfg.get_int("n_head", "num_attention_heads", default=12)
    positions = cfg.get_int("n_positions", "max_position_embeddings", default=1024)
    inter = cfg.opt_int("n_inner") or 4 * hidden
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    lay = "transformer.h.*"
    b = InventoryBuilder()
    b.embedding("transformer.wte", vocab, hidden)
    b.embedding("transformer.wpe", positions, hidden, Role.POSITION)
    b.norm(f"{lay}.ln_1", hidden, bias=True, repeat=layers)
    b.conv1d(f"{lay}.attn.c_attn", hidden, 3 * hidden, Role.ATTENTION, repeat=layers)
    b.conv1d(f"{lay}.attn.c_proj", hidden, hidden, Role.ATTENTION, repeat=layers)
    b.norm(f"{lay}.ln_2", hidden, bias=True, repeat=layers)
    b.conv1d(f"{lay}.mlp.c_fc", hidden, inter, Role.MLP, repeat=layers)
    b.conv1d(f"{lay}.mlp.c_proj", inter, hidden, Role.MLP, repeat=layers)
    b.norm("transformer.ln_f", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(
        cfg,
        architecture="GPT2LMHeadModel",
        no_split="GPT2Block",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=heads,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos=positions,
        activation=cfg.get_str("activation_function", default="gelu_new"),
    )
    return b.params, shape


def bert(cfg: ConfigView) -> Family:
    """BertForMaskedLM, the class BERT checkpoints name in ``architectures`` and the MLM fine-tuning class.

    No pooler (``BertModel(config, add_pooling_layer=False)``); the MLM decoder weight is tied to the word
    embeddings and its bias to ``cls.predictions.bias`` unless ``tie_word_embeddings`` is false, in which case
    transformers 5 unties both (modeling_bert.py ``_tied_weights_keys``). Sequence-classification fine-tunes
    (BertForSequenceClassification) have a pooler and classifier instead of the MLM head: about the same size.
    """
    if cfg.get_bool("add_cross_attention", default=False):
        raise NotPureFamilyError("bert with add_cross_attention")
    vocab = cfg.get_int("vocab_size", default=30522)
    hidden = cfg.get_int("hidden_size", default=768)
    layers = cfg.get_int("num_hidden_layers", default=12)
    heads = cfg.get_int("num_attention_heads", default=12)
    inter = cfg.get_int("intermediate_size", default=3072)
    positions = cfg.get_int("max_position_embeddings", default=512)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    emb, lay, head = "bert.embeddings", "bert.encoder.layer.*", "cls.predictions"
    b = InventoryBuilder()
    b.embedding(f"{emb}.word_embeddings", vocab, hidden)
    b.embedding(f"{emb}.position_embeddings", positions, hidden, Role.POSITION)
    b.embedding(f"{emb}.token_type_embeddings", cfg.get_int("type_vocab_size", default=2), hidden)
    b.norm(f"{emb}.LayerNorm", hidden, bias=True)
    for proj in ("query", "key", "value"):
        b.linear(f"{lay}.attention.self.{proj}", hidden, hidden, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.attention.output.dense", hidden, hidden, Role.ATTENTION, bias=True, repeat=layers)
    b.norm(f"{lay}.attention.output.LayerNorm", hidden, bias=True, repeat=layers)
    b.linear(f"{lay}.intermediate.dense", hidden, inter, Role.MLP, bias=True, repeat=layers)
    b.linear(f"{lay}.output.dense", inter, hidden, Role.MLP, bias=True, repeat=layers)
    b.norm(f"{lay}.output.LayerNorm", hidden, bias=True, repeat=layers)
    b.add(f"{head}.bias", (vocab,), Role.BIAS, Kind.BIAS)
    b.linear(f"{head}.transform.dense", hidden, hidden, Role.LM_HEAD, bias=True)
    b.norm(f"{head}.transform.LayerNorm", hidden, bias=True)
    if not tied:
        b.linear(f"{head}.decoder", hidden, vocab, Role.LM_HEAD, bias=True)
    shape = _shape(
        cfg,
        architecture="BertForMaskedLM",
        no_split="BertLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=heads,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos=positions,
        activation=cfg.get_str("hidden_act", default="gelu"),
        causal_lm=False,
    )
    return b.params, shape


def falcon(cfg: ConfigView) -> Family:
    """FalconForCausalLM: fused query_key_value sized by new_decoder_architecture / multi_query, parallel
    attention with one or two LayerNorms (modeling_falcon.py FalconAttention, FalconDecoderLayer)."""
    vocab = cfg.get_int("vocab_size", default=65024)
    hidden = cfg.get_int("n_embed", "hidden_size", default=4544)  # FalconConfig.__post_init__: n_embed wins
    layers = cfg.get_int("num_hidden_layers", default=32)
    heads = cfg.get_int("num_attention_heads", default=71)
    new_arch = cfg.get_bool("new_decoder_architecture", default=False)
    multi_query = cfg.get_bool("multi_query", default=True)
    parallel = cfg.get_bool("parallel_attn", default=True)
    bias = cfg.get_bool("bias", default=False)
    kv_config = cfg.opt_int("num_kv_heads") or heads
    head_dim = hidden // heads
    if new_arch:
        qkv_out, kv = (2 * kv_config + heads) * head_dim, kv_config
    elif multi_query:
        qkv_out, kv = hidden + 2 * head_dim, 1
    else:
        qkv_out, kv = 3 * hidden, heads
    ffn = cfg.opt_int("ffn_hidden_size") or 4 * hidden
    n_ln = cfg.opt_int("num_ln_in_parallel_attn") or (2 if new_arch else None)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    lay = "transformer.h.*"
    b = InventoryBuilder()
    b.embedding("transformer.word_embeddings", vocab, hidden)
    b.linear(
        f"{lay}.self_attention.query_key_value", hidden, qkv_out, Role.ATTENTION, bias=bias, repeat=layers
    )
    b.linear(f"{lay}.self_attention.dense", hidden, hidden, Role.ATTENTION, bias=bias, repeat=layers)
    b.linear(f"{lay}.mlp.dense_h_to_4h", hidden, ffn, Role.MLP, bias=bias, repeat=layers)
    b.linear(f"{lay}.mlp.dense_4h_to_h", ffn, hidden, Role.MLP, bias=bias, repeat=layers)
    if not parallel:
        norms: tuple[str, ...] = ("post_attention_layernorm", "input_layernorm")
    elif n_ln == 2:
        norms = ("ln_attn", "ln_mlp")
    else:
        norms = ("input_layernorm",)
    for name in norms:
        b.norm(f"{lay}.{name}", hidden, bias=True, repeat=layers)
    b.norm("transformer.ln_f", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(
        cfg,
        architecture="FalconForCausalLM",
        no_split="FalconDecoderLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=kv,
        inter=ffn,
        vocab=vocab,
        tied=tied,
        max_pos=cfg.get_int("max_position_embeddings", default=2048),
        activation=cfg.get_str("activation", default="gelu"),
        parallel_attn=parallel,
    )
    return b.params, shape


def bloom(cfg: ConfigView) -> Family:
    """BloomForCausalLM: ALiBi (no position table), embedding LayerNorm, biased fused QKV, 4h MLP."""
    vocab = cfg.get_int("vocab_size", default=250880)
    hidden = cfg.get_int("n_embed", "hidden_size", default=64)  # BloomConfig.__post_init__: n_embed wins
    layers = cfg.get_int("n_layer", "num_hidden_layers", default=2)
    heads = cfg.get_int("n_head", "num_attention_heads", default=8)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    lay = "transformer.h.*"
    b = InventoryBuilder()
    b.embedding("transformer.word_embeddings", vocab, hidden)
    b.norm("transformer.word_embeddings_layernorm", hidden, bias=True)
    b.norm(f"{lay}.input_layernorm", hidden, bias=True, repeat=layers)
    b.linear(
        f"{lay}.self_attention.query_key_value", hidden, 3 * hidden, Role.ATTENTION, bias=True, repeat=layers
    )
    b.linear(f"{lay}.self_attention.dense", hidden, hidden, Role.ATTENTION, bias=True, repeat=layers)
    b.norm(f"{lay}.post_attention_layernorm", hidden, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.dense_h_to_4h", hidden, 4 * hidden, Role.MLP, bias=True, repeat=layers)
    b.linear(f"{lay}.mlp.dense_4h_to_h", 4 * hidden, hidden, Role.MLP, bias=True, repeat=layers)
    b.norm("transformer.ln_f", hidden, bias=True)
    b.lm_head(vocab, hidden, tied=tied)
    shape = _shape(
        cfg,
        architecture="BloomForCausalLM",
        no_split="BloomBlock",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=heads,
        inter=4 * hidden,
        vocab=vocab,
        tied=tied,
        # ALiBi has no position table; seq_length is the training length the config declares.
        max_pos=cfg.get_int("seq_length", default=0),
        activation="gelu",
    )
    return b.params, shape
