"""transformers 4.48's per-expert Mixtral MoE vs fitcheck's formula: every phase of a tiny real CPU step.

transformers 4.40-4.57 ``MixtralSparseMoeBlock.forward`` (4.48.1 ``models/mixtral/modeling_mixtral.py``
L112-150) loops over ``nn.Linear`` experts (``MixtralBlockSparseTop2MLP``), gathering ``hidden_states[None, top_x]``
per expert and summing with ``index_add_``; 5.x fuses the experts. This script runs fitcheck's own tracer
(``fitcheck.torch_adapters.trace_extrapolated``, real tensors: the per-expert ``torch.where`` is
data-dependent, so no fake tensors) on the INSTALLED transformers -- run it in an environment with the fms stack
(``/work/venvs/old``: transformers 4.48.1, peft 0.13.2, trl 0.13.0, torch 2.13 CPU; bitsandbytes 0.50.2's CPU
backend linked in with ``--bnb-path``) -- and prints, per case and phase, the traced live bytes (activations,
logits, temporaries: ``components_from_trace``) and the formula's (``activation_components``) at
``--stack transformers=4.48.1,peft=0.13.2[,trl=0.13.0]``.

Cases (the fms-acceleration rows' settings at tiny width): a bf16 model, LoRA r 16 / alpha 16 / dropout 0.1 on
q/k/v/o, with and without reentrant checkpointing; QLoRA (nf4, double quant, bf16 compute) prepared as TRL 0.13's
SFTTrainer prepares it (k-bit preparation, ``peft_module_casting_to_bf16``).

Only the library-API differences of the tracer's own 5.x calls are bridged (``_bridge_4x``: ``torch_dtype=``,
``gradient_checkpointing_enable``, no ``target_parameters``); the model, peft and the loss run as installed.

    PYTHONPATH=.:tests /work/venvs/old/bin/python benchmarks/mixtral_old_moe.py --bnb-path DIR [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
from typing import Any

WIDTHS: dict[str, Any] = {
    "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 512, "tie_word_embeddings": False,
}
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")
STACK = "transformers=4.48.1,peft=0.13.2"


def _bridge_4x() -> None:
    """The tracer calls 5.x / peft 0.17+ APIs; map them onto 4.48 / 0.13.2 (nothing the step runs changes)."""
    import peft
    from transformers.modeling_utils import PreTrainedModel

    if not hasattr(PreTrainedModel, "activation_checkpointing_enable"):
        from_config = PreTrainedModel._from_config.__func__  # type: ignore[attr-defined]

        def _from_config(cls: Any, config: Any, **kw: Any) -> Any:
            if "dtype" in kw:
                kw["torch_dtype"] = kw.pop("dtype")
            return from_config(cls, config, **kw)

        def _ckpt(self: Any, activation_checkpointing_kwargs: Any = None, every_n_layers: int = 1) -> None:
            self.gradient_checkpointing_enable(gradient_checkpointing_kwargs=activation_checkpointing_kwargs)

        PreTrainedModel._from_config = classmethod(_from_config)  # type: ignore[assignment]
        PreTrainedModel.activation_checkpointing_enable = _ckpt  # type: ignore[attr-defined]
        lora_config = peft.LoraConfig

        def _lora_config(**kw: Any) -> Any:
            if not kw.get("target_parameters"):
                kw.pop("target_parameters", None)
            return lora_config(**kw)

        peft.LoraConfig = _lora_config
        vision = types.ModuleType("transformers.vision_utils")  # imported only for image inputs (none here)
        for name in ("get_vision_attention_seqlens", "get_vision_position_ids", "get_vision_window_index"):
            setattr(vision, name, None)
        sys.modules.setdefault("transformers.vision_utils", vision)
        import transformers.quantizers.base as quantizers_base
        from transformers.integrations import bitsandbytes as hf_bnb

        if not hasattr(quantizers_base, "get_keys_to_not_convert"):  # 4.48: integrations/bitsandbytes.py
            quantizers_base.get_keys_to_not_convert = hf_bnb.get_keys_to_not_convert  # type: ignore[attr-defined]


def specs(experts: int = 4, batch: int = 2, seq: int = 64, family: str = "mixtral") -> dict[str, Any]:
    """The cases' TrainingSpecs (module docstring), at the fms stack."""
    from tiny_models import family_config, spec_from_config

    from fitcheck.readers import inventory_for_stack, parse_stack
    from fitcheck.spec import Dtype, LoraSpec, QuantSpec, TrainerSpec

    moe = {"num_local_experts": experts, "num_experts_per_tok": 2} if family == "mixtral" else {}
    cfg = family_config(family, WIDTHS, **moe)  # --family mistral: the same layer without the MoE
    lora = LoraSpec(r=16, alpha=16, dropout=0.1, target_modules=QKVO)
    nf4 = QuantSpec(bits=4, quant_type="nf4", compute_dtype=Dtype.BFLOAT16, double_quant=True,
                    prepare_for_kbit_training=True)
    out: dict[str, Any] = {}
    for name, ckpt, quant in (("lora", False, None), ("lora-ckpt", True, None), ("qlora", False, nf4),
                              ("qlora-ckpt", True, nf4)):
        # fms: LoRA rows bf16 weights without autocast; QLoRA rows bf16 weights + Trainer bf16 autocast
        spec = spec_from_config(cfg, seq=seq, batch=batch, checkpointing=ckpt, lora=lora, quant=quant,
                                mixed="bf16" if quant else "no")
        stack = parse_stack(STACK + (",trl=0.13.0" if quant else ""))
        spec = dataclasses.replace(spec, stack=stack, model=inventory_for_stack(spec.model, stack),
                                   trainer=TrainerSpec(prepared_by_sft_trainer=quant is not None))
        out[name] = spec
    return out


def compare(spec: Any) -> dict[str, list[int]]:
    """Phase -> [traced, formula] activation + logits + temporaries bytes."""
    from fitcheck.core.activations import activation_components
    from fitcheck.report import Phase
    from fitcheck.torch_adapters import activation_trace_kwargs, components_from_trace, trace_extrapolated

    # tracer_depth.trace_result's call (no accumulation, no resident gradients), on real tensors
    traced = components_from_trace(trace_extrapolated(spec.model.config, **{**activation_trace_kwargs(spec),
                                                                            "fake": False}))
    formula = activation_components(spec)
    return {ph.value: [sum(c.at(ph) for c in traced), sum(c.at(ph) for c in formula)]
            for ph in (Phase.FORWARD_END, Phase.BACKWARD_START, Phase.BACKWARD)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bnb-path", help="a folder holding bitsandbytes 0.50.2 (its CPU backend), first on sys.path")
    parser.add_argument("--cases", default="lora,lora-ckpt,qlora,qlora-ckpt")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--family", default="mixtral", choices=("mixtral", "mistral"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.bnb_path:
        sys.path.insert(0, args.bnb_path)
    import transformers

    _bridge_4x()
    rows = {}
    for name, spec in specs(args.experts, family=args.family).items():
        if name in args.cases.split(","):
            rows[name] = compare(spec)
    if args.json:
        print(json.dumps({"transformers": transformers.__version__, "rows": rows}))
        return 0
    print(f"transformers {transformers.__version__}, tiny Mixtral {WIDTHS} experts {args.experts} top-2, 2 x 64")
    print(f"{'case':12s} {'phase':18s} {'traced':>10s} {'formula':>10s} {'error':>8s}")
    for name, phases in rows.items():
        for phase, (t, f) in phases.items():
            print(f"{name:12s} {phase:18s} {t:10d} {f:10d} {100 * (f - t) / t:+7.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
