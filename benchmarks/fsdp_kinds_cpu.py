"""Issue 19: FSDP's backward moments for the kinds of run s22-fsdp-bwd did not measure, on the REAL Trainer (CPU,
gloo): LoRA, QLoRA, a tied-embedding full fine-tune and SHARD_GRAD_OP, against fitcheck's formula.

The harness is ``accumulation_engines_cpu.py``'s (the real ``transformers.Trainer`` under accelerate's FSDP1 / FSDP2 on
1 and 2 gloo ranks, tiny Llama h128 / 2 layers / vocab 1024, 2 rows, two optimizer steps of accumulation 2, bf16,
the live-tensor recorder's start-of-backward, head and layers regions); :func:`kind_model` changes the model and the
FSDP settings:

- ``lora``: the bf16 model, peft 0.21 ``get_peft_model`` with LoRA r 16 on q/k/v/o (peft's default
  ``autocast_adapter_dtype=True``: fp32 adapters), what the Trainer does with a peft model under FSDP (transformers
  5.23 ``distributed/fsdp.py`` ``update_fsdp_plugin_peft``: FSDP1 wraps every ``lora_A`` / ``lora_B`` as its own unit;
  FSDP2 keeps accelerate's units, ``trainer.py`` l.1717-1722);
- ``qlora``: the same random model saved and loaded 4-bit by bitsandbytes 0.50's CPU backend (nf4, double quant, bf16
  compute and bf16 quant storage: fms's baseline-peft-bnb, TRL's sharded-QLoRA), bf16 adapters
  (``autocast_adapter_dtype=False``, TRL's sharded-QLoRA ``get_peft_model``), no k-bit preparation;
  ``update_fsdp_plugin_peft`` sets the mixed precision to the quant storage dtype;
- ``tied``: the bf16 full fine-tune with ``tie_word_embeddings=True``;
- ``sgo``: the bf16 full fine-tune with ``fsdp="shard_grad_op auto_wrap"`` (FSDP2 ``reshard_after_forward=False``,
  transformers 5.23 ``training_args.py`` l.2920-2925; FSDP1: ``reshard_after_forward="shard_grad_op"``, which accelerate
  1.15 never applies: the run is FULL_SHARD, ``readers/fsdp_config.py`` ``_fsdp1_reshard_ignored``; the record keeps the
  strategy FSDP1 ran, ``sharding_strategy``), on 2 ranks only (one process is NO_SHARD under FSDP1).

Run: ``PYTHONPATH=. python benchmarks/fsdp_kinds_cpu.py --write [ENGINE ...]`` records every engine (or those) at 32
and 128 tokens in ``benchmarks/data/fsdp_kinds_cpu.json``; ``--table [ENGINE ...]`` prints the recorded start and
during backward against the formula (``fitcheck.core.estimate``); ``--one ENGINE SEQ`` prints one run's JSON.
Engine names: ``KIND-fsdpV[-2ranks][-sync]`` (``-sync``: accelerate's ``sync_each_batch``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

KINDS = ("lora", "qlora", "tied", "sgo")
_BASES = ("fsdp1", "fsdp1-2ranks", "fsdp1-2ranks-sync", "fsdp2", "fsdp2-sync", "fsdp2-2ranks", "fsdp2-2ranks-sync")
ENGINES = tuple(f"{kind}-{base}" for kind in KINDS for base in _BASES if kind != "sgo" or "2ranks" in base)
DATA = ROOT / "benchmarks" / "data" / "fsdp_kinds_cpu.json"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
RANK = 16


def kind_model(kind: str, model: Any) -> tuple[Any, str, dict[str, Any]]:
    """The model, the ``fsdp`` sharding option and the extra ``fsdp_config`` of ``kind`` (called in each rank, with
    the bf16 tiny Llama the plain engine trains)."""
    import peft
    import torch
    import transformers

    if kind == "sgo":
        return model, "shard_grad_op", {}
    if kind == "tied":
        cfg = model.config
        cfg.tie_word_embeddings = True
        torch.manual_seed(0)
        tied = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        assert tied.lm_head.weight is tied.model.embed_tokens.weight
        return tied, "full_shard", {}
    qlora = kind == "qlora"
    if qlora:
        quant = transformers.BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.environ["KINDS_QLORA_PATH"], quantization_config=quant, device_map="cpu", dtype=torch.bfloat16)
    lora = peft.LoraConfig(r=RANK, lora_alpha=RANK, lora_dropout=0.0, target_modules=list(TARGETS),
                           task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lora, autocast_adapter_dtype=not qlora), "full_shard", {}


def _engine(engine: str) -> tuple[str, str]:
    """(kind, the plain engine's name) of ``KIND-fsdpV...``."""
    kind, base = engine.split("-", 1)
    return kind, base


def run(engine: str, seq: int) -> dict[str, Any]:
    """One engine's rank-0 result (``accumulation_engines_cpu._result`` plus the FSDP flavour)."""
    from accumulation_engines_cpu import run_fsdp

    kind, base = _engine(engine)
    if kind == "qlora" and not os.environ.get("KINDS_QLORA_PATH"):
        import torch
        import transformers
        from deepspeed_run_events_cpu import CONFIG

        cfg = transformers.LlamaConfig(**{k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
        torch.manual_seed(0)
        path = tempfile.mkdtemp()
        transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(path)
        os.environ["KINDS_QLORA_PATH"] = path  # read by the spawned ranks
    return run_fsdp(int(base[4]), 2 if "2ranks" in base else 1, seq, base.endswith("sync"), kind=kind)


def measured(engine: str, seq: int) -> dict[str, Any]:
    """:func:`run` in a child process (``accumulation_engines_cpu.measured`` on this file)."""
    from accumulation_engines_cpu import measured as in_child

    return in_child(engine, seq, __file__)


def spec_of(engine: str, seq: int, accum: int = 2) -> Any:
    """fitcheck's spec of an engine's run at accumulation ``accum``."""
    from accumulation_engines_cpu import spec_of as plain_spec
    from deepspeed_run_events_cpu import CONFIG

    from fitcheck.readers import fsdp_from_config, fsdp_option_string, inventory_from_config
    from fitcheck.spec import Dtype, LoraSpec, QuantSpec

    kind, base = _engine(engine)
    spec = plain_spec(base, seq, accum)
    fs = spec.sharding.fsdp
    if kind == "sgo":  # as fitcheck reads the run's fsdp="shard_grad_op auto_wrap" (FSDP1: FULL_SHARD, a finding)
        version = fs.version
        read = fsdp_from_config({"version": version, **fsdp_option_string("shard_grad_op auto_wrap", at="fsdp",
                                                                         version=version)},
                                source="fsdp_kinds_cpu", flavour="trainer").spec
        fs = replace(fs, sharding_strategy=read.sharding_strategy, reshard_after_forward=read.reshard_after_forward)
        return replace(spec, sharding=replace(spec.sharding, fsdp=fs))
    if kind == "tied":
        config = {**CONFIG, "tie_word_embeddings": True}
        return replace(spec, model=inventory_from_config(config, "tiny-tied", "benchmarks/fsdp_kinds_cpu.py"))
    lora = LoraSpec(r=RANK, alpha=RANK, dropout=0.0, target_modules=TARGETS)
    quant = QuantSpec(double_quant=True, quant_storage=Dtype.BFLOAT16, compute_dtype=Dtype.BFLOAT16,
                      prepare_for_kbit_training=False) if kind == "qlora" else None
    return replace(spec, lora=lora, quant=quant)


def table(engines: list[str]) -> int:
    """Print the recorded start and during backward against the formula: micro-step 2 at accumulation 2 and, for
    engines whose first micro-step reduces (``accumulation_engines_cpu.FIRST_AS_ONE``), micro-step 1 at 1."""
    from accumulation_engines_cpu import FIRST_AS_ONE, during_peak

    from fitcheck.core import estimate
    from fitcheck.report import Location, Phase

    rows = json.loads(DATA.read_text(encoding="utf-8"))["rows"]
    print(f"{'engine':24} {'micro':>5} {'seq':>4} | {'start: real':>11} {'formula':>8} | {'during: real':>12} "
          f"{'formula':>8}")
    for engine in engines:
        for seq in (32, 128):
            if f"{engine} {seq}" not in rows:
                continue
            for micro, accum in (("micro1", 1), ("micro2", 2)):
                if micro == "micro1" and _engine(engine)[1] not in FIRST_AS_ONE:
                    continue
                m = rows[f"{engine} {seq}"][micro]
                rep = estimate(spec_of(engine, seq, accum))
                tot = {p: sum(c.at(p) for c in rep.components if c.location is Location.DEVICE) for p in Phase}
                start, during = m["start_peak"], during_peak(m)

                def err(e: int, r: int) -> str:
                    return f"{(e - r) / r * 100:+7.2f}%"

                print(f"{engine:24} {micro[-1]:>5} {seq:4d} | {start:11d} {err(tot[Phase.BACKWARD_START], start)} | "
                      f"{during:12d} {err(tot[Phase.BACKWARD], during)}", flush=True)
    return 0


def write(engines: tuple[str, ...]) -> int:
    """Record ``engines`` (all when empty) at 32 and 128 tokens in :data:`DATA`, the other rows kept."""
    data = json.loads(DATA.read_text(encoding="utf-8")) if DATA.exists() else {"accum": 2, "rows": {}}
    for engine in engines or ENGINES:
        for seq in (32, 128):
            data["rows"][f"{engine} {seq}"] = measured(engine, seq)
            print(engine, seq, json.dumps(data["rows"][f"{engine} {seq}"]), flush=True)
            DATA.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    from accumulation_engines_cpu import child_entry

    child_entry(run)
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--table" in sys.argv:
        sys.exit(table(names or list(ENGINES)))
    sys.exit(write(tuple(names)))
