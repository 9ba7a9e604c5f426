"""The dtype a TRL trainer given a model by name loads it in (``core/states/trl_adapters.py`` ``trl_load_dtype``).

TRL >= 0.27's ``create_model_from_path`` defaults to float32 (0.26: ``"auto"``; before: no dtype, transformers'
default), so ``--trainer X`` without ``--dtype`` is estimated with fp32 weights where transformers 5 alone would load
config.json's bf16. Checked against the real installed TRL (``SFTTrainer`` / ``DPOTrainer`` built from a saved tiny
checkpoint's directory name) and against the rows ``benchmarks/trl_load_dtype.py --record`` stored from the side
venvs' TRL 0.20 - 1.6.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from benchmark_module import load_benchmark

from fitcheck.core.states import TrlLoadDtype, reference_loads_by_name, trl_load_dtype
from fitcheck.core.trainers import trainer_row
from fitcheck.errors import ConfigError
from fitcheck.readers import read_script_argv, read_training_args_object, spec_from_values
from fitcheck.readers.trainer_args import read_training_args_file
from fitcheck.spec import Dtype, TrainerKind

bench = load_benchmark("trl_load_dtype")


def test_release_rules_read_at_the_tags() -> None:
    assert trl_load_dtype(None) is TrlLoadDtype.FLOAT32  # the modelled 1.16
    assert trl_load_dtype((1, 16, 0)) is trl_load_dtype((0, 27, 0)) is TrlLoadDtype.FLOAT32
    assert trl_load_dtype((0, 26, 2)) is TrlLoadDtype.AUTO
    assert trl_load_dtype((0, 25, 1)) is trl_load_dtype((0, 13)) is TrlLoadDtype.TRANSFORMERS
    dpo, grpo = (trainer_row(k).reference_by_name_from for k in (TrainerKind.DPO, TrainerKind.GRPO))
    assert reference_loads_by_name(dpo, (0, 29)) and not reference_loads_by_name(dpo, (0, 28))
    assert reference_loads_by_name(grpo, (0, 19)) and not reference_loads_by_name(grpo, (0, 18))
    kto = trainer_row(TrainerKind.KTO).reference_by_name_from
    assert reference_loads_by_name(kto, (1, 2)) and not reference_loads_by_name(kto, (1, 1))
    assert not any(reference_loads_by_name(trainer_row(k).reference_by_name_from, r) for k in TrainerKind
                   for r in ((1, 16), None))


def _load(**values: object) -> tuple[Dtype, tuple[str, ...]]:
    spec, notes = spec_from_values(values, inventory=bench.tiny_inventory())  # config.json: bfloat16
    return spec.precision.load_dtype, notes


def test_trainer_kinds_load_by_release() -> None:
    dtype, notes = _load(trainer="sft", stack="trl=1.16,transformers=5.23")
    assert dtype is Dtype.FLOAT32
    line = next(n for n in notes if n.startswith("dtype float32"))
    assert "create_model_from_path" in line and "pass --dtype bfloat16" in line and "reference" not in line
    assert "reference model" in next(n for n in _load(trainer="dpo")[1] if n.startswith("dtype float32"))
    assert _load(trainer="trainer")[0] is Dtype.BFLOAT16  # transformers 5's "auto": config.json
    assert _load(trainer="grpo", max_prompt_length=8, dtype="bfloat16")[0] is Dtype.BFLOAT16  # given wins
    auto, notes = _load(trainer="kto", stack="trl=0.26,transformers=4.57")
    assert auto is Dtype.BFLOAT16 and any("TRL 0.26 create_model_from_path default" in n for n in notes)
    assert _load(trainer="reward", stack="trl=0.24,transformers=5.23")[0] is Dtype.BFLOAT16
    assert _load(trainer="reward", stack="trl=0.24,transformers=4.57")[0] is Dtype.FLOAT32


def test_model_init_kwargs_read_from_trl_configs(tmp_path: Path) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text("model_init_kwargs:\n  torch_dtype: bfloat16\n  attn_implementation: sdpa\n")
    read = read_training_args_file(str(path))
    assert read.values["dtype"] == "bfloat16" and read.provenance["dtype"][1] == "model_init_kwargs.torch_dtype"
    assert "model_init_kwargs" not in read.ignored
    spec, notes = spec_from_values({**read.values, "trainer": "sft"}, inventory=bench.tiny_inventory(),
                                   provenance={"dtype": f"{path}:model_init_kwargs.torch_dtype"})
    assert spec.precision.load_dtype is Dtype.BFLOAT16 and any("model_init_kwargs.torch_dtype" in n for n in notes)
    argv = read_script_argv(["--dtype", "float32", "--model_init_kwargs", '{"dtype": "bfloat16"}'])
    assert argv.values["dtype"] == "bfloat16"  # TRL's scripts update ModelConfig's dtype with model_init_kwargs
    assert any(f.code == "conflicting-spellings" and "model_init_kwargs.dtype" in f.message for f in argv.findings)
    assert "dtype" not in read_training_args_object(SimpleNamespace(model_init_kwargs={"revision": "x"})).values
    with pytest.raises(ConfigError, match="model_init_kwargs"):
        read_training_args_object(SimpleNamespace(model_init_kwargs=[1]))


def test_model_init_kwargs_other_keys_are_read_or_flagged() -> None:
    """``attn_implementation`` / ``device_map`` are settings (they win in their source, as ``dtype``); loading keys
    that change no byte pass; anything else (a ``quantization_config``) is a ``not-modelled`` warning, which unpins."""
    read = read_training_args_object(SimpleNamespace(model_init_kwargs={
        "attn_implementation": "eager", "device_map": "auto", "revision": "main",
        "quantization_config": {"load_in_4bit": True}}))
    assert (read.values["attn_implementation"], read.values["device_map"]) == ("eager", "auto")
    assert read.provenance["attn_implementation"][1] == "model_init_kwargs.attn_implementation"
    flagged = [f for f in read.findings if f.code == "not-modelled"]
    assert len(flagged) == 1 and "quantization_config" in flagged[0].message and "revision" not in flagged[0].message
    assert not [f for f in read_training_args_object(SimpleNamespace(model_init_kwargs={"revision": "x"})).findings
                if f.code == "not-modelled"]


def test_recorded_releases_agree() -> None:
    """Every recorded real trainer (TRL 0.20 - 1.16): fitcheck's policy and reference dtypes are the real ones."""
    data = json.loads(bench.DATA.read_text())
    assert {"0.20.0", "0.24.0", "1.4.0", "1.16.0"} <= set(data)
    for version, row in data.items():
        tf = row["versions"]["transformers"]
        for case, got in row["cases"].items():
            policy, ref = bench.fitcheck_answer(case, version, tf)
            assert [policy] == got["policy"] and [ref] == (got["reference"] or ["-"]), (version, case)
    assert data["1.4.0"]["cases"]["dpo object bf16"]["reference"] == ["float32"]  # the note's case


def test_real_trainers_given_a_name_load_float32() -> None:
    """The installed TRL: ``SFTTrainer`` / ``DPOTrainer`` (and its reference) given the directory name of a bf16
    checkpoint hold fp32 parameters; ``model_init_kwargs`` bf16 (read from the real ``SFTConfig``) holds bf16."""
    trl = pytest.importorskip("trl")
    torch = pytest.importorskip("torch")
    import transformers

    real = bench.measure(("sft", "dpo"))
    assert real["sft"]["policy"] == real["dpo"]["policy"] == real["dpo"]["reference"] == ["float32"]
    for case in ("sft", "dpo"):
        assert bench.fitcheck_answer(case, trl.__version__, transformers.__version__)[0] == "float32"
    config = trl.SFTConfig(output_dir="unused", use_cpu=True, report_to=[],
                           model_init_kwargs={"dtype": torch.bfloat16})
    read = read_training_args_object(config, source="SFTConfig")
    assert read.values["dtype"] == "torch.bfloat16"
    assert _load(**read.values, trainer="sft")[0] is Dtype.BFLOAT16
