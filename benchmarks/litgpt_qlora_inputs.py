"""What bitsandbytes <= 0.43.1 adds to a litgpt QLoRA step: litgpt's own model code, measured on CPU.

The published litgpt QLoRA rows (LIT-9/10/14, LITCH-2/4/6 in ``calibration/published_measurements.json``) ran
bitsandbytes 0.41-0.42, whose ``MatMul4Bit.forward`` keeps its input as a ctx attribute (``ctx.tensors = (A, B)``,
``bitsandbytes/autograd/_functions.py`` at 0.42.0; ``(None, B)`` from 0.43.2, PR #1270). This script takes
litgpt's model code from a git checkout at the rows' commit (``model.py``, ``lora.py``, ``config.py``; from
``utils.py`` only ``find_multiple``, ``chunked_cross_entropy`` and ``map_old_state_dict_weights``, which need no
Lightning), replaces every ``nn.Linear`` but the LoRA matrices by a ``Linear4bit`` whose forward and
``MatMul4Bit`` are bitsandbytes 0.42.0's (``nn/modules.py`` ``Linear4bit.forward``, ``autograd/_functions.py``
``MatMul4Bit``; the NF4 dequantization is emulated by a fresh fp16 copy of the weight, the dtype Fabric quantizes
from), and runs litgpt's training loop (``logits = model(input_ids, lm_head_chunk_size=128)``,
``chunked_cross_entropy``, backward, the next micro-batch) under fitcheck's ``LiveTensorRecorder`` on real CPU
tensors, with ``(A, B)`` and with ``(None, B)``.

It prints, per layer and token, the bytes the graph still holds after backward and the rise of the step's peak,
(A, B) minus (None, B), from 1 and 2 layers of a Llama-2 shaped block (h=256, I=688). Measured (2026-11, torch
2.13 CPU): 2,912 = 6h + 2I held after backward at every commit; the peak rises by 2,912 with litgpt @8641822
(iteration 0 is the longest sample, later ones shorter: ``--second-tokens 128``) and by 5,824 = 2 x 2,912 with @00af8b0
(micro-batches of one length: the next forward runs while ``logits`` still holds the previous graph).

Run: ``python benchmarks/litgpt_qlora_inputs.py --git PATH/TO/litgpt.git --commit 00af8b0 [--second-tokens N]``
(``PATH`` from any clone; the 2023 package is ``lit_gpt``, found by itself).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_UTILS = ("find_multiple", "chunked_cross_entropy", "map_old_state_dict_weights")


def _show(git: Path, commit: str, path: str) -> str | None:
    out = subprocess.run(["git", "--git-dir", str(git), "show", f"{commit}:{path}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def export(git: Path, commit: str, dest: Path) -> str:
    """Write litgpt's model code at ``commit`` under ``dest`` (importable without Lightning); its package name."""
    package = "litgpt" if _show(git, commit, "litgpt/model.py") is not None else "lit_gpt"
    pkg = dest / package
    pkg.mkdir(parents=True)
    for name in ("model.py", "lora.py", "config.py", "rmsnorm.py"):
        text = _show(git, commit, f"{package}/{name}")
        if text is None:
            continue
        if name == "model.py":  # 2023: flash-attn probe through lightning_utilities; CPU runs torch SDPA anyway
            text = text.replace("from lightning_utilities.core.imports import RequirementCache\n", "")
            text = "\n".join("FlashAttention2Available = False" if line.startswith("FlashAttention2Available =")
                             else line for line in text.splitlines()) + "\n"
        (pkg / name).write_text(text)
    utils = _show(git, commit, f"{package}/utils.py") or ""
    kept = [ast.get_source_segment(utils, node) or "" for node in ast.parse(utils).body
            if isinstance(node, ast.FunctionDef) and node.name in _UTILS]
    head = "import math\nfrom typing import Dict, List, Mapping, Union\nimport torch\nimport torch.nn as nn\n\n"
    (pkg / "utils.py").write_text(head + "\n\n".join(kept) + "\n")
    (pkg / "__init__.py").write_text(f"from {package}.model import GPT\nfrom {package}.config import Config\n")
    return package


