"""LoRA extras of the Llama-like families pinned to fake-tensor traces (<= 1 %): LoRA dropout (TRL's default
0.05), adapters on fp32 and autocast models, DoRA (saved tensors and the per-forward weight-norm transient),
Gemma-2's final-logit soft-capping.

As in ``tests/test_activations_vs_trace.py``: at FORWARD_END and BACKWARD_START the formula's components equal
what the trace holds besides parameters and optimizer states. Two decoder layers, so layer 0 (whose input needs no
gradient under LoRA) and a regular layer are both in.
"""

from __future__ import annotations

from typing import Any

import pytest
from tiny_models import assert_activations_match_trace, llama_like_configs, spec_from_config

from fitcheck.core.activations.decoder import activation_components, activation_findings
from fitcheck.report import Phase
from fitcheck.spec import DeviceType, LoraSpec, TrainingSpec

CONFIGS = llama_like_configs(
    {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2,
     "num_hidden_layers": 2, "vocab_size": 1000},
    moe_intermediate=512,
)
TRL = LoraSpec(r=8, alpha=16, dropout=0.05, target_modules=("all-linear",))  # TRL ModelConfig: dropout 0.05
PLAIN = LoraSpec(r=8, target_modules=("all-linear",))
ATTN = LoraSpec(r=8, dropout=0.05, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
QV = LoraSpec(r=8, dropout=0.1, target_modules=("q_proj", "v_proj"))
DORA = LoraSpec(r=8, target_modules=("all-linear",), use_dora=True)
DORA_TRL = LoraSpec(r=8, dropout=0.05, target_modules=("all-linear",), use_dora=True)

GRID: list[tuple[str, dict[str, Any]]] = [
    # LoRA dropout: per adapter an fp32 mask and output (CPU), none kept by layer 0's q/k/v
    ("llama", {"lora": TRL}),
    ("llama", {"lora": TRL, "dtype": "float32", "attn": "eager", "seq": 96, "batch": 2}),
    ("llama", {"lora": TRL, "checkpointing": True}),
    # TRL's usual `--dtype bfloat16 --bf16`: autocast over a 16-bit model, fp32 adapters cast per forward
    ("llama", {"lora": TRL, "mixed": "bf16"}),
    ("qwen2", {"lora": QV, "mixed": "bf16", "seq": 96, "batch": 2}),
    # LoRA on an fp32 model (o_proj reads the saved attention output) and on fp32 + autocast
    ("llama", {"lora": PLAIN, "dtype": "float32"}),
    ("mistral", {"lora": PLAIN, "dtype": "float32", "mixed": "bf16"}),
    ("mistral", {"lora": TRL, "dtype": "float32", "mixed": "bf16", "attn": "eager"}),
    ("gemma", {"lora": TRL}),
    ("gemma", {"lora": PLAIN, "dtype": "float32"}),
    ("mixtral", {"lora": ATTN}),
    ("phi3", {"lora": LoraSpec(r=8, dropout=0.1, target_modules=("qkv_proj", "o_proj")), "mixed": "bf16"}),
    # DoRA: base and LoRA outputs, norm vectors, weight copies (dropout), get_weight_norm transient
    ("llama", {"lora": DORA}),
    ("llama", {"lora": DORA_TRL, "mixed": "bf16", "seq": 128}),
    ("qwen2", {"lora": DORA, "dtype": "float32", "mixed": "bf16", "seq": 128}),
    ("llama", {"lora": DORA_TRL, "checkpointing": True, "seq": 128}),
    ("llama", {"lora": DORA, "checkpointing": True, "dtype": "float32", "seq": 128}),
    # Gemma-2: tanh soft-capped logits
    ("gemma2", {"attn": "eager"}),
    ("gemma2", {"checkpointing": True}),
    ("gemma2", {"lora": TRL, "mixed": "bf16"}),
]


@pytest.mark.parametrize(("family", "kw"), GRID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(GRID)])
def test_lora_extras_match_trace(family: str, kw: dict[str, Any]) -> None:
    pytest.importorskip("peft")
    assert_activations_match_trace(CONFIGS[family], family, **kw)


