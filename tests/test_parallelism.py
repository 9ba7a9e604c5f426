"""Tensor/context/sequence parallelism (issue 14): plans vs transformers, per-rank shards vs a real TP load on
a fake process group, accelerate's layout checks vs accelerate's own ParallelismConfig, readers, CLI, advisor."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fitcheck.cli.main import main
from fitcheck.core.parallelism import layout_problems, rank_local_spec, size_problems
from fitcheck.core.parallelism.tp_plan import LM_HEAD_STYLE, local_inventory, style_of, tp_plan
from fitcheck.families import FAMILIES, traits_of_type
from fitcheck.readers import inventory_from_config
from fitcheck.spec import ParallelismSpec, Strategy

LLAMA8 = ["--model_name_or_path", "meta-llama/Llama-3.1-8B", "--dtype", "bfloat16", "--bf16", "--gpu", "H100-80GB"]
LONG = [*LLAMA8, "--per_device_train_batch_size", "1", "--max_seq_length", "65536", "--gradient_checkpointing"]
FSDP = ["--fsdp", "full_shard auto_wrap"]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(["estimate", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------------------------------------- tp_plan


# the base_model_tp_plan each family module declares (fitcheck/families)
TP_PLANS = {t: dict(plan) for t in FAMILIES if (plan := traits_of_type(t).tp_plan) is not None}


@pytest.mark.parametrize("family", sorted(TP_PLANS))
def test_tp_plans_equal_installed_transformers(family: str) -> None:
    from transformers import CONFIG_MAPPING

    assert TP_PLANS[family] == CONFIG_MAPPING[family].base_model_tp_plan


def test_lm_head_rule_equals_the_causal_lm_classes() -> None:
    from transformers import LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM

    for cls in (LlamaForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM):
        assert cls._tp_plan == {"lm_head": LM_HEAD_STYLE}


_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


@pytest.fixture(scope="module")
def fake_world() -> Iterator[int]:
    """A 4-rank world on torch's fake process group (collectives are no-ops; this process is rank 0)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    saved = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    os.environ.update(WORLD_SIZE="4", RANK="0", LOCAL_RANK="0")
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        yield 4
    finally:
        dist.destroy_process_group()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize(
    ("family", "arch", "extra"),
    [
        ("llama", "LlamaForCausalLM", {}),
        ("qwen2", "Qwen2ForCausalLM", {}),
        ("mixtral", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ],
)
def test_rank_shards_equal_transformers_tp_load_on_fake_pg(
    fake_world: int, tmp_path: Path, family: str, arch: str, extra: dict[str, Any]
) -> None:
    """from_pretrained(tp_plan="auto") on a fake 4-rank world: every local shard equals the formula's."""
    import transformers

    config = {**_TINY, **extra, "model_type": family, "architectures": [arch]}
    cfg = transformers.CONFIG_MAPPING[family](**{k: v for k, v in config.items() if k != "architectures"})
    getattr(transformers, arch)(cfg).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, tp_plan="auto")
    real: dict[str, tuple[int, ...]] = {}
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        real[name.replace(".0.", ".*.", 1) if ".layers.0." in name else name] = tuple(local.shape)
    inv = local_inventory(inventory_from_config(config, family, "test"), fake_world)
    ours = {p.name: p.shape for p in inv.params}
    assert {k: v for k, v in real.items() if ".layers.1." not in k} == ours


def test_families_without_a_plan_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model_name_or_path", "openai-community/gpt2", "--num_processes", "2",
                 *FSDP, "--tp_size", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "has no tp_plan" in err


def test_style_lookup_norms_replicated_embeddings_vocab_parallel() -> None:
    inv = inventory_from_config({**_TINY, "model_type": "llama"}, "llama", "test")
    plan = tp_plan(inv.shape)
    assert plan is not None
    styles = {p.name: style_of(p, plan) for p in inv.params}
    assert styles["model.embed_tokens.weight"] == "embedding_rowwise" and styles["model.norm.weight"] is None
    assert styles["lm_head.weight"] == "colwise_gather_output"


# ----------------------------------------------------------------------------------- accelerate's checks


