"""Tiny model configs and TrainingSpecs shared by the trace-vs-formula tests (no tests here).

``family_config`` and ``llama_like_configs`` write the config.json dicts the tests build small real (or fake)
models from; ``spec_from_config`` turns one into the TrainingSpec of a single-process CPU (or CUDA) run;
``trace_spec`` traces the CPU step a spec describes; ``assert_activations_match_trace`` checks the pure
activation formulas against that trace. Each test file keeps its own widths and grids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fitcheck.core.activations.decoder import activation_components
from fitcheck.readers.model_config import inventory_from_config
from fitcheck.report import Phase
from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    DeviceType,
    Dtype,
    HardwareSpec,
    LoraSpec,
    MixedPrecision,
    OptimizerSpec,
    PrecisionSpec,
    QuantSpec,
    TrainingSpec,
)

if TYPE_CHECKING:  # the tracer imports torch: only the functions that trace import it
    from fitcheck.torch_adapters.trace_result import TraceResult

# config.json ``architectures`` of each family's causal-LM head (transformers 5.23 model classes)
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def family_config(family: str, base: Mapping[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A config.json dict of ``family``: ``base`` with ``model_type``/``architectures`` set, then ``fields``.

    Args:
        family: ``model_type``; a key of ``ARCHITECTURES``.
        base: Widths (and other keys) to start from, e.g. another family's tiny config.
        **fields: Keys to add or override.

    Returns:
        A new dict; ``base`` is not changed.
    """
    return {**(base or {}), "model_type": family, "architectures": [ARCHITECTURES[family]], **fields}


def llama_like_configs(widths: Mapping[str, Any], *, moe_intermediate: int) -> dict[str, dict[str, Any]]:
    """Tiny configs of every Llama-like family in ``ARCHITECTURES``, all of the same ``widths``.

    What each family needs besides the widths to build and to stay comparable: Gemma/Gemma-2 an explicit
    ``head_dim`` (their config default is 256) of hidden / heads; Phi-3 multi-head attention (as Phi-3-mini) and
    ``pad_token_id`` 0 (its default 32000 is outside a tiny vocabulary); Mixtral 4 experts, top-2, of
    ``moe_intermediate`` width.

    Args:
        widths: ``hidden_size``, ``intermediate_size``, ``num_attention_heads``, ``num_key_value_heads``,
            ``num_hidden_layers``, ``vocab_size``.
        moe_intermediate: Mixtral's per-expert ``intermediate_size``.

    Returns:
        Family name -> config dict.
    """
    head_dim = widths["hidden_size"] // widths["num_attention_heads"]
    return {
        "llama": family_config("llama", widths),
        "qwen2": family_config("qwen2", widths),
        "mistral": family_config("mistral", widths),
        "gemma": family_config("gemma", widths, head_dim=head_dim),
        "gemma2": family_config("gemma2", widths, head_dim=head_dim),
        "mixtral": family_config("mixtral", widths, num_local_experts=4, num_experts_per_tok=2,
                                 intermediate_size=moe_intermediate),
        "phi3": family_config("phi3", widths, num_key_value_heads=widths["num_attention_heads"], pad_token_id=0),
    }


def spec_from_config(
    config: Mapping[str, Any],
    *,
    seq: int = 64,
    batch: int = 1,
    dtype: str = "bfloat16",
    mixed: str = "no",
    checkpointing: bool = False,
    attn: str = "sdpa",
    lora: LoraSpec | None = None,
    quant: QuantSpec | None = None,
    device: DeviceType = DeviceType.CPU,
    grad_accum: int = 1,
    optimizer: str = "adamw_torch",
) -> TrainingSpec:
    """The TrainingSpec of one single-process run of the model ``config`` describes.

    Args:
        config: config.json dict (read by ``inventory_from_config``).
        seq: Tokens per sequence.
        batch: Sequences per micro-batch.
        dtype: Load dtype name.
        mixed: Autocast: ``no`` / ``bf16`` / ``fp16``.
        checkpointing: Gradient checkpointing.
        attn: ``attn_implementation``.
        lora: PEFT LoRA, if any.
        quant: bitsandbytes quantized base, if any.
        device: ``cpu`` counts live tensors only (what the tracer records); ``cuda`` adds the CUDA kernels' terms.
        grad_accum: Gradient accumulation steps.
        optimizer: ``TrainingArguments.optim`` name.

    Returns:
        The spec; sharding, freeze and the rest keep their defaults.
    """
    return TrainingSpec(
        model=inventory_from_config(dict(config), "tiny", "tests/tiny_models.py"),
        precision=PrecisionSpec(Dtype(dtype), MixedPrecision(mixed)),
        optimizer=OptimizerSpec(optimizer),
        batch=BatchSpec(micro_batch=batch, seq_len=seq, grad_accum=grad_accum),
        activations=ActivationSpec(checkpointing=checkpointing, attn_implementation=AttnImpl(attn)),
        hardware=HardwareSpec(device_type=device),
        lora=lora,
        quant=quant,
    )


