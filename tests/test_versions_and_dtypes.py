"""Issue 12: library versions (installed / --stack), the transformers 4.x differences, config.json without a
dtype (gpt-oss) and its MXFP4 experts."""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any

import pytest

from fitcheck.catalog.models import find_catalog_config
from fitcheck.cli.estimate import spec_from_values
from fitcheck.core.estimator import estimate
from fitcheck.core.states import is_quantized
from fitcheck.errors import ConfigError
from fitcheck.readers.checkpoint_dtype import mxfp4_checkpoint_bytes
from fitcheck.readers.families_legacy import inventory_for_stack
from fitcheck.readers.model_config import inventory_from_config
from fitcheck.readers.versions import PACKAGES, installed_stack, parse_stack
from fitcheck.render.json_out import report_to_dict
from fitcheck.report import Category, Phase
from fitcheck.spec import MODELLED_VERSIONS, Dtype, Kind, Role, StackSpec

GIB = 2**30


def _spec(**values: Any) -> Any:
    return spec_from_values(values, env={})


def test_installed_versions_come_from_package_metadata() -> None:
    stack = installed_stack()
    assert stack.source == "installed"
    assert stack.get("transformers") == metadata.version("transformers")
    assert set(dict(stack.versions)) <= set(PACKAGES)
    missing = installed_stack(lambda name: None if name == "deepspeed" else "1.0")
    assert missing.get("deepspeed") is None and missing.get("peft") == "1.0"


def test_parse_stack() -> None:
    stack = parse_stack("transformers=4.46, peft=0.13.2")
    assert stack.source == "--stack" and stack.release("transformers") == (4, 46)
    assert stack.release("peft") == (0, 13, 2) and stack.get("torch") is None
    assert StackSpec((("transformers", "4.57.0.dev0"),)).release("transformers") == (4, 57, 0)


@pytest.mark.parametrize("bad", ["transformers", "transformer=4.46", "transformers=abc", "peft=0.1,peft=0.2", ""])
def test_bad_stack_is_a_config_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="--stack"):
        parse_stack(bad)


def test_json_reports_versions_and_modelled_versions() -> None:
    spec, _ = _spec(model_name_or_path="gpt2", stack="transformers=4.46,peft=0.13")
    out = json.loads(json.dumps(report_to_dict(estimate(spec))))
    assert out["versions"] == {"source": "--stack", "transformers": "4.46", "peft": "0.13"}
    assert out["modelled_versions"] == dict(MODELLED_VERSIONS)
    installed, _ = _spec(model_name_or_path="gpt2")
    assert report_to_dict(estimate(installed))["versions"]["source"] == "installed"


def test_outside_modelled_versions_warn() -> None:
    spec, _ = _spec(model_name_or_path="gpt2", stack="transformers=4.30,bitsandbytes=0.41")
    codes = [(f.code, f.message.split(" ")[0]) for f in estimate(spec).findings]
    assert ("versions-not-modelled", "transformers") in codes and ("versions-not-modelled", "bitsandbytes") in codes
    same, _ = _spec(model_name_or_path="gpt2", stack="transformers=5.23.0,peft=0.21.2")
    assert not any(f.code.startswith("versions") for f in estimate(same).findings)


def test_transformers_4x_loads_float32_by_default() -> None:
    spec, assumptions = _spec(model_name_or_path="meta-llama/Meta-Llama-3-8B", stack="transformers=4.46")
    assert spec.precision.load_dtype is Dtype.FLOAT32 and any("float32" in a for a in assumptions)
    given, _ = _spec(model_name_or_path="meta-llama/Meta-Llama-3-8B", stack="transformers=4.46", dtype="bfloat16")
    assert given.precision.load_dtype is Dtype.BFLOAT16
    modern, _ = _spec(model_name_or_path="meta-llama/Meta-Llama-3-8B", stack="transformers=5.23")
    assert modern.precision.load_dtype is Dtype.BFLOAT16  # dtype "auto": config.json says bfloat16


