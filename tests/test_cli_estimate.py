"""`fitcheck estimate`: the CLI contract (flags, JSON fields, exit codes) and flag precedence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fitcheck.cli.main import main

LLAMA3 = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B"]
BASE = [
    "estimate",
    *LLAMA3,
    "--dtype",
    "bfloat16",
    "--bf16",
    "--optim",
    "adamw_torch",
    "--per_device_train_batch_size",
    "2",
    "--max_seq_length",
    "1024",
    "--gpu",
    "H100-80GB",
    "--no_trace",  # the CLI contract on the formula path: with torch the default path replays the largest
    #               micro-batch's boundary (torch_adapters/verdict_replay.py), seconds per run
]


def run_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, object]]:
    code = main([*BASE, *extra, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_json_contract_fields_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    code, j = run_json(capsys)
    for key, typ in [
        ("fits", bool),
        ("peak_allocated_bytes", int),
        ("peak_reserved_bytes", int),
        ("device_used_bytes", int),
        ("budget_bytes", int),
        ("host_bytes", int),
        ("components", dict),
        ("findings", list),
    ]:
        assert isinstance(j[key], typ), key
    assert code == (0 if j["fits"] else 1)
    assert j["peak_reserved_bytes"] >= j["peak_allocated_bytes"]
    assert j["device_used_bytes"] > j["peak_reserved_bytes"]  # CUDA context and workspaces on top
    assert all({"code", "severity", "message"} <= set(f) for f in j["findings"])  # type: ignore[union-attr]


def test_full_finetune_8b_on_24gib_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    code, j = run_json(capsys, "--gpu_memory", "24GiB")
    assert code == 1 and j["fits"] is False
    assert "does-not-fit" in [f["code"] for f in j["findings"]]  # type: ignore[index,union-attr]


def test_table_output_names_components_and_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(BASE)
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "optimizer" in out and "weights" in out
    assert ("FITS" in out) or ("DOES NOT FIT" in out)


def test_unknown_model_exits_2_and_says_how_to_pass_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["estimate", "--model_name_or_path", "no-such-org/nothing-here", "--json"])
    err = capsys.readouterr().err
    assert code == 2
    assert "config.json" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size"),
        (["--per_device_train_batch_size", "two"], "per_device_train_batch_size"),
        (["--fp16"], "fp16"),
        (["--gpu", "TPU-v9"], "--gpu_memory"),
        (["--gpu_memory", "lots"], "gpu_memory"),
        (["--attn_implementation", "magic"], "attn_implementation"),
        (["--optim", "no_such_optimizer"], "no_such_optimizer"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    code = main([*BASE, *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err and "Traceback" not in err


def test_hyphen_spelling_and_boolean_values(capsys: pytest.CaptureFixture[str]) -> None:
    _, a = run_json(capsys, "--gradient-checkpointing")
    _, b = run_json(capsys, "--gradient_checkpointing", "true")
    _, c = run_json(capsys, "--gradient_checkpointing", "false")
    _, d = run_json(capsys)
    fwd = "end of forward"
    assert a["phases"][fwd] == b["phases"][fwd]  # type: ignore[index]
    assert c["phases"][fwd] == d["phases"][fwd]  # type: ignore[index]
    # checkpointing keeps fewer activations at the end of forward (the peak itself is the optimizer step here)
    assert a["phases"][fwd] < d["phases"][fwd]  # type: ignore[index,operator]


def test_explicit_flag_wins_over_training_args_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"per_device_train_batch_size": 16, "gradient_accumulation_steps": 3}))
    _, j = run_json(capsys, "--training_args", str(args))
    assert j["micro_batch"] == 2  # from the command line
    assert j["gradient_accumulation_steps"] == 3  # from the file


def test_qlora_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, j = run_json(
        capsys,
        "--use_peft",
        "--lora_r",
        "16",
        "--lora_alpha",
        "32",
        "--lora_dropout",
        "0.05",
        "--lora_target_modules",
        "all-linear",
        "--load_in_4bit",
        "--bnb_4bit_quant_type",
        "nf4",
        "--use_bnb_nested_quant",
        "--gradient_checkpointing",
        "--attn_implementation",
        "sdpa",
    )
    assert code == 0 and j["fits"] is True
    assert j["trainable_params"] == 41_943_040  # r * (in + out) over every linear but lm_head (design note 04)


def test_a_path_answers_a_spec_asked_again_from_its_kept_formula_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch search and the advisor ask a path the same spec again (20 estimates of 10 specs in the Qwen3-8B
    QLoRA answer): the core runs once per spec, and the answer equals a fresh path's, with the spec asked."""
    import dataclasses

    import fitcheck.core as core
    from fitcheck.cli import build_parser, spec_from_args
    from fitcheck.torch_adapters import PinnedPath

    spec, _ = spec_from_args(build_parser().parse_args([*BASE, "--no_trace"]))
    calls = []
    real = core.estimate
    monkeypatch.setattr(core, "estimate", lambda s, **kw: calls.append(s) or real(s, **kw))
    path = PinnedPath("never")
    first = path(spec)
    other = dataclasses.replace(spec, provenance={"per_device_train_batch_size": "elsewhere"})
    again = path(other)
    bigger = path(dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, micro_batch=3)))
    assert len(calls) == 2
    assert first == PinnedPath("never")(spec) and bigger == PinnedPath("never")(bigger.spec)
    assert again.spec is other and again == PinnedPath("never")(other)


# What a formula answer (``--json --no_trace``) must not import: the libraries a trace needs, rich (the table),
# PyYAML (axolotl / LLaMA-Factory files), the torch adapters that build or replay models, and the other subcommands
# (``fitcheck.cli.main.build_parser`` registers only the one on the command line: building and importing ``plot``
# repeats every ``estimate`` flag)
FORMULA_NEEDS_NONE_OF = (
    "torch", "transformers", "accelerate", "peft", "bitsandbytes", "trl", "deepspeed", "numpy", "sympy", "rich",
    "yaml", "fitcheck.torch_adapters.meta_device", "fitcheck.torch_adapters.fsdp2_run_events",
    "fitcheck.torch_adapters.tracer", "fitcheck.torch_adapters.allocator_replay", "fitcheck.render.table",
    "fitcheck.cli.plot", "fitcheck.cli.launch", "fitcheck.cli.catalog",
)


def test_known_family_answers_without_importing_torch() -> None:
    # --no_trace: with torch installed the default path replays the largest micro-batch's boundary (by construction
    # near the budget) through the caching allocator (torch_adapters/verdict_replay.py)
    code = (
        "import sys, json, io, contextlib\n"
        "from fitcheck.cli.main import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = main({[*BASE, '--json', '--no_trace']!r})\n"
        "json.loads(buf.getvalue())\n"
        f"bad = [m for m in {FORMULA_NEEDS_NONE_OF!r} if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
