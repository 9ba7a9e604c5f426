"""The dtype real TRL trainers load a model given by name in, by release, vs fitcheck's load dtype.

A tiny Llama is saved to a temporary directory in bfloat16 (its config.json says ``"dtype": "bfloat16"``, as the
Hub's checkpoints do) with a word-level tokenizer; each case builds the real trainer from that directory *name* (no
training step) and records the dtypes of the policy's and the reference model's parameters:

- ``sft``: ``SFTTrainer(model=<dir>)``, ``model_init_kwargs`` unset;
- ``sft bf16 kwargs``: the same with ``model_init_kwargs={"dtype": "bfloat16"}`` (``torch_dtype`` before TRL 0.23);
- ``dpo``: ``DPOTrainer(model=<dir>)``, full fine-tune, the reference model built by the trainer;
- ``dpo object bf16``: the policy loaded by the script in bf16 and passed as an object: what the reference is;
- ``grpo beta``: ``GRPOTrainer(model=<dir>)`` with ``beta=0.04`` (a reference model); ``grpo object bf16``: the
  policy passed as a bf16 object;
- ``from_pretrained``: the control, ``AutoModelForCausalLM.from_pretrained(<dir>)`` without a dtype (transformers'
  own default: ``"auto"`` = bf16 here on 5.x, float32 on 4.x).

``--record`` (run it with each side venv's python: ``benchmarks/trl_sft_releases.py`` says how to make one) adds the
release's row to ``benchmarks/data/trl_load_dtype.json``; it imports no fitcheck. Without ``--record`` the recorded
policy dtypes are compared with fitcheck's load dtype at ``--stack trl=<release>,transformers=<release>`` and the
installed TRL is measured live.

Run: ``/tmp/venv_trl24/bin/python benchmarks/trl_load_dtype.py --record``; ``python benchmarks/trl_load_dtype.py``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "trl_load_dtype.json"
CASES = ("sft", "sft bf16 kwargs", "dpo", "dpo object bf16", "grpo beta", "grpo object bf16", "from_pretrained")
_VOCAB = 64
# a 2-layer Llama 32 wide: the load path is the same at any width
_LLAMA = {"vocab_size": _VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 64}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def save_tiny_checkpoint(path: str) -> Any:
    """A tiny bf16 Llama and its word-level tokenizer saved under ``path``; returns the tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(**_LLAMA)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.config.dtype = torch.bfloat16  # transformers 4.x: torch_dtype; save_pretrained writes what it holds
    model.config.torch_dtype = torch.bfloat16
    model.save_pretrained(path)
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, _VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(path)
    return fast


def _dtypes(model: Any) -> list[str]:
    return sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()}) if model is not None else []