@pytest.mark.parametrize(("version", "extra_per_logit"), [("4.48", 4), ("4.46", 4), ("4.44", 2), ("4.49", 0)])
def test_older_loss_path_adds_the_shifted_logits_copy(version: str, extra_per_logit: int) -> None:
    base = {"model_name_or_path": "meta-llama/Meta-Llama-3-8B", "dtype": "bfloat16", "use_peft": True,
            "lora_target_modules": "all-linear", "max_seq_length": 2048}

    def logits(micro: int, stack: str) -> int:
        spec, _ = _spec(**base, per_device_train_batch_size=micro, stack=stack)
        comp = next(c for c in estimate(spec).components if c.category is Category.LOGITS)
        return comp.at(Phase.FORWARD_END)

    import torch

    one, two = torch.empty(1, 4, 3), torch.empty(2, 4, 3)  # the mechanism, in the real torch
    assert one[..., :-1, :].contiguous().data_ptr() == one.data_ptr()
    assert two[..., :-1, :].contiguous().data_ptr() != two.data_ptr()
    s, v = 2048, 128256
    for b in (1, 2):
        # 4.46-4.48 loss_utils.ForCausalLMLoss: fp32 shifted copy (4·b·(s-1)·V), none at micro-batch 1 (the slice
        # of a (1, s, V) tensor is contiguous: .contiguous() returns it; measured in benchmarks/fsdp1_lora_cpu.py);
        # <= 4.45 the forward also drops the bf16 logits it rebinds to fp32 (-2·b·s·V); PR #35646 (4.49) removed
        # the copy
        copy = 4 * b * (s - 1) * v if b > 1 else 0
        expected = {4: copy, 2: copy - 2 * b * s * v, 0: 0}[extra_per_logit]
        assert logits(b, f"transformers={version}") - logits(b, "transformers=5.23") == expected


def test_mixtral_on_transformers_4x_has_per_expert_linears() -> None:
    found = find_catalog_config("mistralai/Mixtral-8x7B-v0.1")
    assert found is not None
    inv = inventory_from_config(found[0], "mixtral", "catalog")
    legacy = inventory_for_stack(inv, parse_stack("transformers=4.46"))
    assert legacy.total_params == inv.total_params
    names = {p.name for p in legacy.params}
    assert "model.layers.*.block_sparse_moe.experts.7.w2.weight" in names
    assert not any(p.kind is Kind.FUSED_EXPERTS for p in legacy.params)
    gate = next(p for p in legacy.params if p.name.endswith("block_sparse_moe.gate.weight"))
    assert (gate.kind, gate.role, gate.shape) == (Kind.LINEAR, Role.ROUTER, (8, 4096))
    assert inventory_for_stack(inv, parse_stack("transformers=5.2")) is inv


def test_qlora_mixtral_quantizes_the_experts_only_on_transformers_4x() -> None:
    run = {"model_name_or_path": "mistralai/Mixtral-8x7B-v0.1", "use_peft": True, "lora_target_modules": "q_proj",
           "load_in_4bit": True, "dtype": "bfloat16", "gpu": "H100-80GB"}

    def weights(stack: str) -> int:
        spec, _ = _spec(**run, stack=stack)
        report = estimate(spec)
        return sum(c.at(report.peak_phase) for c in report.components if c.category is Category.WEIGHTS)

    # 5.x: fused 3-D experts are not nn.Linear, bitsandbytes leaves them in bf16 (~87 GiB); 4.x: 4-bit
    assert weights("transformers=5.23") > 80 * GIB > 30 * GIB > weights("transformers=4.46")
    # 4.x: every expert and router linear is quantized; the module of the last parameter (get_keys_to_not_convert)
    # is lm_head, not an expert (the per-expert entries once came last: expert 7's w3 stayed 16-bit in every layer)
    spec, _ = _spec(**run, stack="transformers=4.46")
    assert spec.model.params[-1].name == "lm_head.weight"
    assert all(is_quantized(spec, p) for p in spec.model.params if p.role in (Role.EXPERTS, Role.ROUTER))


def test_gpt_oss_without_dtype_loads_bf16_and_says_so() -> None:
    spec, _ = _spec(model_name_or_path="openai/gpt-oss-20b", use_peft=True,
                              lora_target_modules="all-linear")
    assert spec.precision.load_dtype is Dtype.BFLOAT16
    report = estimate(spec)
    codes = {f.code: f for f in report.findings}
    assert "dtype-not-in-config" in codes and "--dtype bfloat16" in codes["dtype-not-in-config"].hint
    assert "mxfp4-dequantized-for-training" in codes and "quantization-not-modelled" not in codes
    assert spec.quant is None  # trained dequantized: bf16 experts


def test_load_bf16_is_suggested_when_fp32_is_only_a_default() -> None:
    from fitcheck.advice import advise

    spec, _ = _spec(model_name_or_path="openai/gpt-oss-20b", stack="transformers=4.46", gpu="H100-80GB")
    assert spec.precision.load_dtype is Dtype.FLOAT32
    suggestions = advise(spec, estimate(spec))
    assert any("--dtype" in s.to_dict()["argv"] for s in suggestions)
    given, _ = _spec(model_name_or_path="openai/gpt-oss-20b", dtype="bfloat16", gpu="H100-80GB")
    assert not any("--dtype" in s.to_dict()["argv"] for s in advise(given, estimate(given)))


