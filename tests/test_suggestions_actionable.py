"""Issue 21, item 2: what fitcheck suggests can be acted on as printed.

Every suggestion printed for a fixed set of configurations is built into the real libraries' own objects
(transformers ``TrainingArguments`` / TRL ``SFTConfig`` + ``ModelConfig`` through ``HfArgumentParser``, peft
``LoraConfig`` and transformers ``BitsAndBytesConfig`` through TRL's ``get_peft_config`` /
``get_quantization_config``, DeepSpeed's ``DeepSpeedZeroConfig``) and their validation runs. A ``device_map`` run
gets no suggestion accelerate would refuse; no suggestion carries a flag twice.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fitcheck.cli.main import main

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")

MODEL = "meta-llama/Llama-3.2-1B"
BIG = "meta-llama/Llama-3.2-3B"

# Fitcheck flags that are no TrainingArguments/TRL field: each is checked by the library it configures below.
_PARALLELISM = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
_FITCHECK_ONLY = {"zero_stage", "offload_optimizer", "offload_param", "checkpoint_every_n_layers", "num_processes",
                  "fsdp_version", "gpu", "gpu_memory", "max_seq_length", *_PARALLELISM}


def _configs() -> list[list[str]]:
    """>= 50 configurations: models x budgets x methods x batch shapes, most of them not fitting."""
    out: list[list[str]] = []
    for model in (MODEL, BIG):
        for gpu in ("RTX4080-16GB", "T4-16GB", "L4-24GB"):
            for method in ([], ["--use_peft", "--lora_target_modules", "all-linear"],
                           ["--gradient_checkpointing"], ["--optim", "adamw_bnb_8bit"]):
                for batch in (["--per_device_train_batch_size", "8"],
                              ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "4"]):
                    out.append(["--model_name_or_path", model, "--gpu", gpu, "--bf16", *method, *batch])
    out.append(["--model_name_or_path", BIG, "--gpu", "T4-16GB", "--num_processes", "2", "--bf16"])
    out.append(["--model_name_or_path", BIG, "--gpu", "L4-24GB", "--num_processes", "4", "--zero_stage", "2"])
    return out


def _suggestions(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()  # what importing DeepSpeed printed ("Setting accelerator to CPU")
    code = main(["estimate", *argv, "--no_trace", "--json", "--max_seq_length", "2048"])
    assert code in (0, 1, 2)
    out: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["suggestions"]
    return out


def _flag_values(argv: list[str]) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    current = ""
    for tok in argv:
        if tok.startswith("--"):
            current = tok[2:].replace("-", "_")
            values[current] = []
        else:
            values[current].append(tok)
    return values


def _validate(argv: list[str], tmp: str) -> None:
    """Build the libraries' objects for one full command line (base + suggestion) and run their validation."""
    from transformers import HfArgumentParser

    values = _flag_values(argv)
    ta_argv: list[str] = ["--output_dir", tmp, "--report_to", "none", "--use_cpu", "true"]
    for name, vals in values.items():
        if name in _FITCHECK_ONLY or name == "model_name_or_path":
            continue
        ta_argv += [f"--{name}", *(vals or ["true"])]
    ta_argv += ["--model_name_or_path", values["model_name_or_path"][0]]
    parser = HfArgumentParser((trl.SFTConfig, trl.ModelConfig))
    sft, model_config, rest = parser.parse_args_into_dataclasses(args=ta_argv, return_remaining_strings=True)
    assert not rest, rest  # every flag is a TrainingArguments/TRL field or one fitcheck checks itself
    peft_config = trl.get_peft_config(model_config)  # peft LoraConfig.__post_init__
    if model_config.use_peft:
        assert peft_config is not None
    if model_config.load_in_4bit or model_config.load_in_8bit:
        assert trl.get_quantization_config(model_config) is not None  # BitsAndBytesConfig.post_init
    assert sft.per_device_train_batch_size >= 1 and sft.gradient_accumulation_steps >= 1
    if "zero_stage" in values:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        zero: dict[str, Any] = {"stage": int(values["zero_stage"][0])}
        for key in ("offload_optimizer", "offload_param"):
            if key in values:
                zero[key] = {"device": values[key][0]}
        DeepSpeedZeroConfig(**zero)  # pydantic validation of the zero_optimization section
    sizes = {k: int(values[k][0]) for k in _PARALLELISM if k in values}
    if sizes:
        from accelerate.parallelism_config import ParallelismConfig

        ParallelismConfig(**sizes)  # accelerate's own checks of the layout sizes
    if "checkpoint_every_n_layers" in values:
        assert int(values["checkpoint_every_n_layers"][0]) >= 1 and sft.gradient_checkpointing


