"""Pre-quantized bases (issue 12): GPTQ, AWQ, FP8, MXFP4 bytes and layers against the real libraries.

* FP8: the bytes of transformers' own ``FP8Linear`` built on the meta device.
* MXFP4: the packed expert tensors of ``Mxfp4GptOssExperts``; the at-rest checkpoint of gpt-oss-20b equals its
  published ``model.safetensors.index.json`` total_size (13,761,264,768 B) to the byte; the dequantization
  spike equals a live-tensor recording of transformers' own ``convert_moe_packed_tensors`` on CPU.
* GPTQ / AWQ: the reader, which layers are quantized (every decoder-layer linear; not embeddings or head), the
  checkpoint tensor shapes, and that a LoRA estimate on them runs end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.cli.main import main
from fitcheck.core.states import mxfp4_load_spike, mxfp4_packed_bytes, quantized_bytes
from fitcheck.readers.prequant_config import prequant_from_mapping
from fitcheck.spec import Kind, QuantSpec

FIXTURES = Path(__file__).parent / "fixtures" / "prequant"
GPT_OSS = Path("/work/shared/catalog/openai/gpt-oss-20b/config.json")


def _quant(method: str, **kw: object) -> QuantSpec:
    spec = prequant_from_mapping(method, {"quant_method": method, **kw}, source="test")
    assert isinstance(spec, QuantSpec)
    return spec


def test_gptq_and_awq_layer_bytes_follow_the_checkpoint_shapes() -> None:
    in_f, out_f, g = 3584, 18944, 128
    groups = in_f // g
    gptq = quantized_bytes(in_f * out_f, _quant("gptq", bits=4, group_size=g), out_f)
    # qweight int32 [in/8, out]; qzeros int32 [groups, out/8]; scales fp16 [groups, out]; g_idx int32 [in]
    assert gptq.data == 4 * (in_f // 8) * out_f
    assert gptq.meta == 4 * groups * (out_f // 8) + 2 * groups * out_f + 4 * in_f
    awq = quantized_bytes(in_f * out_f, _quant("awq", bits=4, group_size=g), out_f)
    # qweight int32 [in, out/8]; qzeros int32 [groups, out/8]; scales fp16 [groups, out]; no g_idx
    assert awq.data == 4 * in_f * (out_f // 8)
    assert awq.meta == 4 * groups * (out_f // 8) + 2 * groups * out_f


@pytest.mark.parametrize("block", [(128, 128), None])
def test_fp8_bytes_equal_transformers_fp8linear(block: tuple[int, int] | None) -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers.integrations.finegrained_fp8 import FP8Linear

    in_f, out_f = 4096, 1000
    with torch.device("meta"):
        layer = FP8Linear(in_f, out_f, block_size=block)
    real = sum(p.numel() * p.element_size() for p in layer.parameters())
    quant = QuantSpec(bits=8, method="fp8", block_size=block, pre_quantized=True)
    assert quantized_bytes(in_f * out_f, quant, out_f).total == real


def test_mxfp4_blocks_equal_the_experts_module_and_the_spike_a_real_recording() -> None:
    pytest.importorskip("transformers")
    import torch
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import Mxfp4GptOssExperts, convert_moe_packed_tensors

    from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder

    cfg = GptOssConfig(num_local_experts=4, intermediate_size=256, hidden_size=512)
    with torch.device("meta"):
        experts = Mxfp4GptOssExperts(cfg)
    gate_up = 4 * 2 * 256 * 512
    assert mxfp4_packed_bytes(gate_up)[0] == experts.gate_up_proj.numel() * experts.gate_up_proj.element_size()
    blocks = torch.randint(0, 255, (4, 512, 512 // 32, 16), dtype=torch.uint8)
    scales = torch.randint(100, 140, (4, 512, 512 // 32), dtype=torch.uint8)
    rec = LiveTensorRecorder()
    rec.track([blocks, scales])
    with rec:
        rec.enter_region("load")
        out = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
    assert rec.regions["load"].peak - out.numel() * out.element_size() == mxfp4_load_spike(gate_up)


@pytest.mark.skipif(not GPT_OSS.is_file(), reason="shared catalog not present")
def test_gpt_oss_20b_packed_size_equals_the_published_checkpoint() -> None:
    pytest.importorskip("transformers")
    from fitcheck.torch_adapters import meta_inventory

    inv = meta_inventory(json.loads(GPT_OSS.read_text()), "openai/gpt-oss-20b", "catalog")
    experts = [p for p in inv.params if p.kind is Kind.FUSED_EXPERTS]
    packed = sum(sum(mxfp4_packed_bytes(p.numel_each)) * p.repeat for p in experts)
    rest = 2 * sum(p.numel for p in inv.params if p.kind is not Kind.FUSED_EXPERTS)  # bf16 (source.txt)
    assert packed + rest == 13_761_264_768  # model.safetensors.index.json total_size (catalog source.txt)


@pytest.mark.parametrize("name", ["qwen2.5-7b-gptq-int4", "qwen2.5-7b-awq"])
def test_prequantized_lora_estimate(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model_name_or_path", str(FIXTURES / name), "--use_peft", "--lora_target_modules",
                 "all-linear", "--gradient_checkpointing", "--per_device_train_batch_size", "1",
                 "--max_seq_length", "2048", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    comps = out["components"]
    # Qwen2.5-7B: 28 layers x (2·3584² + 2·3584·512 + 3·3584·18944) linear weights, 0.5 B each packed
    quantized = 28 * (2 * 3584**2 + 2 * 3584 * 512 + 3 * 3584 * 18944)
    assert comps["weights.quantized"] == quantized // 2
    assert comps["weights.frozen"] == 2 * (7_615_616_512 - quantized)  # embeddings, head, norms, biases in fp16
    assert "pre-quantized-base" in {f["code"] for f in out["findings"]}
    assert "quantization-not-modelled" not in {f["code"] for f in out["findings"]}


@pytest.mark.skipif(not GPT_OSS.is_file(), reason="shared catalog not present")
def test_gpt_oss_lora_counts_dequantized_experts(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model_name_or_path", str(GPT_OSS), "--dtype", "bfloat16", "--use_peft",
                 "--lora_target_modules", "all-linear",
                 "--gradient_checkpointing", "--max_seq_length", "1024", "--per_device_train_batch_size", "1",
                 "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert out["components"]["weights.frozen"] == 2 * 20_914_757_184
    assert "mxfp4-dequantized-for-training" in {f["code"] for f in out["findings"]}