def build(case: str, path: str, tok: Any, out: str) -> Any:
    """The real trainer of ``case`` built from the checkpoint directory ``path`` (module docstring)."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    key = "dtype" if _release(trl.__version__) >= (0, 23) else "torch_dtype"
    if case == "from_pretrained":
        return AutoModelForCausalLM.from_pretrained(path)
    common: dict[str, Any] = {"output_dir": out, "use_cpu": True, "report_to": [], "save_strategy": "no",
                              "per_device_train_batch_size": 2}
    words = [" ".join(f"w{2 + (i + j) % (_VOCAB - 2)}" for j in range(6)) for i in range(4)]
    if case.startswith("sft"):
        if case == "sft bf16 kwargs":
            common["model_init_kwargs"] = {key: "bfloat16"}
        return trl.SFTTrainer(model=path, args=trl.SFTConfig(**common), processing_class=tok,
                              train_dataset=Dataset.from_dict({"text": words}))
    if case.startswith("dpo"):
        data = Dataset.from_dict({"prompt": words, "chosen": [" w3"] * 4, "rejected": [" w4"] * 4})
        model: Any = path
        if case == "dpo object bf16":
            model = AutoModelForCausalLM.from_pretrained(path, **{key: torch.bfloat16})
        return trl.DPOTrainer(model=model, args=trl.DPOConfig(**common), processing_class=tok, train_dataset=data)
    policy = AutoModelForCausalLM.from_pretrained(path, **{key: torch.bfloat16}) if "object" in case else path
    return trl.GRPOTrainer(model=policy, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                           args=trl.GRPOConfig(**common, beta=0.04, num_generations=2, max_completion_length=4),
                           processing_class=tok, train_dataset=Dataset.from_dict({"prompt": words}))


def measure(cases: tuple[str, ...] = CASES) -> dict[str, Any]:
    """``{case: {"policy": [dtypes], "reference": [dtypes]} or {"error": text}}`` at the installed TRL."""
    warnings.filterwarnings("ignore")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as path:
        tok = save_tiny_checkpoint(path)
        for case in cases:
            try:
                trainer = build(case, path, tok, os.path.join(path, "out"))
            except Exception as exc:  # a release that cannot build the case: recorded as such
                out[case] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                continue
            model = getattr(trainer, "model", trainer)  # the from_pretrained control is the model itself
            out[case] = {"policy": _dtypes(model), "reference": _dtypes(getattr(trainer, "ref_model", None))}
    return out


def record() -> None:
    """Measure at the running interpreter's TRL and store the row (module docstring)."""
    import torch
    import transformers
    import trl

    data = json.loads(DATA.read_text()) if DATA.exists() else {}
    data[trl.__version__] = {"versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                                          "torch": torch.__version__.split("+")[0]},
                             "cases": measure()}
    DATA.write_text(json.dumps(dict(sorted(data.items(), key=lambda kv: _release(kv[0]))), indent=1) + "\n")
    print(json.dumps(data[trl.__version__], indent=1))


def fitcheck_answer(case: str, trl_version: str, transformers_version: str) -> tuple[str, str]:
    """fitcheck's ``(policy dtype, reference dtype or "-")`` for a case at that stack (the tiny model's bf16
    config.json): the load dtype, and the reference's (the load dtype, or the dtype the reference-dtype note names
    where the policy is a 16-bit object: ``--dtype bfloat16``)."""
    import re
    from types import SimpleNamespace

    from fitcheck.core.trainers import has_reference_copy
    from fitcheck.readers import read_training_args_object, spec_from_values

    kwargs = {"dtype": "bfloat16"} if case == "sft bf16 kwargs" else None
    read = read_training_args_object(SimpleNamespace(model_init_kwargs=kwargs), source="SFTConfig")  # a live config
    trainer = "trainer" if case == "from_pretrained" else case[:4].strip()
    values: dict[str, object] = {**read.values, "trainer": trainer,
                                 "stack": f"trl={trl_version},transformers={transformers_version}"}
    if trainer == "grpo":
        values.update(beta=0.04, max_prompt_length=4, max_completion_length=4, num_generations=2)
    if "object" in case:
        values["dtype"] = "bfloat16"
    spec, notes = spec_from_values(values, inventory=tiny_inventory())
    load = spec.precision.load_dtype.value
    if not has_reference_copy(spec):
        return load, "-"
    named = [m.group(1) for n in notes if (m := re.search(r"the reference is (\w+)", n))]
    return load, named[0] if named else load


def tiny_inventory() -> Any:
    """The tiny Llama's inventory (pure path) with its bf16 config.json."""
    from fitcheck.readers import inventory_from_config

    return inventory_from_config({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "dtype": "bfloat16",
                                  "tie_word_embeddings": False, **_LLAMA}, "tiny-llama", "benchmarks/trl_load_dtype.py")


def main() -> None:
    if "--record" in sys.argv:
        record()
        return
    data = json.loads(DATA.read_text())
    print(f"{'trl':>8} {'transformers':>12} | {'case':<17} | real policy / reference | fitcheck")
    for version, row in data.items():
        tf = row["versions"]["transformers"]
        for case, got in row["cases"].items():
            if "error" in got:
                print(f"{version:>8} {tf:>12} | {case:<17} | {got['error'][:60]}")
                continue
            policy, ref = fitcheck_answer(case, version, tf)
            print(f"{version:>8} {tf:>12} | {case:<17} | {','.join(got['policy'])} / "
                  f"{','.join(got['reference']) or '-'} | {policy} / {ref}")


if __name__ == "__main__":
    main()