@pytest.mark.parametrize(
    "sizes",
    [
        {"cp_size": 2, "sp_size": 2, "dp_shard_size": 2},
        {"tp_size": 2, "dp_replicate_size": 2},
        {"cp_size": 2, "dp_replicate_size": 2},
        {"sp_backend": "megatron", "sp_size": 2},
        {"dp_shard_size": 2, "tp_size": 2},
    ],
)
def test_size_checks_agree_with_accelerate(sizes: dict[str, Any]) -> None:
    """Our __post_init__ checks refuse exactly what accelerate's ParallelismConfig refuses."""
    from accelerate.parallelism_config import ParallelismConfig

    try:
        ParallelismConfig(**sizes)
        accelerate_refuses = False
    except ValueError:
        accelerate_refuses = True
    names = {"dp_replicate_size": "dp_replicate", "dp_shard_size": "dp_shard", "tp_size": "tp", "cp_size": "cp",
             "sp_size": "sp", "sp_backend": "sp_backend"}
    par = ParallelismSpec(**{names[k]: v for k, v in sizes.items()})
    problems = [p for p in size_problems(par, par.total, Strategy.FSDP) if "needs DeepSpeed" not in p]
    assert bool(problems) == accelerate_refuses, problems


def test_process_count_mismatch_exits_2_naming_sizes_and_processes(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", *LONG, *FSDP, "--num_processes", "8", "--cp_size", "4", "--dp_shard_size", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "total_size (4) does not match num_processes (8)" in err
    assert "cp_size=4 (--cp_size)" in err and "--num_processes 4" in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--num_processes", "8", "--sp_size", "8"], "needs DeepSpeed"),
        (["--num_processes", "8", "--zero_stage", "3", "--cp_size", "8"], "FSDP2"),
        (["--num_processes", "8", *FSDP, "--cp_size", "8", "--attn_implementation", "eager"], "sdpa"),
        (["--num_processes", "4", *FSDP, "--cp_size", "2", "--sp_size", "2"], "mutually exclusive"),
    ],
)
def test_invalid_combinations_exit_2(capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    code = main(["estimate", *LONG, *extra])
    assert code == 2 and needle in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- readers


def test_layout_from_accelerate_yaml_as_accelerate_config_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "acc.yaml"
    cfg.write_text(
        "distributed_type: FSDP\nnum_processes: 8\nmixed_precision: bf16\n"
        "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
        "parallelism_config:\n  parallelism_config_dp_replicate_size: 1\n  parallelism_config_dp_shard_size: 2\n"
        "  parallelism_config_tp_size: 1\n  parallelism_config_cp_size: 4\n"
        "  parallelism_config_cp_comm_strategy: alltoall\n"
    )
    code, j = _json(capsys, *LONG, "--config_file", str(cfg))
    assert j["parallelism"] == {"dp_replicate": 1, "dp_shard": 2, "tp": 1, "cp": 4, "sp": 1}
    assert code in (0, 1)


def test_layout_from_training_args_and_flag_precedence(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"parallelism_config": {"dp_shard_size": 2, "cp_size": 4}}))
    code, j = _json(capsys, *LONG, *FSDP, "--num_processes", "8", "--training_args", str(args))
    assert code in (0, 1) and j["parallelism"]["cp"] == 4 and j["parallelism"]["dp_shard"] == 2
    _, j = _json(capsys, *LONG, *FSDP, "--num_processes", "8", "--training_args", str(args),
                 "--cp_size", "8", "--dp_shard_size", "1")
    assert j["parallelism"]["cp"] == 8
    assert any(f["code"] == "conflicting-sources" for f in j["findings"])


def test_sp_size_from_deepspeed_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                              "sequence_parallel_size": 8, "train_micro_batch_size_per_gpu": 1}))
    code, j = _json(capsys, *LONG, "--num_processes", "8", "--deepspeed", str(ds))
    assert j["parallelism"]["sp"] == 8 and j["fits"] is True and code == 0
    assert "parallel.ulysses_all_to_all" in {c["name"] for c in j["component_detail"]}


# ------------------------------------------------------------------------------------- done means


def test_llama8b_64k_fits_with_cp8_or_sp8_and_not_without(capsys: pytest.CaptureFixture[str]) -> None:
    # the formulas on both (a cp rank is never traced; the plain FSDP mixed-precision run at 64k, outside its
    # kind's checked range, would be traced by default as its 16-bit module: pinned_path.untraced_parts)
    code, plain = _json(capsys, *LONG, *FSDP, "--num_processes", "8", "--no_trace")
    assert code == 1 and not plain["fits"]
    code, cp = _json(capsys, *LONG, *FSDP, "--num_processes", "8", "--cp_size", "8", "--no_trace")
    assert code == 0 and cp["fits"]
    # per-rank logits and activations are 1/8 of the single-rank ones (same sequence, 1/8 of its tokens)
    assert cp["components"]["logits.loss"] * 8 == pytest.approx(plain["components"]["logits.loss"], rel=1e-3)
    assert cp["components"]["optimizer.states"] == plain["components"]["optimizer.states"]  # dp_shard x cp = 8
    code, sp = _json(capsys, *LONG, "--num_processes", "8", "--zero_stage", "3", "--sp_size", "8")
    assert code == 0 and sp["fits"]