def trace_spec(config: Mapping[str, Any], spec: TrainingSpec, *, fake: bool = True) -> TraceResult:
    """Trace (``fitcheck.torch_adapters.tracer.trace_step``) the CPU step ``spec`` describes.

    Args:
        config: config.json dict of the model (the one ``spec.model`` was read from).
        spec: A single-process CPU run, e.g. from ``spec_from_config``.
        fake: Fake tensors (no data) instead of real ones.

    Returns:
        The live bytes of the second training step, by phase.

    Raises:
        ValueError: ``spec`` is not a CPU run (the tracer records CPU tensors only).
    """
    from fitcheck.torch_adapters.tracer import trace_step

    if spec.hardware.device_type is not DeviceType.CPU:
        raise ValueError(f"the tracer runs CPU steps only, not {spec.hardware.device_type.value}")
    return trace_step(
        config, seq_len=spec.batch.seq_len, micro_batch=spec.batch.micro_batch, dtype=spec.precision.load_dtype.value,
        mixed_precision=spec.precision.mixed_precision.value,
        attn_implementation=spec.activations.attn_implementation.value,
        checkpointing=spec.activations.checkpointing, every_n_layers=spec.activations.checkpoint_every_n_layers,
        lora=spec.lora, quant=spec.quant, optimizer=spec.optimizer.name, fake=fake,
    )


def assert_activations_match_trace(config: Mapping[str, Any], label: str, **settings: Any) -> None:
    """At FORWARD_END and BACKWARD_START the activation components equal (<= 1 %) what a fake-tensor trace of
    the same CPU step holds besides parameters and optimizer states (no gradient exists then in the steady-state
    step).

    Args:
        config: config.json dict of the model.
        label: Names the case in the assertion message.
        **settings: Keywords of ``spec_from_config`` (``seq``, ``batch``, ``dtype``, ``mixed``, ...).
    """
    from fitcheck.torch_adapters.trace_result import OPTSTATE, PARAMS

    spec = spec_from_config(config, **settings)
    comps = activation_components(spec)
    trace = trace_spec(config, spec)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
        br = trace.phases[phase]
        traced = br.total - br.get(PARAMS) - br.get(OPTSTATE)
        formula = sum(c.at(phase) for c in comps)
        assert abs(formula - traced) <= 0.01 * traced, (label, phase, formula, traced)


# Eight one-layer groups of a narrow Llama: the allocator replay builds its whole run from the one- and two-layer
# traces (tests/test_allocator_deepen.py, tests/test_reserved_replay.py).
LLAMA_8_LAYERS: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 8, "vocab_size": 256,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}

# the allocator-replay tests' step on LLAMA_8_LAYERS (test_allocator_compose.py, test_allocator_bnb_optim.py):
# a CUDA trace (cuda_kernels) of a short batch, all-linear LoRA r 8, a double-quantized nf4 base
# a wide vocabulary next to a narrow body: a plain step's full-vocabulary logits dominate it (TRL's fused LM head
# never allocates them: test_trace_trl_head, test_trl_replay)
WIDE_VOCAB_LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 32000,
    "max_position_embeddings": 1024, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
REPLAY_STEP: dict[str, Any] = {"seq_len": 32, "micro_batch": 2, "cuda_kernels": True}
REPLAY_LORA = LoraSpec(r=8, alpha=16, target_modules=("all-linear",))
REPLAY_NF4 = QuantSpec(bits=4, quant_type="nf4", double_quant=True, compute_dtype=Dtype.BFLOAT16)


def narrow_catalog_config(model_id: str, **overrides: Any) -> dict[str, Any]:
    """A catalog model's config.json at width 256 (4 heads of 64, 2 KV heads), 2 layers, vocabulary 1024: its
    family's real code paths at a size a formula-vs-trace test can run; ``overrides`` set more keys."""
    from fitcheck.catalog import find_catalog_config

    found = find_catalog_config(model_id)
    assert found is not None, model_id
    cfg: dict[str, Any] = dict(found[0])
    cfg.update(hidden_size=256, intermediate_size=688, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
               num_hidden_layers=2, vocab_size=1024, **overrides)
    return cfg
