"""Liger-Kernel's layer kernels need a GPU (Triton). Their memory effect is what their autograd Functions keep for
backward, so these tests stand torch re-implementations in for them that save exactly the tensors liger_kernel
0.8.5 saves (ops/rms_norm.py ``LigerRMSNormFunction``: ``save_for_backward(X, W, RSTD)`` with X the input viewed
(-1, h) and RSTD fp32 per row; ops/swiglu.py ``LigerSiLUMulFunction``: ``save_for_backward(a, b)``), patch them
in the way ``apply_liger_kernel_to_llama`` does (RMSNorm and MLP forward of the transformers model) and trace the
real model: the formula's Liger deltas must compose with everything else the model saves (<= 1 %)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tiny_models import spec_from_config, trace_spec

from fitcheck.core.activations import activation_components
from fitcheck.report import Phase
from fitcheck.spec import LigerSpec

torch = pytest.importorskip("torch")
LLAMA: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 688,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 4000,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
}


class _RMSNorm(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any, eps: float) -> Any:
        x2 = x.view(-1, x.shape[-1])
        rstd = torch.rsqrt(x2.float().pow(2).mean(-1) + eps)
        ctx.save_for_backward(x2, w, rstd)
        return ((x2.float() * rstd[:, None]).to(x.dtype) * w.to(x.dtype)).view(x.shape)

    @staticmethod
    def backward(ctx: Any, dy: Any) -> Any:
        x2, w, rstd = ctx.saved_tensors
        d = dy.reshape(x2.shape)
        dx = (d * w.to(d.dtype)).float().mul(rstd[:, None]).to(x2.dtype)
        dw = (d.float() * (x2.float() * rstd[:, None])).sum(0).to(w.dtype)
        return dx.view(dy.shape), dw, None


class _SiLUMul(torch.autograd.Function):  # type: ignore[misc]
    @staticmethod
    def forward(ctx: Any, a: Any, b: Any) -> Any:
        ctx.save_for_backward(a, b)
        return torch.nn.functional.silu(a) * b

    @staticmethod
    def backward(ctx: Any, dc: Any) -> Any:
        a, b = ctx.saved_tensors
        s = torch.sigmoid(a)
        return dc * b * s * (1 + a * (1 - s)), dc * a * s


@pytest.mark.parametrize(
    "settings",
    [{}, {"dtype": "float32", "mixed": "bf16"}, {"checkpointing": True},
     {"lora": "all-linear"}],
    ids=["bf16", "fp32-autocast", "bf16-ckpt", "bf16-lora"],
)
def test_liger_layer_kernels_formula_equals_trace(settings: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.models.llama import modeling_llama

    from fitcheck.spec import LoraSpec
    from fitcheck.torch_adapters.trace_result import OPTSTATE, PARAMS

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward",
                        lambda self, x: _RMSNorm.apply(x, self.weight, self.variance_epsilon))
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward",
                        lambda self, x: self.down_proj(_SiLUMul.apply(self.gate_proj(x), self.up_proj(x))))
    kw = dict(settings)
    if kw.get("lora"):
        kw["lora"] = LoraSpec(r=8, alpha=16, target_modules=("all-linear",))
    spec = spec_from_config(LLAMA, seq=128, batch=2, **kw)
    liger = LigerSpec(rope=False, fused_linear_cross_entropy=False)  # RoPE saves nothing new; FLCE needs Triton
    spec = replace(spec, activations=replace(spec.activations, liger=liger))
    comps = activation_components(spec)
    trace = trace_spec(LLAMA, spec)
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START):
        br = trace.phases[phase]
        traced = br.total - br.get(PARAMS) - br.get(OPTSTATE)
        formula = sum(c.at(phase) for c in comps)
        assert abs(formula - traced) <= 0.01 * traced, (phase, formula, traced)
