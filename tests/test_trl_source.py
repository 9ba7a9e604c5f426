"""TRL's config classes read from the installed source (``fitcheck.readers.trl_source``) against the imported
classes, GRPOConfig's batch checks as modelled (``core.trainers.grpo_config_accepts``) against the class, and a TRL
``--no_trace`` answer, GRPO's included, that imports neither trl nor torch (issue 20's speed: 13.5 -> 0.9 CPU-s),
nor the modules a formula answer defers."""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
import textwrap

import pytest

from fitcheck.core.trainers import TRAINERS
from fitcheck.readers import TRL_FLAG_NAMES, read_config_class, read_config_fields

trl = pytest.importorskip("trl")

# what torch_adapters.trl_config_check sets besides the flags (the batch varies with the run)
_SET = ("per_device_train_batch_size", "gradient_accumulation_steps")


def test_parsed_configs_equal_the_imported_classes() -> None:
    for kind, row in TRAINERS.items():
        if row.config_class is None:
            continue
        cls = getattr(trl, row.config_class)
        imported = {f.name: f for f in dataclasses.fields(cls)}
        own = read_config_class("trl", row.config_class)
        assert own is not None and own.outside == ("transformers", "TrainingArguments"), kind
        every = read_config_fields("trl", row.config_class, imported)
        assert every is not None and set(every) == set(imported), kind  # no field missing or made up
        base = read_config_class("transformers", "TrainingArguments")
        assert base is not None
        defaults = {**base.defaults, **own.defaults}
        real = {n: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                for n, f in imported.items()}
        for name, value in real.items():
            if name in defaults:  # every literal default the source declares is the class's
                assert value == defaults[name], (kind, name)
        read = set(row.defaults) | {k for k in (*TRL_FLAG_NAMES, *_SET) if k in imported}
        for name in read:  # every field fitcheck reads has its default in the source
            assert real[name] is not dataclasses.MISSING and name in defaults, (kind, name)
            if name != "bf16":  # None in the dataclass, True after __post_init__ (tests/test_trl_cli.py)
                assert row.defaults.get(name, defaults[name]) == defaults[name], (kind, name)
            # trl_config_check._typed reads the annotation's text: the same words either way
            text, typed = every[name], str(imported[name].type)
            for word in ("bool", "list[", "int", "float"):
                assert (word in text) == (word in typed), (kind, name, text, typed)
            assert text.startswith("list") == typed.startswith("list"), (kind, name)


def test_training_arguments_checks_read_none_of_the_fields_set() -> None:
    # trl_config_check skips TrainingArguments.__post_init__ when the trl class's own checks read nothing the run
    # sets: everything it runs (methods and properties, followed) must not read those fields either
    from transformers import TrainingArguments

    keys = {*TRL_FLAG_NAMES, *_SET} - {"trainer"}
    seen: set[str] = set()
    todo = ["__post_init__"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        member = inspect.getattr_static(TrainingArguments, name)
        func = getattr(member, "fget", None) or getattr(member, "func", None) or member
        source = textwrap.dedent(inspect.getsource(func))
        for attr in re.findall(r"self\.(\w+)", source):
            assert attr not in keys, (name, attr)
            static = inspect.getattr_static(TrainingArguments, attr, None)
            if callable(static) or isinstance(static, property) or hasattr(static, "func"):
                todo.append(attr)
    assert {"_validate_args", "_process_fsdp_args"} <= seen


def test_grpo_batch_checks_are_the_configs() -> None:
    import itertools
    import warnings

    from fitcheck.core.trainers import GRPO_CONFIG_MODELLED, grpo_config_accepts

    source = read_config_class("trl", "GRPOConfig")
    assert source is not None and source.checks_read is not None
    # every field a run passes that GRPOConfig.__post_init__ reads is one the model answers for
    assert source.checks_read & {*TRL_FLAG_NAMES, *_SET} <= GRPO_CONFIG_MODELLED
    names = ("per_device_train_batch_size", "num_generations", "generation_batch_size", "steps_per_generation",
             "per_device_eval_batch_size")
    grid = [*itertools.product((0, 1, 2, 3), (0, 1, 2, 4), (None, 0, 6), (None, 3), (None,)),
            *itertools.product((2,), (2, 4), (None,), (None,), (3, 4))]
    accepted = 0
    for values in grid:
        kwargs = {"gradient_accumulation_steps": 2, **{k: v for k, v in zip(names, values, strict=True)
                                                       if v is not None}}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trl.GRPOConfig(output_dir="unused", report_to=[], use_cpu=True, **kwargs)
            real = True
        except (ValueError, ZeroDivisionError):
            real = False
        modelled = grpo_config_accepts({**source.defaults, **kwargs})
        accepted += modelled
        # accepted by the model: accepted by the class; without an eval batch (whose check GRPOConfig runs only
        # with do_eval, which no run sets) the two agree on every value
        assert (modelled <= real) if values[-1] is not None else modelled == real, kwargs
    assert 10 < accepted < len(grid) - 10  # both verdicts are exercised
    assert not grpo_config_accepts({**source.defaults, "per_device_train_batch_size": 2,
                                    "gradient_accumulation_steps": "2"})  # not an int: TRL decides


_CHILD = """
import contextlib, io, sys
from fitcheck.cli.main import main
base = ["estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--no_trace", "--json"]
runs = [["--trainer", "sft", "--packing"], ["--trainer", "reward"], ["--trainer", "kto", "--max_prompt_length", "64"],
        ["--trainer", "dpo", "--max_prompt_length", "64", "--per_device_eval_batch_size", "2"],
        ["--trainer", "sft", "--num_generations", "4"], ["--trainer", "grpo", "--max_prompt_length", "64"],
        ["--trainer", "grpo", "--max_prompt_length", "64", "--generation_batch_size", "8", "--num_generations", "4",
         "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "4"]]
codes = []
for extra in runs:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        codes.append(main([*base, *extra]))
# and what a formula answer defers (readers' PEP 562 surface, tp > 1 only, expandable segments only)
print(codes, "|", sorted(m for m in ("trl", "torch", "transformers", "fitcheck.readers.axolotl",
                                     "fitcheck.readers.llamafactory", "fitcheck.readers.seq_lengths",
                                     "fitcheck.core.parallelism.tp_plan", "fitcheck.core.caching.expandable")
                         if m in sys.modules))
"""


def test_trl_runs_answer_without_importing_trl_or_torch() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True, timeout=300)
    codes, _, modules = out.stdout.strip().splitlines()[-1].partition(" | ")
    # GRPO too: GRPOConfig's __post_init__ reads the batch, which every run sets, and its batch checks are modelled
    # (core.trainers.grpo_config_accepts, against the class in test_grpo_batch_checks_are_the_configs)
    assert codes == "[0, 0, 0, 0, 2, 0, 0]" and modules == "[]", out.stdout + out.stderr[-2000:]


def test_an_unreadable_source_falls_back_to_the_imported_class(monkeypatch: pytest.MonkeyPatch) -> None:
    import fitcheck.readers as readers
    from fitcheck.cli.main import main

    monkeypatch.setattr(readers, "read_config_class", lambda *_: None)
    est = ["estimate", "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--no_trace", "--json", "--trainer", "sft"]
    assert main([*est, "--num_generations", "4"]) == 2  # SFTConfig has no such field: refused by the class itself
    assert main([*est, "--packing"]) == 0
