"""TRL 0.13's SFTTrainer on a 4-bit base: the parameter dtypes its ``__init__`` leaves (run with an old stack).

Runs in an environment with the old stack (``/work/venvs/old``: trl 0.13.0, transformers 4.48.1, peft 0.13.2,
accelerate 1.0.1, torch 2.13 CPU); nothing of TRL, peft or transformers is patched. Two models go through
``SFTTrainer(model, args=SFTConfig(bf16=True), peft_config=LoraConfig(...))``:

- ``real_4bit``: bitsandbytes 4-bit layers (0.50.2's CPU backend: bitsandbytes 0.43.3 has none; pass its
  site-packages folder with ``--bnb-path``), built as transformers 4.48's ``replace_with_bnb_linear`` builds them,
  quantized on the CPU, ``model.is_loaded_in_4bit = True`` (what ``Bnb4BitHfQuantizer._process_model_after_weight_
  loading`` sets). On a CPU TRL takes it for FSDP / ZeRO-3 QLoRA: ``is_sharded_qlora`` is ``Params4bit`` on
  ``cpu`` or ``meta`` (trl/trainer/sft_trainer.py v0.13.0 L186-190), so neither ``prepare_model_for_kbit_training``
  nor the cast runs: every 16-bit parameter stays as loaded.
- ``marked_16bit``: the same bf16 model unquantized, marked ``is_loaded_in_4bit = True``. No ``Params4bit``, so TRL
  runs what it runs for a 4-bit model on a GPU: ``prepare_model_for_kbit_training`` (every bf16 parameter to fp32),
  ``get_peft_model``, then ``peft_module_casting_to_bf16`` (trl/trainer/utils.py L872-879): norms fp32, the fp32
  embedding and LM head bf16, the adapters left fp32. Its unquantized parameters are what a GPU run's are.

Prints one JSON object: the installed versions and, per case and parameter name (peft's ``base_model.model.``
prefix removed), ``[dtype, numel, requires_grad]``. ``tests/test_trl_old_casts.py`` compares it with fitcheck's
layout (``core/states/trl_adapters.py``); it is skipped where the old environment is absent (CI).

    /work/venvs/old/bin/python benchmarks/trl_old_casts.py --bnb-path DIR  # DIR holds bitsandbytes 0.50.2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

# a tiny Llama: 2 layers, untied head (the fitcheck test builds the same config)
CONFIG: dict[str, Any] = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 512,
    "max_position_embeddings": 256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _tokenizer(vocab: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, vocab)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _bf16_model() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)


def _marked_model() -> Any:
    model = _bf16_model()
    model.is_loaded_in_4bit = True  # the attribute TRL and peft read (module docstring: marked_16bit)
    return model


def _quantized_model() -> Any:
    import bitsandbytes as bnb
    import torch
    from transformers import BitsAndBytesConfig
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    model = _bf16_model()
    weights = {n: m.weight.data for n, m in model.named_modules() if type(m) is torch.nn.Linear}
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.bfloat16)
    replace_with_bnb_linear(model, modules_to_not_convert=["lm_head"], quantization_config=config)
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.weight = bnb.nn.Params4bit(weights[name], requires_grad=False,
                                              **{k: v for k, v in module.weight.__dict__.items()
                                                 if k in ("quant_type", "compress_statistics", "blocksize",
                                                          "quant_storage")}).to("cpu")
    model.is_loaded_in_4bit = True  # Bnb4BitHfQuantizer._process_model_after_weight_loading
    model.config.quantization_config = config
    return model


def sft_trainer_dtypes(model: Any) -> dict[str, list[Any]]:
    """The parameters of ``model`` after TRL's SFTTrainer prepared it (module docstring)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    tok = _tokenizer(CONFIG["vocab_size"])
    data = Dataset.from_dict({"text": [" ".join(f"w{2 + (i + j) % 500}" for j in range(31)) for i in range(4)]})
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, bf16=True, use_cpu=True, report_to=[], max_seq_length=32,
                         per_device_train_batch_size=2, gradient_checkpointing=True, dataset_text_field="text")
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tok,
                             peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, target_modules=TARGETS,
                                                    task_type="CAUSAL_LM"))
        return {n.removeprefix("base_model.model."): [str(p.dtype).removeprefix("torch."), p.numel(),
                                                      p.requires_grad]
                for n, p in trainer.model.named_parameters()}


def run() -> dict[str, Any]:
    """Both cases (module docstring) and the versions."""
    import peft
    import transformers
    import trl

    versions = {m.__name__: m.__version__ for m in (trl, transformers, peft)}
    return {"versions": versions, "real_4bit": sft_trainer_dtypes(_quantized_model()),
            "marked_16bit": sft_trainer_dtypes(_marked_model())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bnb-path", help="a folder holding bitsandbytes 0.50.2 (its CPU backend), first on sys.path")
    args = parser.parse_args(argv)
    if args.bnb_path:
        sys.path.insert(0, args.bnb_path)
    print(json.dumps(run()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