def run(package: str, kind: str, layers: int, tokens: int, second: int | None) -> tuple[int, int]:
    """(bytes held after the last backward, peak) of two micro-batches of litgpt's LoRA loop; ``kind``: ``lora``
    (plain frozen linears), ``new`` ((None, B)) or ``old`` ((A, B))."""
    import importlib

    import torch

    from fitcheck.torch_adapters import LiveTensorRecorder

    lora = importlib.import_module(f"{package}.lora")
    utils = importlib.import_module(f"{package}.utils")

    class State:
        def __init__(self, w16: Any) -> None:
            self.w16 = w16

    class MatMul4Bit(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, A: Any, B: Any, out: Any = None, bias: Any = None, quant_state: Any = None) -> Any:
            output = torch.nn.functional.linear(A, quant_state.w16.clone().to(A.dtype), bias)
            ctx.state = quant_state
            if any(ctx.needs_input_grad[:2]):
                ctx.tensors = (A, B) if kind == "old" else (None, B)
            else:
                ctx.tensors = (None, None)
            return output

        @staticmethod
        def backward(ctx: Any, grad_output: Any) -> Any:
            grad_a = None
            if ctx.needs_input_grad[0]:
                grad_a = torch.matmul(grad_output, ctx.state.w16.clone().to(grad_output.dtype))
            return grad_a, None, None, None, None

    class Linear4bit(torch.nn.Module):
        def __init__(self, lin: Any) -> None:
            super().__init__()
            out_f, in_f = lin.weight.shape
            self.weight = torch.nn.Parameter(torch.zeros(out_f * in_f // 2, 1, dtype=torch.uint8),
                                             requires_grad=False)
            self.state = State(lin.weight.detach().to(torch.float16))
            self.compute_dtype = lin.weight.dtype
            self.in_features, self.out_features = in_f, out_f

        def forward(self, x: Any) -> Any:
            inp_dtype = x.dtype
            out = MatMul4Bit.apply(x.to(self.compute_dtype), self.weight.t(), None, None, self.state)  # type: ignore[no-untyped-call]
            return out.to(inp_dtype)

    def swap(module: Any) -> None:
        for name, child in module.named_children():
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Linear4bit(child))
            else:
                swap(child)

    torch.manual_seed(0)
    shape = {"n_embd": 256, "n_head": 4, "n_query_groups": 4, "intermediate_size": 688, "n_layer": layers,
             "padded_vocab_size": 512, "vocab_size": 512}
    names = (("lora_r", "lora_alpha", "lora_dropout", "lora_query", "lora_value") if package == "litgpt"
             else ("r", "alpha", "dropout", "to_query", "to_value"))
    config = lora.Config.from_name("Llama-2-7b-hf", **shape, **dict(zip(names, (8, 16, 0.05, True, True), strict=True)))
    torch.set_default_dtype(torch.bfloat16)  # Fabric's bf16-true / BitsandbytesPrecision dtype context
    model = lora.GPT(config)
    torch.set_default_dtype(torch.float32)
    lora.mark_only_lora_as_trainable(model)
    if kind != "lora":
        swap(model)
    model.max_seq_length = tokens
    rec = LiveTensorRecorder()
    held = 0
    with rec:
        for step in range(2):
            t = tokens if step == 0 or second is None else second
            ids, targets = torch.randint(0, 512, (1, t)), torch.randint(0, 512, (1, t))
            logits = model(ids, lm_head_chunk_size=128)
            logits[-1] = logits[-1][..., :-1, :]
            loss = utils.chunked_cross_entropy(logits, targets[..., 1:])
            loss.backward()
            if step == 0:
                held = rec.current  # the first micro-batch's graph, still referenced by ``logits``
    peak = max(r.peak for r in rec.regions.values())
    return held, peak


def main(argv: list[str] | None = None) -> int:
    """Print the held and peak bytes per layer and token, (A, B) minus (None, B)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--git", type=Path, required=True, help="a litgpt git directory")
    parser.add_argument("--commit", required=True)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--second-tokens", type=int, default=None, help="the second micro-batch's length")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        package = export(args.git, args.commit, Path(tmp))
        sys.path.insert(0, tmp)
        res = {(k, n): run(package, k, n, args.tokens, args.second_tokens) for k in ("new", "old") for n in (1, 2)}
    per_layer = [(res[("old", 2)][i] - res[("new", 2)][i]) - (res[("old", 1)][i] - res[("new", 1)][i])
                 for i in (0, 1)]
    print(f"litgpt @{args.commit}, {args.tokens} tokens then {args.second_tokens or args.tokens}: "
          f"(A, B) - (None, B) per layer per token: held after backward {per_layer[0] / args.tokens:,.0f} B, "
          f"peak {per_layer[1] / args.tokens:,.0f} B (h=256, I=688: 6h + 2I = 2,912)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
