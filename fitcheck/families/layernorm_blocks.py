"""The shape of a LayerNorm-family inventory (GPT-2, BERT, Phi, Falcon, BLOOM).

Pure: no torch, no file reads.
"""

from __future__ import annotations

from fitcheck.families.base import ConfigView, mlp_kind
from fitcheck.spec import ModelShape

__all__ = ["dropout_prob", "layernorm_shape"]


def layernorm_shape(
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


def dropout_prob(cfg: ConfigView, key: str, default: float) -> float:
    """A dropout probability from config.json, the config class's default when absent or not a number."""
    value = cfg.get(key, default)
    return float(value) if isinstance(value, (int, float)) else default