def test_llama70b_tp8_dp_shard4_itemised(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model_name_or_path", "meta-llama/Llama-3.1-70B", "--dtype", "bfloat16", "--bf16",
            "--per_device_train_batch_size", "1", "--max_seq_length", "8192", "--gradient_checkpointing",
            "--gpu", "H100-80GB", "--num_processes", "32", "--num_machines", "4", *FSDP]
    _, j = _json(capsys, *argv, "--tp_size", "8", "--dp_shard_size", "4")
    assert j["parallelism"] == {"dp_replicate": 1, "dp_shard": 4, "tp": 8, "cp": 1, "sp": 1}
    _, fsdp32 = _json(capsys, *argv)
    # tp splits every matrix 8 ways and FSDP then shards over 4: 1/32 of each matrix per GPU, as FSDP over 32
    # (only the replicated norms grow), so the states stay within 1% of plain FSDP
    assert j["components"]["optimizer.states"] == pytest.approx(fsdp32["components"]["optimizer.states"], rel=0.01)
    assert j["compute"]["parallel_comm_seconds"] > 0


def test_rank_local_spec_is_identity_without_layout() -> None:
    from fitcheck.readers import load_inventory
    from fitcheck.spec import TrainingSpec

    spec = TrainingSpec(model=load_inventory("meta-llama/Llama-3.1-8B", env={}))
    assert rank_local_spec(spec) is spec and layout_problems(spec) == []


def test_advisor_proposes_context_parallel_for_64k(capsys: pytest.CaptureFixture[str]) -> None:
    code, j = _json(capsys, *LONG, *FSDP, "--num_processes", "8")
    assert code == 1
    # Liger's fused loss (same training, no extra communication) may rank first; a cp layout must be offered
    fitting = [s for s in j["suggestions"] if s["fits"] and "--cp_size" in s["argv"]]
    assert fitting and fitting[0]["tier"] == "same training"
    first = fitting[0]
    argv = first["argv"]
    _, again = _json(capsys, *LONG, *FSDP, "--num_processes", "8", *argv)
    assert again["device_used_bytes"] == first["device_used_bytes"]  # the flags reproduce the estimate


def test_tp_rank_step_on_fake_pg_matches_estimate(fake_world: int, tmp_path: Path) -> None:
    """A real transformers TP forward of rank 0 (fake 4-rank world, CPU, live-tensor tracker): the rank's weights
    are exact and the bytes alive at the end of forward match the estimate within 1%."""
    import torch
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core import estimate
    from fitcheck.report import Phase
    from fitcheck.torch_adapters.live_tracker import LiveTensorTracker

    class LocalShardTracker(LiveTensorTracker):
        def _add(self, tensor: object) -> None:
            super()._add(tensor._local_tensor if isinstance(tensor, DTensor) else tensor)

    config = {**_TINY, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 512}
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="sdpa",
                                                 tp_plan="auto")
    model.train()
    local = [p._local_tensor if isinstance(p, DTensor) else p for p in model.parameters()]
    tracker = LocalShardTracker()
    tracker.track(local)
    base = tracker.current
    tracker.start()
    try:
        ids = torch.randint(0, 512, (2, 64))
        out = model(input_ids=ids, labels=ids)
        forward_end = tracker.current - base
        del out
    finally:
        tracker.stop()
    spec, _ = spec_from_values(
        {"model_name_or_path": str(tmp_path), "dtype": "float32", "per_device_train_batch_size": "2",
         "max_seq_length": "64", "device_type": "cpu", "attn_implementation": "sdpa", "optim": "sgd",
         "num_processes": str(fake_world), "tp_size": str(fake_world)},
        {},
    )
    rep = estimate(spec)
    weights = sum(c.at(Phase.FORWARD_END) for c in rep.components if c.name.startswith("weights"))
    assert weights == sum(p.numel() * p.element_size() for p in local)
    assert rep.phase_totals()[Phase.FORWARD_END] - weights == pytest.approx(forward_end, rel=0.01)


def test_live_accelerate_parallelism_config_object_is_read() -> None:
    """TrainingArguments.parallelism_config holds an accelerate ParallelismConfig object, not a mapping."""
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import TorchContextParallelConfig

    from fitcheck.readers.parallelism import read_parallelism

    handler = TorchContextParallelConfig(cp_comm_strategy="alltoall")
    obj = ParallelismConfig(dp_shard_size=2, cp_size=4, cp_handler=handler)
    read = read_parallelism({}, obj, "TrainingArguments.parallelism_config", None, "", None, "")
    assert read.spec == ParallelismSpec(dp_shard=2, cp=4, cp_comm_strategy="alltoall")


