"""Fuzz every reader: any input ends in a result or a ConfigError (never another exception)."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitcheck.errors import ConfigError, NotModelledError
from fitcheck.readers.accelerate_config import read_accelerate_config
from fitcheck.readers.deepspeed import resolve_deepspeed
from fitcheck.readers.fsdp_config import fsdp_from_config, fsdp_option_string
from fitcheck.readers.model_config import load_inventory
from fitcheck.readers.peft_config import lora_from_mapping
from fitcheck.readers.quantization_config import quant_from_mapping
from fitcheck.readers.run_args import spec_from_values
from fitcheck.readers.sources import parse_mapping_text
from fitcheck.readers.trainer_args import read_script_argv, read_training_args_mapping

# the production TRL-flag reader (run_args) needs an inventory: a small catalog model, read offline
_TINY = load_inventory("meta-llama/Llama-3.2-1B", env={})
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            "auto",
            "cpu",
            "nvme",
            "none",
            "true",
            "false",
            "bf16",
            "fp16",
            "FULL_SHARD",
            "2",
            "-1",
            "5e8",
            "",
            "x",
        ]
    ),
)
values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=8,
)
DS_KEYS = [
    "stage",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "overlap_comm",
    "contiguous_gradients",
    "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "sub_group_size",
    "offload_optimizer",
    "offload_param",
    "cpu_offload",
    "mics_shard_size",
    "bogus",
]
offload = st.one_of(
    values,
    st.fixed_dictionaries(
        {}, optional={"device": values, "pin_memory": values, "nvme_path": values, "ratio": values}
    ),
)
zero = st.dictionaries(st.sampled_from(DS_KEYS), st.one_of(values, offload), max_size=6)
ds_config = st.fixed_dictionaries(
    {},
    optional={
        "train_batch_size": values,
        "train_micro_batch_size_per_gpu": values,
        "gradient_accumulation_steps": values,
        "zero_optimization": st.one_of(zero, values),
        "bf16": st.one_of(values, st.fixed_dictionaries({"enabled": values})),
        "fp16": st.fixed_dictionaries({"enabled": values}),
        "tensor_parallel": values,
        "pipeline": values,
    },
)
run_values = st.fixed_dictionaries(
    {},
    optional={
        "per_device_train_batch_size": values,
        "gradient_accumulation_steps": values,
        "bf16": values,
        "fp16": values,
    },
)


@FUZZ
@given(ds_config, run_values, st.integers(1, 64), st.one_of(st.none(), st.integers(1, 8192)))
def test_fuzz_deepspeed(
    raw: dict[str, object], run: dict[str, object], world: int, hidden: int | None
) -> None:
    with contextlib.suppress(ConfigError):
        resolve_deepspeed(
            raw, source="ds.json", run=run, run_provenance={}, world_size=world, hidden_size=hidden
        )


TA_KEYS = [
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
    "fp16",
    "optim",
    "gradient_checkpointing",
    "activation_checkpointing",
    "torch_dtype",
    "dtype",
    "max_length",
    "lora_target_modules",
    "gradient_checkpointing_kwargs",
    "use_flash_attention_2",
    "whatever",
]


@FUZZ
@given(st.dictionaries(st.sampled_from(TA_KEYS), values, max_size=8))
def test_fuzz_training_args_mapping(raw: dict[str, object]) -> None:
    with contextlib.suppress(ConfigError):
        read_training_args_mapping(raw, source="args.json")


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.sampled_from(
                [f"--{k}" for k in TA_KEYS] + ["--no_bf16", "--no_optim", "--x=1", "--", "--config", "a.json"]
            ),
            st.text(max_size=6),
        ),
        max_size=10,
    )
)
def test_fuzz_script_argv(argv: list[str]) -> None:
    with contextlib.suppress(ConfigError):
        read_script_argv(argv)


FSDP_KEYS = [
    "fsdp_version",
    "version",
    "fsdp_sharding_strategy",
    "reshard_after_forward",
    "fsdp_offload_params",
    "cpu_offload",
    "fsdp_auto_wrap_policy",
    "min_num_params",
    "fsdp_use_orig_params",
    "activation_checkpointing",
    "transformer_layer_cls_to_wrap",
    "junk",
]


@FUZZ
@given(
    st.dictionaries(st.sampled_from(FSDP_KEYS), values, max_size=6),
    st.sampled_from(["accelerate", "trainer"]),
    values,
)
def test_fuzz_fsdp(cfg: dict[str, object], flavour: str, option: object) -> None:
    with contextlib.suppress(ConfigError):
        fsdp_from_config(cfg, source="fsdp", flavour=flavour)
    with contextlib.suppress(ConfigError):
        fsdp_option_string(option, at="--fsdp")


ACC_KEYS = [
    "distributed_type",
    "num_processes",
    "num_machines",
    "mixed_precision",
    "deepspeed_config",
    "fsdp_config",
    "parallelism_config",
    "fp16",
    "unknown_key",
]


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(ACC_KEYS),
        st.one_of(values, st.sampled_from(["NO", "MULTI_GPU", "DEEPSPEED", "FSDP", "MEGATRON_LM"])),
        max_size=6,
    ),
    st.text(max_size=40),
)
def test_fuzz_accelerate(raw: dict[str, object], junk: str) -> None:
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        for text in (yaml.safe_dump(raw), junk):
            path = Path(tmp) / "a.yaml"
            path.write_text(text)
            with contextlib.suppress(ConfigError):
                read_accelerate_config(str(path))


@FUZZ
@given(st.text(max_size=60), st.booleans())
def test_fuzz_parse_text(text: str, as_json: bool) -> None:
    with contextlib.suppress(ConfigError):
        parse_mapping_text(text, source="f", what="file", prefer_json=as_json)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "quant_method",
                "load_in_4bit",
                "load_in_8bit",
                "bnb_4bit_quant_type",
                "bnb_4bit_compute_dtype",
                "bnb_4bit_quant_storage",
                "llm_int8_skip_modules",
                "dtype",
                "use_bnb_nested_quant",
            ]
        ),
        values,
        max_size=6,
    )
)
def test_fuzz_quantization(raw: dict[str, object]) -> None:
    for fn in (lambda: quant_from_mapping(raw, source="q"), lambda: spec_from_values(raw, inventory=_TINY)):
        with contextlib.suppress(ConfigError):
            fn()


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "r",
                "lora_alpha",
                "lora_dropout",
                "target_modules",
                "modules_to_save",
                "use_dora",
                "layers_to_transform",
                "rank_pattern",
                "peft_type",
                "use_peft",
                "lora_r",
                "lora_target_modules",
            ]
        ),
        values,
        max_size=6,
    )
)
def test_fuzz_peft(raw: dict[str, object]) -> None:
    for fn in (lambda: lora_from_mapping(raw, source="a"), lambda: spec_from_values(raw, inventory=_TINY)):
        with contextlib.suppress(ConfigError, NotModelledError):
            fn()


def test_hostile_inputs_under_a_memory_cap(tmp_path: Path) -> None:
    """Issue 21: >= 250 hostile or mistaken inputs over every reader, flag and API entry point
    (``tests/hostile_inputs.py``; session 7: every spelling of every ``estimate`` flag gets 3 hostile values, 18
    flags 14 each), run in a subprocess capped at 8 GB of address space with a time limit per case:
    no traceback, no hang, no memory blow-up, nothing written outside the inputs, no code run."""
    import json
    import os
    import resource
    import subprocess
    import sys

    work = tmp_path / "work"
    work.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    cap = 8 * 10**9  # torch + transformers map ~3 GB of address space; an alias bomb grew past 6 GB a minute

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    driver = Path(__file__).with_name("hostile_inputs.py")
    env = {**os.environ, "HOME": str(home), "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.run([sys.executable, str(driver), str(work)], capture_output=True, text=True,
                          timeout=3000, preexec_fn=limit, env=env, cwd=work)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in lines if "name" in r]
    assert lines[-1] == {"written": []}  # no file written beside the inputs
    assert len(rows) >= 250
    assert sum(r["name"].startswith("flag-all--") for r in rows) >= 3 * 150  # every estimate flag
    bad = [r for r in rows if r["traceback"] or (r["outcome"] not in ("exit 0", "exit 1", "exit 2")
           and not r["outcome"].startswith("refused"))]
    assert not bad, bad[:10]
    inputs_only = {p.name for p in work.iterdir()}
    assert "pwned-by-fitcheck-input" not in inputs_only  # no YAML tag, shell value or remote code ran
    written = [p for p in home.rglob("*") if p.is_file()]
    assert not written, written[:5]  # nothing cached, logged or plotted anywhere
    assert not (work / "missing").exists()
