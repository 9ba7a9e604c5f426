"""LLM.int8 LoRA (bitsandbytes 8-bit base + LoRA): the tracer runs real bitsandbytes ``Linear8bitLt`` layers on
CPU (``MatMul8bitFp``, bitsandbytes 0.50.2 autograd/_functions.py), and the emulated fake base equals them."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("bitsandbytes")

from fitcheck.spec import LoraSpec, QuantSpec

TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 344,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 2000,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
INT8 = QuantSpec(bits=8)
DROP = LoraSpec(r=8, alpha=16, dropout=0.05, target_modules=("all-linear",))


def test_int8_base_is_real_bitsandbytes_and_runs_matmul8bitfp_on_cpu() -> None:
    import importlib

    import torch

    bnb_nn: Any = importlib.import_module("bitsandbytes.nn")
    bnb_functions: Any = importlib.import_module("bitsandbytes.autograd._functions")

    from fitcheck.torch_adapters.tracer_build import build_model

    model = build_model(TINY, dtype=torch.bfloat16, attn_implementation="sdpa", checkpointing=False,
                        lora=DROP, quant=INT8, fake=False)
    layers = [m for m in model.modules() if isinstance(m, bnb_nn.Linear8bitLt)]
    assert len(layers) == 2 * 7  # every decoder linear; the LM head is kept (get_keys_to_not_convert)
    weight: Any = layers[0].weight
    assert type(weight).__name__ == "Int8Params" and weight.dtype == torch.int8 and weight.SCB.dtype == torch.float32
    seen: list[str] = []
    original = bnb_functions.MatMul8bitFp.apply

    def spy(*args: Any) -> Any:
        seen.append("fp")
        return original(*args)

    bnb_functions.MatMul8bitFp.apply = spy
    try:
        model.train()
        out = model(input_ids=torch.randint(0, 2000, (1, 8)), labels=torch.randint(0, 2000, (1, 8)))
        out.loss.backward()
    finally:
        bnb_functions.MatMul8bitFp.apply = original
    assert len(seen) == 14  # training on CPU: bnb.matmul dispatches to MatMul8bitFp, not MatMul8bitLt


@pytest.mark.slow
@pytest.mark.parametrize(("mp", "ckpt"), [("no", False), ("bf16", True)])
def test_fake_int8_base_equals_real_bitsandbytes(mp: str, ckpt: bool) -> None:
    from fitcheck.torch_adapters.tracer import trace_step

    kw: dict[str, Any] = dict(seq_len=32, micro_batch=2, dtype="bfloat16", mixed_precision=mp, checkpointing=ckpt,
                              lora=DROP, quant=INT8)
    real = trace_step(TINY, fake=False, **kw)
    fake = trace_step(TINY, fake=True, **kw)
    assert {p: b.total for p, b in fake.phases.items()} == {p: b.total for p, b in real.phases.items()}