def test_hsdp_shards_within_dp_shard_and_replicates(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*LLAMA8, "--per_device_train_batch_size", "1", "--max_seq_length", "4096", "--gradient_checkpointing",
            "--num_processes", "16", "--num_machines", "2", *FSDP]
    _, hsdp = _json(capsys, *argv, "--dp_replicate_size", "2", "--dp_shard_size", "8")
    _, fsdp16 = _json(capsys, *argv)
    assert hsdp["parallelism"] == {"dp_replicate": 2, "dp_shard": 8, "tp": 1, "cp": 1, "sp": 1}
    # one copy of the states over 8 ranks instead of 16
    assert hsdp["components"]["optimizer.states"] == pytest.approx(2 * fsdp16["components"]["optimizer.states"],
                                                                   rel=1e-3)


def test_cp_ring_buffer_holds_the_whole_sequences_keys_and_values(capsys: pytest.CaptureFixture[str]) -> None:
    """At a fixed per-rank length, the all-gathered k/v grow with the whole sequence; alltoall keeps one chunk."""
    def ring(cp: str, seq: str, *extra: str) -> int:
        _, j = _json(capsys, *LLAMA8, "--per_device_train_batch_size", "1", "--max_seq_length", seq,
                     "--gradient_checkpointing", "--num_processes", "8", *FSDP, "--dp_shard_size", str(8 // int(cp)),
                     "--cp_size", cp, *extra)
        return next(c["bytes_by_phase"]["during backward"] for c in j["component_detail"]
                    if c["name"] == "parallel.cp_ring_attention")
    kv_full = 2 * 65536 * 8 * 128 * 2  # k and v of 65,536 tokens, 8 kv heads x 128, bf16
    assert ring("8", "65536") - ring("4", "32768") == pytest.approx(kv_full - kv_full // 2, rel=1e-6)
    assert ring("8", "65536", "--cp_comm_strategy", "alltoall") < ring("8", "65536")


def test_deepspeed_train_batch_size_counts_data_parallel_ranks_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With Ulysses SP, train_batch_size = micro x accumulation x (processes / sp) is consistent."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}, "bf16": {"enabled": True},
                              "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                              "train_batch_size": 4}))
    code, j = _json(capsys, *LONG, "--num_processes", "8", "--deepspeed", str(ds), "--sp_size", "4")
    assert code in (0, 1) and j["parallelism"]["sp"] == 4 and j["gradient_accumulation_steps"] == 2


def test_step_time_counts_data_parallel_tokens_and_adds_the_layouts_collectives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, plain = _json(capsys, *LONG, *FSDP, "--num_processes", "8")
    _, cp = _json(capsys, *LONG, *FSDP, "--num_processes", "8", "--cp_size", "8")
    # 8 data-parallel ranks see 8 sequences per step; cp 8 shares one sequence over the 8 GPUs
    assert plain["compute"]["tokens_per_step"] == 8 * cp["compute"]["tokens_per_step"] == 8 * 65536
    assert cp["compute"]["num_gpus"] == 8 and plain["compute"]["parallel_comm_seconds"] == 0
    assert cp["compute"]["parallel_comm_seconds"] > 0
    per_token_plain = plain["compute"]["step_seconds"] / plain["compute"]["tokens_per_step"]
    per_token_cp = cp["compute"]["step_seconds"] / cp["compute"]["tokens_per_step"]
    assert per_token_plain < per_token_cp < 1.2 * per_token_plain  # same FLOPs per token, plus the k/v gathers


def test_lora_adapters_under_tp_equal_peft_shards_on_fake_pg(fake_world: int, tmp_path: Path) -> None:
    """peft 0.21 shards lora_B of colwise and lora_A of rowwise layers with the base layer (lora/layer.py
    _hf_tp_plan); the rank-local inventory gives the same adapter elements per rank."""
    import transformers
    from peft import LoraConfig, get_peft_model

    from fitcheck.cli.estimate import spec_from_values
    from fitcheck.core.states import adapter_param_count

    config = {**_TINY, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**_TINY)).save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, tp_plan="auto")
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    real = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
               for n, p in peft_model.named_parameters() if "lora_" in n)
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(config))
    spec, _ = spec_from_values(
        {"model_name_or_path": str(tmp_path / "cfg"), "dtype": "float32", "use_peft": True, "lora_r": "8",
         "lora_target_modules": ["all-linear"], "num_processes": str(fake_world), "tp_size": str(fake_world),
         "max_seq_length": "64"},
        {},
    )
    assert adapter_param_count(rank_local_spec(spec)) == real
