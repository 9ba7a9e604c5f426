"""TRL 0.7.5-0.25.1's SFTTrainer casts (``peft_module_casting_to_bf16``) and transformers < 4.49's shifted logits on
the traced default path (``core/states/trl_adapters.py``, ``core/activations/logits.traced_legacy_logits``).

- The release gates (read from huggingface/trl's tags; no library needed).
- The formula against fake-tensor traces of the real transformers Llama + peft + bitsandbytes 0.50.2 ``Linear4bit``
  step with the cast applied (``tracer_quant.trl_module_casting_to_bf16``): the cast moves both by the same bytes.
- The traced answer of a transformers 4.48 stack: the trace of the installed 5.23 loss plus the formula's copy.
- Real TRL 0.13 ``SFTTrainer`` (``benchmarks/trl_old_casts.py`` in the old-stack environment, ``/work/venvs/old``
  or ``FITCHECK_OLD_STACK_PYTHON``): the dtypes it leaves vs fitcheck's layout. Skipped where that environment is
  absent (CI): the other tests run in CI.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tiny_models import spec_from_config

from fitcheck.core import estimate
from fitcheck.core.states import base_weights, build_layout, trl_bf16_trainables, trl_module_cast, trl_prepares_kbit
from fitcheck.report import Phase
from fitcheck.spec import Dtype, LoraSpec, QuantSpec, StackSpec, TrainerKind, TrainerSpec, TrainingSpec

ROOT = Path(__file__).resolve().parents[1]
TINY: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
OLD_PYTHON = Path(os.environ.get("FITCHECK_OLD_STACK_PYTHON", "/work/venvs/old/bin/python"))


def _spec(trl: str | None, *, ckpt: bool = True, sft: bool = False, batch: int = 2, seq: int = 64,
          prep: bool = True) -> TrainingSpec:
    quant = QuantSpec(bits=4, quant_type="nf4", compute_dtype=Dtype.BFLOAT16, double_quant=True,
                      prepare_for_kbit_training=prep)
    spec = spec_from_config(TINY, seq=seq, batch=batch, checkpointing=ckpt, mixed="bf16", quant=quant,
                            lora=LoraSpec(r=8, alpha=16, target_modules=QKVO))
    trainer = TrainerSpec(kind=TrainerKind.SFT) if sft else TrainerSpec(prepared_by_sft_trainer=True)
    stack = StackSpec((("trl", trl),), "--stack") if trl else StackSpec()
    return dataclasses.replace(spec, trainer=trainer, stack=stack)


def _device(report: Any, phase: Phase) -> int:
    return sum(c.at(phase) for c in report.components if c.location.value == "device")


@pytest.mark.parametrize(("trl", "cast", "adapters16"), [
    ("0.7.4", False, False), ("0.7.5", True, True), ("0.8.6", True, True), ("0.9.3", True, False),
    ("0.13.0", True, False), ("0.25.1", True, False), ("0.26.0", False, True), ("1.16.0", False, True),
    (None, False, True),
])
def test_trl_release_gates(trl: str | None, cast: bool, adapters16: bool) -> None:
    """First / last tags of each cast: peft_module_casting_to_bf16 v0.7.5-v0.25.1 (its LoRA-layer cast until
    #1644, v0.9.3); TRL >= 0.26 casts the trainables to bf16 instead; k-bit preparation v0.7.3-v0.25.1."""
    spec = _spec(trl, sft=True)
    assert trl_module_cast(spec) is cast
    assert trl_bf16_trainables(spec) is adapters16
    release = spec.stack.release("trl")
    assert trl_prepares_kbit(release) is (trl is not None and trl not in ("0.26.0", "1.16.0"))
    # the cast needs bf16 and the k-bit preparation it shares its condition with (not FSDP / ZeRO-3 QLoRA)
    assert not trl_module_cast(_spec(trl, sft=True, prep=False))
    # a plain Trainer run that TRL did not prepare keeps 1.16's rule (no trainables cast for it either)
    plain = dataclasses.replace(spec, trainer=TrainerSpec())
    assert not trl_module_cast(plain) and not trl_bf16_trainables(plain)


def test_cast_moves_formula_and_trace_alike() -> None:
    """QLoRA q/k/v/o, bf16 autocast, checkpointed, 2 x 64: TRL 0.13's cast against TRL 1.16 (no cast), formula vs
    trace, every phase. The cast removes autocast's bf16 copy of the LM head weight and makes the bottom
    checkpoint (the embedding output) and the rotary tables 16-bit; the frozen embedding and head weigh half."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    from fitcheck.torch_adapters.tracer_depth import trace_components

    new, old = _spec("1.16.0"), _spec("0.13.0")
    f_new, f_old = estimate(new), estimate(old)
    t_new, t_old = estimate(new, activations=trace_components(new)), estimate(old, activations=trace_components(old))
    v, h, bs = TINY["vocab_size"], TINY["hidden_size"], 2 * 64
    weights = 2 * (2 * v * h)  # embedding and head, fp32 -> bf16
    assert _device(f_new, Phase.OPTIMIZER_STEP) - _device(f_old, Phase.OPTIMIZER_STEP) == weights
    assert _device(f_new, Phase.FORWARD_END) - _device(f_old, Phase.FORWARD_END) == weights + 2 * v * h + 2 * bs * h + (
        2 * 64 * (h // 4) * 2)  # + head weight cast, bottom checkpoint, rotary cos/sin (1, s, head_dim) fp32 -> bf16
    for phase in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD, Phase.OPTIMIZER_STEP):
        f_delta = _device(f_old, phase) - _device(f_new, phase)
        t_delta = _device(t_old, phase) - _device(t_new, phase)
        assert f_delta == t_delta, phase


def test_cast_dtypes_and_finding() -> None:
    spec = _spec("0.13.0", sft=True)
    dtypes = base_weights(spec).dtype_of
    assert dtypes["model.embed_tokens.weight"] is Dtype.BFLOAT16 and dtypes["lm_head.weight"] is Dtype.BFLOAT16
    assert dtypes["model.norm.weight"] is Dtype.FLOAT32
    assert {g.dtype for g in build_layout(spec).adapters} == {Dtype.FLOAT32}
    assert {g.dtype for g in build_layout(_spec("0.8.6", sft=True)).adapters} == {Dtype.BFLOAT16}
    found = [f.message for f in estimate(spec).findings if f.code == "versions-modelled"]
    assert any("peft_module_casting_to_bf16" in m for m in found)
    assert base_weights(spec).upcast_params == 5 * TINY["hidden_size"]  # only the norms stay upcast


def test_legacy_logits_copy_is_added_to_the_trace() -> None:
    """transformers 4.48: the trace runs 5.23's loss (no shifted copy); the traced answer adds the formula's
    4·b·(s-1)·V at the end of forward, as the formula does (transformers PR #35646, 4.49.0)."""
    pytest.importorskip("peft")
    from fitcheck.torch_adapters.tracer_depth import trace_components

    spec = spec_from_config(TINY, seq=64, batch=2, mixed="bf16", lora=LoraSpec(r=8, alpha=16, target_modules=QKVO))
    old = dataclasses.replace(spec, stack=StackSpec((("transformers", "4.48.1"),), "--stack"))
    traced = trace_components(spec)  # the trace does not depend on the stack's transformers
    copy = 4 * 2 * 63 * TINY["vocab_size"]
    t_delta = _device(estimate(old, activations=traced), Phase.FORWARD_END) - _device(
        estimate(spec, activations=traced), Phase.FORWARD_END)
    f_delta = _device(estimate(old), Phase.FORWARD_END) - _device(estimate(spec), Phase.FORWARD_END)
    assert t_delta == f_delta == copy
    names = {c.name for c in estimate(old, activations=traced).components}
    assert "logits.legacy_shift_copy" in names


@pytest.fixture(scope="module")
def real_trl013() -> dict[str, Any]:
    if not OLD_PYTHON.exists():
        pytest.skip(f"no old-stack environment at {OLD_PYTHON} (trl 0.13, transformers 4.48.1, peft 0.13.2)")
    import importlib.util
    import tempfile

    bnb = importlib.util.find_spec("bitsandbytes")
    if bnb is None or bnb.submodule_search_locations is None:
        pytest.skip("bitsandbytes (0.50.2, CPU backend) is needed for the old stack's 4-bit layers")
    package = Path(next(iter(bnb.submodule_search_locations)))
    with tempfile.TemporaryDirectory() as tmp:
        for src in (package, *package.parent.glob("bitsandbytes-*.dist-info")):  # its metadata: transformers reads it
            (Path(tmp) / src.name).symlink_to(src)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": ""}
        out = subprocess.run([str(OLD_PYTHON), str(ROOT / "benchmarks" / "trl_old_casts.py"), "--bnb-path", tmp],
                             capture_output=True, text=True, env=env, timeout=600, check=False)
    if out.returncode != 0:
        pytest.fail(f"benchmarks/trl_old_casts.py failed in the old stack:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout))


def test_real_trl013_sft_trainer_dtypes_match_the_layout(real_trl013: dict[str, Any]) -> None:
    """TRL 0.13.0 SFTTrainer, bf16=True, a model TRL takes for a 4-bit one: norms fp32, embedding and head bf16,
    adapters fp32, as fitcheck lays them out; on a CPU a real Params4bit reads as sharded QLoRA (neither cast)."""
    assert real_trl013["versions"]["trl"] == "0.13.0"
    from benchmark_module import load_benchmark

    casts = load_benchmark("trl_old_casts")
    spec = _spec("0.13.0", sft=True)
    dtypes = base_weights(spec).dtype_of
    real = real_trl013["marked_16bit"]
    for name, dtype in dtypes.items():
        entry = name.replace("*", "0")
        if entry in real and "proj" not in name:  # the unquantized parameters (the marked model's linears are fp32)
            assert real[entry][0] == dtype.value, name
    adapters = {g.dtype.value for g in build_layout(spec).adapters}
    assert {v[0] for n, v in real.items() if "lora_" in n} == adapters == {"float32"}
    # the real 4-bit base on a CPU: TRL 0.13's is_sharded_qlora (Params4bit on cpu) skips preparation and cast
    assert {v[0] for n, v in real_trl013["real_4bit"].items() if "lora_" not in n} == {"bfloat16", "uint8"}
    assert list(QKVO) == casts.TARGETS
    assert casts.CONFIG["vocab_size"] == TINY["vocab_size"]


@pytest.mark.parametrize(("trl", "prepared"), [("0.13.0", True), ("0.25.1", True), ("0.26.0", False)])
def test_sft_kbit_preparation_default_follows_the_stack_trl(trl: str, prepared: bool) -> None:
    """``--trainer sft``: TRL 0.7.3-0.25.1's SFTTrainer prepares a k-bit model itself, TRL >= 0.26 never does."""
    from fitcheck.readers import spec_from_values
    from fitcheck.readers.model_config import inventory_from_config

    values = {"trainer": "sft", "load_in_4bit": True, "use_peft": True, "bf16": True, "stack": f"trl={trl}",
              "per_device_train_batch_size": 1, "max_seq_length": 64}
    spec, _ = spec_from_values(values, inventory=inventory_from_config(dict(TINY), "tiny", "test"))
    assert spec.quant is not None and spec.quant.prepare_for_kbit_training is prepared
    assert trl_module_cast(spec) is (prepared and trl != "0.26.0")