def _saved(spec: TrainingSpec, phase: Phase = Phase.BACKWARD_START) -> int:
    return sum(c.at(phase) for c in activation_components(spec))


def test_cuda_dropout_mask_is_one_byte() -> None:
    # aten Dropout.cpp: CUDA runs native_dropout (bool mask), CPU keeps an fp32 noise tensor: 3 B less per element
    cfg = dict(CONFIGS["llama"], num_hidden_layers=4)
    cpu = _saved(spec_from_config(cfg, seq=512, batch=2, mixed="bf16", lora=TRL))
    cuda = _saved(spec_from_config(cfg, seq=512, batch=2, mixed="bf16", lora=TRL, device=DeviceType.CUDA))
    h, inter = 256, 688
    # 7 adapters per layer (6 read h-wide tensors, down_proj reads I), layer 0's q/k/v keep no mask
    masks = 4 * (6 * h + inter) - 3 * h
    assert cpu - cuda == 3 * masks * 2 * 512


def test_dora_weight_norm_transient_sets_the_forward_peak_at_8b_width() -> None:
    cfg = dict(CONFIGS["llama"], hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
               num_key_value_heads=8, num_hidden_layers=32, vocab_size=128256)
    comps = {c.name: c for c in activation_components(spec_from_config(cfg, seq=1024, lora=DORA))}
    dora = comps["activations.dora"]
    # down_proj: eye(14336) fp32 (822 MB) + 4 fp32 (14336, 4096) matrices (939 MB) outgrow the 1.3 GB loss peak
    assert dora.at(Phase.FORWARD_END) > dora.at(Phase.BACKWARD_START) + 400_000_000


def _codes(spec: TrainingSpec) -> list[str]:
    # the BACKWARD-phase findings (activations_backward.py) carry their own code: these are the forward-side ones
    return [f.message for f in activation_findings(spec) if f.code == "activations-not-pinned"]


def test_findings_only_for_what_is_still_not_pinned() -> None:
    llama = CONFIGS["llama"]
    assert _codes(spec_from_config(llama, mixed="bf16", lora=TRL)) == []
    assert _codes(spec_from_config(llama, lora=DORA_TRL)) == []
    # the recomputed layer's get_weight_norm is counted (dora.dora_recompute_excess): no finding left for it
    assert _codes(spec_from_config(llama, checkpointing=True, lora=DORA)) == []
    # i12moe: peft's merged expert stacks are counted (activations/param_wrapper.py) except under checkpointing
    assert not any("fused MoE experts" in m for m in _codes(spec_from_config(CONFIGS["mixtral"], lora=PLAIN)))
    experts = _codes(spec_from_config(CONFIGS["mixtral"], lora=PLAIN, checkpointing=True))
    assert any("fused MoE experts" in m for m in experts)
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 256, "n_head": 8, "n_layer": 2,
            "vocab_size": 1000, "n_positions": 512}
    assert any("DoRA" in m for m in _codes(spec_from_config(gpt2, lora=DORA)))


@pytest.mark.parametrize("ckpt", [False, True], ids=["no-ckpt", "ckpt"])
def test_dora_during_backward_matches_trace_at_8b_width(ckpt: bool) -> None:
    # Phase.BACKWARD: the weight copies stay until their layer's backward; under checkpointing the top layer's
    # recompute re-runs get_weight_norm with eye(14336) saved by lora_A (was -54 % / -11 % before)
    pytest.importorskip("peft")
    from fitcheck.torch_adapters.differential import Cell, compare

    out = compare(Cell("llama", "dora", ckpt, "sdpa", "bf16", 256, 1))
    assert not out.refused, out.refused
    assert abs(out.error) <= 0.02, (out.formula, out.trace)
