"""Hostile and mistaken inputs for every reader, flag and API entry point (issue 21), and the driver that runs them.

``python tests/hostile_inputs.py WORKDIR`` builds the inputs under WORKDIR, runs each through the real entry
point in this process (``fitcheck.cli.main.main`` for commands, the API function for API cases) with a time
limit per case, and prints one JSON line per case: its name, exit code (or the exception it raised), seconds,
and whether a traceback was printed. ``tests/test_readers_fuzz.py`` runs it in a subprocess under a memory cap
(``resource.setrlimit``) and checks the lines: no traceback, no hang, no file written, no code executed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MODEL = "meta-llama/Llama-3.2-1B"
PER_CASE_SECONDS = 60
# A file an input would create if it ran code (YAML python tags, shell in a value, remote code in config.json).
PWNED = "pwned-by-fitcheck-input"


class CaseTimeout(BaseException):
    """Raised by the alarm: a BaseException, so no ``except Exception`` in fitcheck can swallow it."""


def _bomb(depth: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, depth):
        ref = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([ref] * 9)}]")
    return "\n".join(lines) + "\n"


def _files(work: Path) -> dict[str, Path]:
    """Write the hostile files; returns name -> path."""
    from fitcheck.catalog import find_catalog_config

    found = find_catalog_config(MODEL)
    assert found is not None
    base = dict(found[0])
    out: dict[str, Path] = {}

    def put(name: str, data: str | bytes) -> Path:
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
        out[name] = path
        return path

    def model(name: str, **change: object) -> None:
        put(f"{name}/config.json", json.dumps({**base, **change}))
        out[name] = work / name

    pwn = f"!!python/object/apply:os.system ['touch {work / PWNED}']"
    for name, change in {
        "m_neg_hidden": {"hidden_size": -2048}, "m_zero_layers": {"num_hidden_layers": 0},
        "m_zero_heads": {"num_attention_heads": 0}, "m_zero_kv": {"num_key_value_heads": 0},
        "m_neg_vocab": {"vocab_size": -1}, "m_zero_inter": {"intermediate_size": 0},
        "m_million_layers": {"num_hidden_layers": 10**6}, "m_huge_hidden": {"hidden_size": 10**30},
        "m_float_hidden": {"hidden_size": 2048.5}, "m_str_layers": {"num_hidden_layers": "16"},
        "m_bool_heads": {"num_attention_heads": True}, "m_list_vocab": {"vocab_size": [1, 2]},
        "m_nan_eps": {"rms_norm_eps": float("nan")}, "m_null_type": {"model_type": None},
        "m_unknown_type": {"model_type": "no_such_model_xyz"}, "m_empty_type": {"model_type": ""},
        "m_type_list": {"model_type": ["llama"]}, "m_heads_indivisible": {"num_attention_heads": 7},
        "m_remote_code": {"model_type": "custom_pwn", "auto_map": {"AutoConfig": "pwn.PwnConfig",
                                                                   "AutoModelForCausalLM": "pwn.PwnModel"}},
        "m_text_config_neg": {"text_config": {"hidden_size": -1}},
        "m_big_rope": {"rope_scaling": {"rope_type": "yarn", "factor": 1e308}},
        "m_neg_positions": {"max_position_embeddings": -5},
        "m_quant_junk": {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": "maybe"}},
        "m_quant_unknown": {"quantization_config": {"quant_method": "no_such_quant"}},
        "m_quant_list": {"quantization_config": [1, 2, 3]},
    }.items():
        model(name, **change)
    # remote code that would write the sentinel if imported
    put("m_remote_code/pwn.py", f"open({str(work / PWNED)!r}, 'w').write('ran')\n")
    put("m_deep/config.json", '{"model_type": "llama", "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    out["m_deep"] = work / "m_deep"
    put("m_not_json/config.json", "{model_type: llama")
    out["m_not_json"] = work / "m_not_json"
    put("m_binary/config.json", bytes(range(256)) * 64)
    out["m_binary"] = work / "m_binary"
    put("m_array/config.json", "[1, 2, 3]")
    out["m_array"] = work / "m_array"
    put("m_bigint/config.json", '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}")
    out["m_bigint"] = work / "m_bigint"
    put("m_nan/config.json", '{"model_type": "llama", "hidden_size": NaN}')
    out["m_nan"] = work / "m_nan"
    put("m_dup/config.json", json.dumps(base)[:-1] + ', "hidden_size": -1}')
    out["m_dup"] = work / "m_dup"
    put("m_large/config.json", '{"model_type": "llama", "pad": "' + "x" * (17 * 2**20) + '"}')
    out["m_large"] = work / "m_large"
    (work / "m_nodir").mkdir(exist_ok=True)
    out["m_nodir"] = work / "m_nodir"
    if hasattr(os, "mkfifo"):
        os.mkfifo(work / "fifo.json")
        out["fifo"] = work / "fifo.json"
        (work / "m_fifo").mkdir(exist_ok=True)
        os.mkfifo(work / "m_fifo" / "config.json")
        out["m_fifo"] = work / "m_fifo"
    with contextlib.suppress(OSError):
        (work / "loop").symlink_to(work / "loop")
        out["loop"] = work / "loop"

    yaml_bodies = {
        "bomb": _bomb(), "pwn": f"compute_environment: {pwn}\n", "recursive": "a: &a [*a]\n",
        "deep": "a: " + "[" * 5000 + "]" * 5000 + "\n", "not_mapping": "- 1\n- 2\n", "empty": "",
        "bad_syntax": "a: [1, 2\n", "tabs": "a:\n\t- 1\n", "binary": "\x00\x01\x02", "int_keys": "1: 2\n",
        "huge_number": "num_processes: " + "9" * 5000 + "\n", "nan": "num_processes: .nan\n",
        "merge_bomb": "a: &a {x: 1}\nb: {<<: *a, <<: *a}\n",
    }
    for kind, body in yaml_bodies.items():
        put(f"acc_{kind}.yaml", body)
        put(f"ta_{kind}.yaml", body)
        put(f"ds_{kind}.yaml", body)
        put(f"trl_{kind}.yaml", body)
    json_bodies = {
        "deep": "[" * 100_000 + "]" * 100_000, "not_json": "{", "array": "[]", "nan": '{"train_batch_size": NaN}',
        "stage_str": '{"zero_optimization": {"stage": "three"}}', "stage_big": '{"zero_optimization": {"stage": 9}}',
        "auto_everywhere": '{"train_batch_size": "auto", "zero_optimization": {"stage": "auto"}}',
        "offload_junk": '{"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}}',
        "bucket_neg": '{"zero_optimization": {"stage": 2, "reduce_bucket_size": -5}}',
        "bucket_inf": '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e400}}',
        "bf16_fp16": '{"bf16": {"enabled": true}, "fp16": {"enabled": true}}',
        "batch_mismatch": '{"train_micro_batch_size_per_gpu": 3, "train_batch_size": 7}',
    }
    for kind, body in json_bodies.items():
        put(f"ds_{kind}.json", body)
        put(f"ta_{kind}.json", body)
    put("adapter_junk.json", '{"peft_type": "LORA", "r": -1, "target_modules": 5}')
    put("adapter_ia3.json", '{"peft_type": "IA3"}')
    put("adapter_deep.json", "[" * 100_000 + "]" * 100_000)
    put("train.py", "from trl import SFTConfig\n")
    put("grpo_train.py", "from trl import GRPOConfig\n")
    put("both_train.py", "from trl import SFTConfig, DPOConfig\n")
    put("big_train.py", "# " + "x" * (5 * 2**20) + "\nfrom trl import SFTConfig\n")
    return out


def cases(work: Path) -> Iterator[tuple[str, list[str] | Callable[[], object]]]:
    """Every hostile case: (name, argv for ``fitcheck`` or a zero-argument API call)."""
    f = _files(work)
    est = ["estimate", "--model_name_or_path", MODEL, "--no_trace", "--json"]
    values = {
        "empty": "", "neg": "-1", "zero": "0", "nan": "nan", "inf": "inf", "huge": "1e400", "digits": "9" * 5000,
        "nul": "a\x00b", "long": "a" * 120_000, "list": "1,2", "shell": f"$(touch {work / PWNED})",
        "path": "../../etc/passwd", "unicode": "１２３", "float": "2.5",
    }
    flags = [
        "--per_device_train_batch_size", "--max_seq_length", "--gradient_accumulation_steps", "--gpu_memory",
        "--host_memory", "--num_processes", "--num_machines", "--lora_r", "--zero_stage", "--optim", "--dtype",
        "--gpu", "--stack", "--mfu", "--lora_target_modules", "--max_memory", "--trainer", "--num_labels",
    ]
    for flag in flags:
        for vname, value in values.items():
            yield f"flag{flag}={vname}", [*est, flag, value]
    import argparse

    from fitcheck.cli.estimate import add_estimate_arguments

    parser = argparse.ArgumentParser()
    add_estimate_arguments(parser)
    every = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"})
    for flag in (f for f in every if f not in flags):  # every other spelling of every estimate flag: 3 values
        for vname in ("nan", "digits", "nul"):
            yield f"flag-all{flag}={vname}", [*est, flag, values[vname]]
    for name in sorted(k for k in f if k.startswith("m_")) + [k for k in ("fifo", "loop") if k in f]:
        yield f"model:{name}", ["estimate", "--model_name_or_path", str(f[name]), "--no_trace", "--json"]
    for name in ("", " ", "meta-lama/Llama-3.2-1b", "x" * 100_000, "/dev/zero", "/dev/null", "/proc/self/mem",
                 "-", "https://evil.example/model", "../" * 50 + "etc"):
        yield f"model-id:{name[:24]!r}", ["estimate", "--model_name_or_path", name, "--no_trace", "--json"]
    for kind in ("bomb", "pwn", "recursive", "deep", "not_mapping", "empty", "bad_syntax", "tabs", "binary",
                 "int_keys", "huge_number", "nan", "merge_bomb"):
        yield f"accelerate:{kind}", [*est, "--config_file", str(f[f"acc_{kind}.yaml"])]
        yield f"training_args:{kind}", [*est, "--training_args", str(f[f"ta_{kind}.yaml"])]
        yield f"deepspeed-yaml:{kind}", [*est, "--deepspeed", str(f[f"ds_{kind}.yaml"])]
        yield f"launch-acc:{kind}", ["launch", "--check-only", "--config_file", str(f[f"acc_{kind}.yaml"]),
                                     str(f["train.py"]), "--model_name_or_path", MODEL]
        yield f"launch-trl:{kind}", ["launch", "--check-only", str(f["train.py"]), "--config",
                                     str(f[f"trl_{kind}.yaml"]), "--model_name_or_path", MODEL]
    for kind in ("deep", "not_json", "array", "nan", "stage_str", "stage_big", "auto_everywhere", "offload_junk",
                 "bucket_neg", "bucket_inf", "bf16_fp16", "batch_mismatch"):
        yield f"deepspeed:{kind}", [*est, "--deepspeed", str(f[f"ds_{kind}.json"])]
        yield f"training_args-json:{kind}", [*est, "--training_args", str(f[f"ta_{kind}.json"])]
    for name in ("fifo", "loop", "m_nodir"):
        if name in f:
            yield f"file-flag:{name}", [*est, "--deepspeed", str(f[name])]
    for adapter in ("adapter_junk.json", "adapter_ia3.json", "adapter_deep.json"):
        yield f"adapter:{adapter}", [*est, "--adapter_config", str(f[adapter])]
    launch_cases: dict[str, list[str]] = {
        "after-script": [str(f["train.py"]), "--check-only", "--model_name_or_path", MODEL],
        "no-script": ["--check-only"],
        "fifo-script": ["--check-only", str(f.get("fifo", f["train.py"])), "--model_name_or_path", MODEL],
        "big-script": ["--check-only", str(f["big_train.py"]), "--model_name_or_path", MODEL],
        "two-trl": ["--check-only", str(f["both_train.py"]), "--model_name_or_path", MODEL],
        "grpo-no-prompt": ["--check-only", str(f["grpo_train.py"]), "--model_name_or_path", MODEL],
        "bad-accel-flag": ["--check-only", "--no_such_flag", str(f["train.py"])],
        "gpu-junk": ["--check-only", "--gpu", "H1OO", str(f["train.py"]), "--model_name_or_path", MODEL],
        "value-missing": ["--check-only", "--gpu"],
        "trainer-junk": ["--check-only", "--trainer", "orpo", str(f["train.py"]), "--model_name_or_path", MODEL],
        "script-junk-flags": ["--check-only", str(f["train.py"]), "--model_name_or_path", MODEL,
                              "--per_device_train_batch_size", "-3"],
        "deepspeed-fsdp": ["--check-only", "--use_deepspeed", "--use_fsdp", str(f["train.py"]),
                           "--model_name_or_path", MODEL],
    }
    for name, argv in launch_cases.items():
        yield f"launch:{name}", ["launch", *argv]
    trl = [
        ["--trainer", "grpo", "--num_generations", "0", "--max_prompt_length", "64"],
        ["--trainer", "grpo", "--per_device_train_batch_size", "3", "--num_generations", "4",
         "--max_prompt_length", "64"],
        ["--trainer", "dpo", "--beta", "nan", "--max_prompt_length", "64"],
        ["--trainer", "grpo", "--steps_per_generation", "0", "--max_prompt_length", "64"],
        ["--trainer", "sft", "--num_generations", "4"],
        ["--trainer", "reward", "--packing"],
        ["--trainer", "dpo", "--loss_type", "no_such_loss", "--max_prompt_length", "64"],
        ["--trainer", "orpo"], ["--trainer", "cpo"], ["--trainer", "grpo"],
        ["--trainer", "kto", "--max_prompt_length", "-1"],
    ]
    for i, extra in enumerate(trl):
        yield f"trl:{i}:{' '.join(extra)[:40]}", [*est, *extra]
    misc: dict[str, list[str]] = {
        "plot-missing-dir": ["plot", "--model_name_or_path", MODEL, "--no_trace", "--output",
                             str(work / "missing" / "x.png")],
        "plot-bad-suffix": ["plot", "--model_name_or_path", MODEL, "--no_trace", "--output", str(work / "x.exe")],
        "trace-and-no-trace": ["estimate", "--model_name_or_path", MODEL, "--trace", "--no_trace"],
        "unknown-flag": ["estimate", "--model_name_or_path", MODEL, "--no_such_flag", "1"],
        "no-command": [], "bad-command": ["frobnicate"], "models-typo": ["models", "lama-3.2-1"],
        "gpus-typo": ["gpus", "H1OO"], "models-long": ["models", "x" * 100_000], "gpus-long": ["gpus", "x" * 100_000],
        "device-map-junk": [*est, "--device_map", "everywhere"],
        "max-memory-junk": [*est, "--device_map", "auto", "--max_memory", "0:-5GiB"],
        "seq-beyond": [*est, "--max_seq_length", "1000000000"],
        "batch-huge": [*est, "--per_device_train_batch_size", "100000000"],
        "cpu-no-memory": [*est, "--device_type", "cpu"],
        "brief-refused": ["estimate", "--model_name_or_path", MODEL, "--no_trace", "--brief", "--load_in_4bit"],
    }
    for name, argv in misc.items():
        yield f"misc:{name}", argv
    yield from _api_cases(f)


def _api_cases(f: dict[str, Path]) -> Iterator[tuple[str, Callable[[], object]]]:
    from fitcheck.integrations import preflight

    from fitcheck.readers import load_inventory, spec_from_values

    inv = load_inventory(MODEL, env={})
    yield "api:preflight(None)", lambda: preflight(None)
    yield "api:preflight('')", lambda: preflight("")
    yield "api:preflight(typo kw)", lambda: preflight(MODEL, max_seq_lenght=131072)
    yield "api:preflight(args=dict)", lambda: preflight(MODEL, args={"per_device_train_batch_size": 2})
    yield "api:preflight(args=1)", lambda: preflight(MODEL, args=1)
    yield "api:preflight(gpu junk)", lambda: preflight(MODEL, gpu="H1OO")
    yield "api:preflight(gpu_memory -1)", lambda: preflight(MODEL, gpu_memory=-1)
    yield "api:preflight(gpu_memory inf)", lambda: preflight(MODEL, gpu_memory=float("inf"))
    yield "api:preflight(deep model)", lambda: preflight(str(f["m_deep"]))
    yield "api:preflight(bomb accelerate)", lambda: preflight(MODEL, config_file=str(f["acc_bomb.yaml"]))
    yield "api:preflight(bomb deepspeed)", lambda: preflight(MODEL, deepspeed=str(f["ds_bomb.yaml"]))
    yield "api:preflight(neg batch)", lambda: preflight(MODEL, per_device_train_batch_size=-3)
    yield "api:spec_from_values(nan lr)", lambda: spec_from_values({"learning_rate": float("nan")}, inventory=inv)
    yield "api:spec_from_values(junk key)", lambda: spec_from_values({"no_such": 1}, inventory=inv)
    yield "api:spec_from_values(batch str)", lambda: spec_from_values({"per_device_train_batch_size": "x"},
                                                                      inventory=inv)
    yield "api:load_inventory(bomb)", lambda: load_inventory(str(f["acc_bomb.yaml"]), env={})


def run_case(case: list[str] | Callable[[], object]) -> tuple[str, bool]:
    """Run one case; returns (outcome, traceback printed). Outcome: ``exit N``, ``raised Type`` or ``returned``."""
    from fitcheck.cli.main import main
    from fitcheck.errors import FitcheckError

    err = io.StringIO()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if callable(case):
            try:
                case()
                outcome = "returned"
            except FitcheckError as exc:
                outcome = f"refused {type(exc).__name__}"
            except Exception as exc:
                import traceback

                traceback.print_exc()
                outcome = f"raised {type(exc).__name__}"
        else:
            try:
                outcome = f"exit {main(case)}"
            except SystemExit as exc:
                outcome = f"exit {exc.code}"
            except Exception as exc:
                import traceback

                traceback.print_exc()
                outcome = f"raised {type(exc).__name__}"
    return outcome, "Traceback (most recent call last)" in err.getvalue()


def _timeout(signum: int, frame: Any) -> None:
    raise CaseTimeout()


def main(work: Path) -> None:
    """Run every case and print one JSON line each."""
    import warnings

    warnings.simplefilter("ignore")
    signal.signal(signal.SIGALRM, _timeout)
    every = list(cases(work))
    before = {str(p) for p in work.rglob("*")}
    for name, case in every:
        start = time.perf_counter()
        signal.alarm(PER_CASE_SECONDS)
        try:
            outcome, traced = run_case(case)
        except CaseTimeout:
            outcome, traced = "timeout", False
        except MemoryError:
            outcome, traced = "memory", False
        finally:
            signal.alarm(0)
        print(json.dumps({"name": name, "outcome": outcome, "traceback": traced,
                          "seconds": round(time.perf_counter() - start, 2)}), flush=True)
    written = sorted({str(p) for p in work.rglob("*")} - before)
    print(json.dumps({"written": written}), flush=True)


if __name__ == "__main__":
    os.chdir(sys.argv[1])
    main(Path(sys.argv[1]))
