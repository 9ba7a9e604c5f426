"""Hand-built parameter inventories for the model-state tests (no tests here).

They mirror transformers 5.23's parameter names and shapes (``LlamaForCausalLM``, ``MixtralForCausalLM`` with
fused 3-D experts and a ``MixtralTopKRouter`` whose ``weight`` is not an ``nn.Linear``). Their totals are
pinned to
the meta-device counts in design note 04 by ``tests/test_model_states.py`` and, when torch is installed, to
``from_config`` on the meta device by ``tests/test_torch_model_states.py``.
"""

from __future__ import annotations

from fitcheck.families import traits_of_type
from fitcheck.spec import Kind, ModelInventory, ModelShape, ParamEntry, Role


def _linear(name: str, out_f: int, in_f: int, role: Role, layers: int = 1) -> ParamEntry:
    module = name.rsplit(".", 2)[-2]
    return ParamEntry(name, (out_f, in_f), role, Kind.LINEAR, layers, module, in_f, out_f)


_LAYER = "model.layers.*."


def _embedding(vocab: int, hidden: int) -> ParamEntry:
    return ParamEntry("model.embed_tokens.weight", (vocab, hidden), Role.EMBEDDING, Kind.EMBEDDING, 1, "embed_tokens")


def _attention(hidden: int, kv: int, layers: int) -> list[ParamEntry]:
    """q/k/v/o projections of ``layers`` Llama-style attention blocks (no biases)."""
    return [
        _linear(_LAYER + "self_attn.q_proj.weight", hidden, hidden, Role.ATTENTION, layers),
        _linear(_LAYER + "self_attn.k_proj.weight", kv, hidden, Role.ATTENTION, layers),
        _linear(_LAYER + "self_attn.v_proj.weight", kv, hidden, Role.ATTENTION, layers),
        _linear(_LAYER + "self_attn.o_proj.weight", hidden, hidden, Role.ATTENTION, layers),
    ]


def _norms(hidden: int, layers: int) -> list[ParamEntry]:
    """The two RMSNorms of each of ``layers`` decoder layers, then the final ``model.norm``."""
    return [
        ParamEntry(_LAYER + "input_layernorm.weight", (hidden,), Role.NORM, Kind.NORM, layers, "input_layernorm"),
        ParamEntry(
            _LAYER + "post_attention_layernorm.weight", (hidden,), Role.NORM, Kind.NORM, layers,
            "post_attention_layernorm",
        ),
        ParamEntry("model.norm.weight", (hidden,), Role.NORM, Kind.NORM, 1, "norm"),
    ]


def llama_like(
    *,
    vocab: int = 128256,
    hidden: int = 4096,
    layers: int = 32,
    heads: int = 32,
    kv_heads: int = 8,
    intermediate: int = 14336,
    tied: bool = False,
    model_id: str = "meta-llama/Meta-Llama-3-8B",
) -> ModelInventory:
    """A Llama-family inventory (defaults: Llama-3-8B)."""
    head_dim = hidden // heads
    p = _LAYER
    params = [
        _embedding(vocab, hidden),
        *_attention(hidden, kv_heads * head_dim, layers),
        _linear(p + "mlp.gate_proj.weight", intermediate, hidden, Role.MLP, layers),
        _linear(p + "mlp.up_proj.weight", intermediate, hidden, Role.MLP, layers),
        _linear(p + "mlp.down_proj.weight", hidden, intermediate, Role.MLP, layers),
        *_norms(hidden, layers),
    ]
    if not tied:
        params.append(_linear("lm_head.weight", vocab, hidden, Role.LM_HEAD))
    shape = ModelShape(
        family="llama",
        traits=traits_of_type("llama"),
        architecture="LlamaForCausalLM",
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tied_embeddings=tied,
        no_split_module="LlamaDecoderLayer",
    )
    return ModelInventory(model_id, shape, tuple(params), source="hand-built (tests)")


def mixtral_like(
    *,
    vocab: int = 32000,
    hidden: int = 4096,
    layers: int = 32,
    heads: int = 32,
    kv_heads: int = 8,
    intermediate: int = 14336,
    experts: int = 8,
    model_id: str = "mistralai/Mixtral-8x7B-v0.1",
) -> ModelInventory:
    """A Mixtral inventory as transformers 5 builds it (defaults: Mixtral-8x7B)."""
    head_dim = hidden // heads
    p = _LAYER
    params = [
        _embedding(vocab, hidden),
        *_attention(hidden, kv_heads * head_dim, layers),
        ParamEntry(p + "mlp.gate.weight", (experts, hidden), Role.ROUTER, Kind.OTHER, layers, "gate"),
        ParamEntry(
            p + "mlp.experts.gate_up_proj",
            (experts, 2 * intermediate, hidden),
            Role.EXPERTS,
            Kind.FUSED_EXPERTS,
            layers,
            "experts",
        ),
        ParamEntry(
            p + "mlp.experts.down_proj",
            (experts, hidden, intermediate),
            Role.EXPERTS,
            Kind.FUSED_EXPERTS,
            layers,
            "experts",
        ),
        *_norms(hidden, layers),
        _linear("lm_head.weight", vocab, hidden, Role.LM_HEAD),
    ]
    shape = ModelShape(
        family="mixtral",
        traits=traits_of_type("mixtral"),
        architecture="MixtralForCausalLM",
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        num_experts=experts,
        experts_per_token=2,
        no_split_module="MixtralDecoderLayer",
    )
    return ModelInventory(model_id, shape, tuple(params), source="hand-built (tests)")


def catalog(model_id: str) -> ModelInventory:
    """The inventory from the reader (``fitcheck.readers.model_config``), else the hand-built one."""
    try:
        from fitcheck.readers.model_config import load_inventory
    except ImportError:  # pragma: no cover - before the reader existed
        return mixtral_like() if "mixtral" in model_id.lower() else llama_like()
    return load_inventory(model_id, env={})