def test_mxfp4_checkpoint_bytes_match_the_published_index_size() -> None:
    found = find_catalog_config("openai/gpt-oss-20b")
    assert found is not None
    packed, rest = mxfp4_checkpoint_bytes(inventory_from_config(found[0], "gpt-oss-20b", "catalog"))
    assert packed + rest == 13_761_264_768  # model.safetensors.index.json total_size (catalog source.txt)


def test_default_optimizer_follows_the_torch_version() -> None:
    # transformers training_args.py: default_optim = "adamw_torch", "adamw_torch_fused" on torch >= 2.8
    old, notes = _spec(model_name_or_path="gpt2", stack="torch=2.1.1")
    assert old.optimizer.name == "adamw_torch" and any("torch 2.1.1 < 2.8" in n for n in notes)
    new, _ = _spec(model_name_or_path="gpt2", stack="torch=2.13")
    assert new.optimizer.name == "adamw_torch_fused"


def test_installed_versions_read_from_dist_info_folders_equal_importlib_metadata() -> None:
    """The fast path (the ``NAME-VERSION.dist-info`` folder name) answers what ``importlib.metadata`` answers, for
    every installed distribution and for an absent one."""
    from importlib import metadata

    from fitcheck.readers.versions import _metadata_version

    names = {d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"]}
    assert len(names) > 20
    for name in sorted(names | set(PACKAGES) | {"no-such-distribution-xyz"}):
        try:
            expected: str | None = metadata.version(name)
        except metadata.PackageNotFoundError:
            expected = None
        assert _metadata_version(name) == expected, name


_TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
               "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "vocab_size": 128, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "hidden_act": "silu",
               "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _qlora_step_bytes(keep_input: bool, tokens: int) -> tuple[int, int]:
    """(live bytes after backward with the graph held, peak) of one real QLoRA step on CPU: transformers' Llama,
    bitsandbytes 0.50.2 ``Linear4bit`` (real, quantized on CPU), peft q/v LoRA; ``keep_input`` reverts PR #1270
    (``ctx.tensors = (A, B)``, bitsandbytes <= 0.43.1: ``tracer_quant.matmul4bit_keeps_input``)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fitcheck.spec import QuantSpec
    from fitcheck.torch_adapters import LiveTensorRecorder
    from fitcheck.torch_adapters.tracer_quant import matmul4bit_keeps_input, quantize_base

    torch.manual_seed(0)
    config = LlamaConfig(**{k: v for k, v in _TINY_LLAMA.items() if k not in ("model_type", "architectures")})
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    quant = QuantSpec(bits=4, quant_type="nf4", compute_dtype=Dtype.BFLOAT16)
    model = get_peft_model(quantize_base(model, quant, fake=False),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    ids = torch.randint(0, 128, (1, tokens))
    rec = LiveTensorRecorder()
    with matmul4bit_keeps_input(keep_input), rec:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        held = rec.current
    peak = max(r.peak for r in rec.regions.values())
    del loss
    return held, peak


def test_bitsandbytes_before_0_43_2_keeps_each_4bit_linear_input() -> None:
    """bitsandbytes <= 0.43.1 ``MatMul4Bit`` keeps its input as a ctx attribute (``ctx.tensors = (A, B)``; PR #1270,
    0.43.2, made it ``(None, B)``). Measured with the real 0.50.2 step and that line reverted: after backward the
    graph holds the warned bound less layer 0's attention input (it needs no grad); the peak is at most the bound
    higher."""
    from dataclasses import replace

    from fitcheck.core.activations.versions import legacy_bnb_kept_inputs

    tokens = 64
    spec, _ = _spec(model_name_or_path="meta-llama/Llama-2-7b-hf", load_in_4bit=True, use_peft=True, lora_r=8,
                    lora_target_modules="q_proj,v_proj", bnb_4bit_compute_dtype="bfloat16",
                    per_device_train_batch_size=1, max_seq_length=tokens, stack="bitsandbytes=0.42.0")
    spec = replace(spec, model=inventory_from_config(_TINY_LLAMA, "tiny-llama", "test"))
    bound = legacy_bnb_kept_inputs(spec)
    h, inter, layers = 64, 176, 2
    assert bound == (3 * h + inter) * 2 * layers * tokens  # bf16 inputs of q/k/v, o_proj, gate/up, down_proj
    new_held, new_peak = _qlora_step_bytes(False, tokens)
    old_held, old_peak = _qlora_step_bytes(True, tokens)
    assert old_held - new_held == bound - 2 * h * tokens
    # the peak holds what nothing else saves (core/activations/bnb_kept_inputs.py): per layer the q/k/v input (peft
    # casts it to the fp32 adapter), the MLP norm output and the MLP product; o_proj reads SDPA's saved output;
    # layer 0's q/k/v keep nothing (their input needs no grad)
    assert old_peak - new_peak == ((2 * h + inter) * 2 * layers - 2 * h) * tokens
    def end_of_forward(s: Any) -> int:
        return sum(c.at(Phase.FORWARD_END) for c in estimate(s).components)

    assert spec.quant is not None and spec.lora is not None
    # as the step above runs: no k-bit preparation, peft's default dropout 0
    real = replace(spec, quant=replace(spec.quant, prepare_for_kbit_training=False),
                   lora=replace(spec.lora, dropout=0.0))
    assert end_of_forward(real) - end_of_forward(replace(real, stack=StackSpec())) == old_peak - new_peak
    codes = [f.code for f in estimate(spec).findings]
    assert "bnb-keeps-inputs" in codes
    fixed = replace(spec, stack=StackSpec((("bitsandbytes", "0.43.2"),), "--stack"))
    assert legacy_bnb_kept_inputs(fixed) == 0 and "bnb-keeps-inputs" not in [f.code for f in estimate(fixed).findings]


@pytest.mark.parametrize(("torch_version", "kept"), [("1.10", True), ("1.11", False), ("2.13", False)])
def test_torch_before_1_11_keeps_the_eager_softmax_input(torch_version: str, kept: bool) -> None:
    """torch 1.10.2's generated SoftmaxBackward0 saves ``self_`` (the input) beside ``result_``; 1.11.0's only
    ``self_scalar_type`` (pytorch issue #64000): eager attention keeps one more (b, heads, s, s) tensor per layer."""
    base = {"model_name_or_path": "google-bert/bert-base-uncased", "dtype": "float32", "attn_implementation": "eager",
            "max_seq_length": 128, "per_device_train_batch_size": 2, "device_type": "cuda"}
    new, _ = _spec(**base, stack="transformers=4.46")
    old, _ = _spec(**base, stack=f"transformers=4.46,torch={torch_version}")

    def saved(spec: Any) -> int:
        comp = next(c for c in estimate(spec).components if c.name == "activations.saved")
        return comp.at(Phase.FORWARD_END)

    b, s, heads, layers = 2, 128, 12, 12
    assert saved(old) - saved(new) == (4 * b * heads * s * s * layers if kept else 0)
    assert any(f.code == "versions-modelled" and "softmax" in f.message for f in estimate(old).findings) is kept
    from fitcheck.torch_adapters.run_scope import untraced_parts  # no trace of the installed torch answers it

    assert any("softmax" in part for part in untraced_parts(old)) is kept


def test_one_scan_of_the_path_answers_each_package_as_its_own_scan(tmp_path: Any) -> None:
    """``installed_stack`` lists each path entry once for every package (``_dist_info_versions``); per name it
    answers what a scan for that name alone answers: the first ``dist-info`` with a version on the path, and whether
    an egg-info, egg or version-less dist-info named it first."""
    from fitcheck.readers.versions import _dist_info_version, _dist_info_versions, _metadata_version

    first, second = tmp_path / "a", tmp_path / "b"
    for folder in ("peft-0.1.egg-info", "trl.dist-info", "Torch-2.0.dist-info", "accelerate.pth", "deepspeed"):
        (first / folder).mkdir(parents=True)
    for folder in ("peft-0.2.dist-info", "trl-1.0.dist-info", "torch-9.9.dist-info", "bitsandbytes-0.4.egg"):
        (second / folder).mkdir(parents=True)
    paths = [str(tmp_path / "absent"), str(first), str(second)]
    names = ("peft", "trl", "torch", "accelerate", "deepspeed", "bitsandbytes", "transformers")
    together = _dist_info_versions(names, paths)
    assert together == {name: _dist_info_version(name, paths) for name in names}
    assert together["peft"] == ("0.2", True) and together["torch"] == ("2.0", False)
    assert together["bitsandbytes"] == (None, True) and together["transformers"] == (None, False)
    assert installed_stack() == installed_stack(_metadata_version)  # one scan == a scan per package


@pytest.mark.parametrize(("trainer", "trl", "warned"), [
    ("trainer", "0.24", False),  # TRL is not in the run
    ("sft", "0.24", False),  # SFTTrainer's step modelled at that release (core/states/trl_adapters.py)
    ("sft", "1.10", True),  # chunked_nll: not modelled
    ("dpo", "0.24", False),  # DPOTrainer's concatenated_forward modelled at that release (s23-trl-releases)
    ("dpo", "1.14", True),  # _get_per_token_logps_and_entropies: not modelled
])
def test_trl_release_warns_only_where_the_release_is_not_modelled(trainer: str, trl: str, warned: bool) -> None:
    spec, _ = _spec(model_name_or_path="gpt2", trainer=trainer, stack=f"trl={trl}", use_peft=True,
                    max_seq_length=128)
    found = [f for f in estimate(spec).findings if f.code == "versions-not-modelled" and f.message.startswith("trl")]
    assert bool(found) is warned
