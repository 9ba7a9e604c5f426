"""Issue 21, item 4: what a person sees. ``--brief``; ``fitcheck models`` / ``fitcheck gpus`` with "did you mean";
the added GPU rows; no third-party noise; ``--help`` without RST markup or refused choices; a sequence beyond the
model's positions flagged; a CPU run that never says GPU; the wording bugs. Each failed before the fix."""

from __future__ import annotations

import json
import logging
import warnings

import pytest

from fitcheck.cli.main import main

MODEL = "meta-llama/Llama-3.2-1B"
EST = ["estimate", "--model_name_or_path", MODEL, "--no_trace"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.mark.parametrize(
    "extra", [[], ["--gpu_memory", "16GiB"], ["--load_in_4bit"], ["--device_type", "cpu", "--host_memory", "8GiB"]]
)
def test_brief_is_at_most_8_lines(capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    code, out, _ = _run(capsys, *EST, "--brief", *extra)
    lines = out.rstrip("\n").splitlines()
    assert 2 <= len(lines) <= 8 and all(len(line) <= 160 for line in lines)
    assert lines[0].split(":")[0] in ("FITS", "DOES NOT FIT", "REFUSED", "FITS, WITH ERRORS")
    assert "peak:" in lines[1] and ("headroom" in lines[1] or "short by" in lines[1])
    if code == 1:
        assert any(line.startswith("best fix:") for line in lines)


def test_models_and_gpus_commands(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "models", "llama-3.2")
    assert code == 0 and MODEL in out.splitlines()
    code, _, err = _run(capsys, "models", "meta-lama/Llama-3.2-1b")
    assert code == 2 and f"did you mean {MODEL}" in err
    code, out, _ = _run(capsys, "gpus")
    for card in ("H800-80GB", "H20-96GB", "RTX4080-16GB", "RTX4070Ti-12GB", "L40S-48GB", "A10G-24GB"):
        assert card in out
    code, _, err = _run(capsys, "gpus", "H1OO")
    assert code == 2 and "did you mean H100-80GB" in err
    code, _, err = _run(capsys, *EST, "--gpu", "H1OO-80GB")
    assert code == 2 and "Did you mean H100-80GB" in err
    code, _, err = _run(capsys, "estimate", "--model_name_or_path", "meta-lama/Llama-3.2-1B", "--no_trace")
    assert code == 2 and f"Did you mean {MODEL}" in err


def test_new_gpu_rows_resolve_as_nvidia_smi_prints_them() -> None:
    from fitcheck.catalog import lookup_gpu

    assert lookup_gpu("NVIDIA H800").name == "H800-80GB"
    assert lookup_gpu("NVIDIA GeForce RTX 4080").name == "RTX4080-16GB"
    assert lookup_gpu("NVIDIA GeForce RTX 4070 Ti").name == "RTX4070Ti-12GB"
    assert lookup_gpu("RTX4080-16GB").memory_bytes == 16049 * 2**20  # torch total_memory=16049MB


def test_no_third_party_noise(capsys: pytest.CaptureFixture[str]) -> None:
    """A library that logs a warning or warns during a run (bitsandbytes' CPU-kernel notice, peft's
    RuntimeWarnings) prints nothing of it: the run's output is the report."""

    def noisy(args: object) -> int:
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community")
        warnings.warn("peft says something", RuntimeWarning, stacklevel=1)
        return 0

    from fitcheck.cli import main as cli_main

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli_main, "_dispatch", lambda argv: noisy(argv))
        assert cli_main.main(["estimate"]) == 0
    cap = capsys.readouterr()
    assert "gemm_4bit_forward" not in cap.err and "peft says" not in cap.err
    assert logging.getLogger("bitsandbytes").level == logging.NOTSET  # restored after the run


def test_help_has_no_rst_markup_and_no_refused_choices(capsys: pytest.CaptureFixture[str]) -> None:
    from fitcheck.cli.main import build_parser

    for command in ("estimate", "plot", "models", "gpus"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        out = capsys.readouterr().out
        assert "``" not in out and ":class:" not in out and ":mod:" not in out, command
        assert "orpo" not in out and "cpo," not in out
        # main() builds the parser with only the subcommand its command line starts with: the same help, and the
        # same error for a bad flag, as the parser with every subcommand
        with pytest.raises(SystemExit):
            build_parser(command).parse_args([command, "--help"])
        assert capsys.readouterr().out == out, command
        errors = []
        for parser in (build_parser(), build_parser(command)):
            with pytest.raises(SystemExit):
                parser.parse_args([command, "--no-such-flag"])
            errors.append(capsys.readouterr().err)
        assert errors[0] == errors[1], command
        assert "error: " in errors[0], command
    code, _, err = _run(capsys, *EST, "--trainer", "orpo")
    assert code == 2 and "not modelled" in err  # still refused with the reason


def test_sequence_beyond_max_position_embeddings_is_flagged(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, "estimate", "--model_name_or_path", "openai-community/gpt2", "--no_trace", "--json",
                     "--max_seq_length", "4096")
    assert "seq-beyond-context" in {f["code"] for f in json.loads(out)["findings"]}
    _, out, _ = _run(capsys, *EST, "--json", "--max_seq_length", "1024")
    assert "seq-beyond-context" not in {f["code"] for f in json.loads(out)["findings"]}


def test_a_cpu_run_never_says_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, *EST, "--device_type", "cpu", "--host_memory", "64GiB")
    assert code == 0
    assert "GPU" not in out, [line for line in out.splitlines() if "GPU" in line]
    assert "of 64.00 GiB on 64.00 GiB" not in out
    _, out, _ = _run(capsys, *EST, "--device_type", "cpu", "--json")
    report = json.loads(out)
    assert report["budget_bytes"] != 85027979264  # this machine's RAM, not an H100-80GB


def test_wording(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(capsys, *EST, "--per_device_train_batch_size", "1", "--max_seq_length", "128")
    assert "the peak is at the during" not in out
    _, out, _ = _run(capsys, *EST, "--zero_stage", "2", "--offload_optimizer", "cpu")
    assert "command line overrides command line" not in out
    _, out, _ = _run(capsys, "estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--no_trace", "--trainer",
                     "reward")
    assert "REWARDConfig" not in out and "RewardConfig" in out
    _, out, _ = _run(capsys, *EST, "--gradient_checkpointing")
    assert "gradient checkpointing make " not in out