def test_every_printed_suggestion_passes_the_libraries_checks(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    pytest.importorskip("deepspeed")
    configs = _configs()
    assert len(configs) >= 50
    checked = 0
    for base in configs:
        for s in _suggestions(base, capsys):
            argv = list(s["argv"])
            names = [t for t in argv if t.startswith("--")]
            assert len(names) == len(set(names)), (base, argv)  # never a flag twice in one suggestion
            full = _flag_values([*base, *argv])  # appended to the same command: the suggestion's values win
            merged = [t for name, vals in full.items() for t in (f"--{name}", *vals)]
            _validate(merged, str(tmp_path))
            checked += 1
    assert checked >= 100


def test_device_map_run_gets_no_distributed_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    accelerator = pytest.importorskip("accelerate.accelerator")
    from pathlib import Path

    # accelerate 1.15 accelerator.py prepare_model: a device_map model in any distributed mode is refused
    assert "in any distributed mode" in Path(accelerator.__file__).read_text()
    for extra in ([], ["--max_memory", "0=4GiB,1=4GiB"]):
        code = main(["estimate", "--model_name_or_path", BIG, "--device_map", "auto", "--gpu", "T4-16GB",
                     "--no_trace", "--json", "--per_device_train_batch_size", "1", *extra])
        out = json.loads(capsys.readouterr().out)
        assert code in (0, 1)
        for s in out["suggestions"]:
            assert not {"--zero_stage", "--fsdp", "--num_processes"} & set(s["argv"]), s["argv"]


def test_device_map_budget_is_the_card_on_one_and_two_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    from fitcheck.catalog import lookup_gpu

    card = lookup_gpu("T4-16GB").memory_bytes
    base = ["estimate", "--model_name_or_path", BIG, "--device_map", "auto", "--gpu", "T4-16GB", "--no_trace",
            "--json", "--per_device_train_batch_size", "1", "--use_peft", "--lora_target_modules", "all-linear",
            "--gradient_checkpointing"]
    main([*base, "--max_memory", "0=4GiB"])
    one = json.loads(capsys.readouterr().out)
    main([*base, "--max_memory", "0=4GiB,1=4GiB"])
    two = json.loads(capsys.readouterr().out)
    assert one["budget_bytes"] == card
    assert len(two["device_map_gpus"]) == 2
    assert two["budget_bytes"] == card  # was 4 GiB: max_memory bounds the weights' placement only
    assert all(g["budget_bytes"] == card for g in two.get("device_map_gpus", []))


def test_zero_offload_of_a_bitsandbytes_optimizer_counts_deepspeed_cpu_adam(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = ["estimate", "--model_name_or_path", MODEL, "--zero_stage", "2", "--offload_optimizer", "cpu",
            "--no_trace", "--json"]
    main([*base, "--optim", "adamw_bnb_8bit"])
    bnb = json.loads(capsys.readouterr().out)
    main([*base, "--optim", "adamw_torch"])
    torch_adam = json.loads(capsys.readouterr().out)
    assert bnb["host_bytes"] == torch_adam["host_bytes"]  # the same DeepSpeedCPUAdam fp32 states on the host
    assert "ds-cpu-optimizer" in {f["code"] for f in bnb["findings"]}


def test_accelerate_replaces_a_bitsandbytes_optimizer_under_offload() -> None:
    """What the finding says, on the real libraries: accelerate's own mapping returns DeepSpeedCPUAdam."""
    torch = pytest.importorskip("torch")
    bnb = pytest.importorskip("bitsandbytes")
    pytest.importorskip("deepspeed")
    from pathlib import Path

    from accelerate.utils.deepspeed import map_pytorch_optim_to_deepspeed

    built = list((Path.home() / ".cache" / "torch_extensions").glob("*/cpu_adam"))
    if not built:  # DeepSpeed JIT-compiles its cpu_adam op on first use (8 minutes on a 2-core machine)
        pytest.skip("DeepSpeed's cpu_adam op is not built on this machine")

    layer = torch.nn.Linear(8, 8)
    try:
        replaced = map_pytorch_optim_to_deepspeed(bnb.optim.AdamW8bit(layer.parameters(), lr=1e-3))
    except Exception as exc:  # DeepSpeed's cpu_adam op could not be built on this machine
        pytest.skip(f"DeepSpeedCPUAdam unavailable here: {exc}")
    assert type(replaced).__name__ == "DeepSpeedCPUAdam"


@pytest.mark.parametrize("accelerate_flags", [[], ["--num_processes", "2"],
                                              ["--num_processes", "4", "--use_deepspeed", "--zero_stage", "2"]],
                         ids=["one-gpu", "ddp-2", "zero2-4"])
def test_launch_suggestions_carry_each_flag_once_and_pass_the_libraries_checks(
    accelerate_flags: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """The issue saw ``--gradient_accumulation_steps 4 … --gradient_accumulation_steps 16`` in ``fitcheck launch``
    and in sequence-parallel suggestions: every suggestion ``fitcheck launch --check-only`` prints for a run that
    does not fit (with sequence-parallel ones on 4 GPUs) carries each flag once and, merged into the script's
    arguments, passes the same checks as above."""
    pytest.importorskip("accelerate")
    pytest.importorskip("deepspeed")
    from fitcheck.cli import launch

    script_args = ["--model_name_or_path", BIG, "--per_device_train_batch_size", "8",
                   "--gradient_accumulation_steps", "4", "--bf16", "--max_seq_length", "4096"]
    argv = ["--check-only", "--json", "--gpu", "T4-16GB", *accelerate_flags, "examples/launch/train.py",
            *script_args]
    capsys.readouterr()
    code = launch.main(argv, env={"HOME": "/nonexistent-home", "HF_HOME": "/nonexistent-hf-home"})
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and not out["fits"]
    suggestions = out["suggestions"]
    assert suggestions
    for s in suggestions:
        names = [t for t in s["argv"] if t.startswith("--")]
        assert len(names) == len(set(names)), s["argv"]
        full = _flag_values([*script_args, *s["argv"]])
        _validate([t for name, vals in full.items() for t in (f"--{name}", *vals)], str(tmp_path))
    if "--zero_stage" in accelerate_flags:
        assert any("--sp_size" in s["argv"] for s in suggestions)  # sequence-parallel suggestions were checked


# A 2-layer Llama (a few seconds to trace) and a prefix-tuning adapter: on main the advisor printed gradient
# checkpointing for it, which peft refuses and the Trainer's step fails on (core/states/peft_adapter.py).
_TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
               "intermediate_size": 172, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
               "vocab_size": 1000, "max_position_embeddings": 2048, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16"}
_PREFIX = {"peft_type": "PREFIX_TUNING", "task_type": "CAUSAL_LM", "num_virtual_tokens": 8}


def _adapter_step(config: dict[str, Any], adapter: dict[str, Any], values: dict[str, list[str]]) -> None:
    """The suggested run's adapter on the real libraries: peft builds it (``PeftConfig.from_peft_type``,
    ``get_peft_model``), the Trainer's gradient checkpointing is enabled as ``Trainer.train`` does (after the wrap),
    and one real forward + backward on CPU must give every trainable tensor a gradient."""
    import torch
    from peft import PeftConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(LlamaConfig(**config)), PeftConfig.from_peft_type(**adapter))
    if "gradient_checkpointing" in values:
        model.gradient_checkpointing_enable()
    model.train()
    ids = torch.randint(0, config["vocab_size"], (1, 16))
    model(input_ids=ids, labels=ids, attention_mask=torch.ones_like(ids)).loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_every_suggestion_for_a_non_lora_adapter_run_is_accepted_and_trains(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """A run with a PEFT method other than LoRA (``--adapter_config``) that does not fit: every printed suggestion
    is one fitcheck itself estimates (no exit 2: no LoRA/QLoRA, ZeRO/FSDP/offload or TRL switch), passes the same
    TrainingArguments checks as above, and the suggested run's adapter trains one real step."""
    pytest.importorskip("peft")
    (tmp_path / "config.json").write_text(json.dumps(_TINY_LLAMA))
    adapter = tmp_path / "adapter_config.json"
    adapter.write_text(json.dumps(_PREFIX))
    base = ["--model_name_or_path", str(tmp_path), "--gpu_memory", "0.8GiB", "--bf16",
            "--per_device_train_batch_size", "8", "--max_seq_length", "1024", "--adapter_config", str(adapter)]
    capsys.readouterr()
    assert main(["estimate", *base, "--json"]) == 1
    suggestions = json.loads(capsys.readouterr().out)["suggestions"]
    assert len(suggestions) >= 2
    for s in suggestions:
        full = _flag_values([*base, *s["argv"]])
        merged = [t for name, vals in full.items() for t in (f"--{name}", *vals)]
        assert main(["estimate", *merged, "--json"]) in (0, 1), s["argv"]  # fitcheck estimates what it printed
        capsys.readouterr()
        _validate([t for name, vals in full.items() if name not in ("adapter_config", "gpu_memory")
                   for t in (f"--{name}", *vals)], str(tmp_path / "out"))
        _adapter_step(_TINY_LLAMA, _PREFIX, full)
