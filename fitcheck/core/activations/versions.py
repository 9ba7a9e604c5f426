"""What the library versions of the environment change in the estimate (pure: no torch, no imports of them).

The formulas are read from transformers 5.23 / peft 0.21 / bitsandbytes 0.50 / torch 2.13
(``fitcheck.spec.MODELLED_VERSIONS``). For transformers 4.40-4.57 the known differences are modelled, each from
the library source of those versions:

- Default load dtype: 4.x ``from_pretrained`` without ``torch_dtype`` keeps ``torch.get_default_dtype()``
  (float32); 5.0 made ``dtype="auto"`` the default (5.23 modeling_utils.py: ``if dtype is None: dtype =
  "auto"``). Read in ``fitcheck.readers.run_args.load_dtype``.
- Loss path: up to 4.48 ``loss_utils.ForCausalLMLoss`` (4.46-4.48) and the model forwards before it (<= 4.45,
  e.g. modeling_llama.py ``LlamaForCausalLM.forward``) upcast the logits and make a shifted contiguous copy,
  ``shift_logits = logits[..., :-1, :].contiguous()``, before ``cross_entropy``: one more fp32
  ``b·(s-1)·V`` tensor at the loss. transformers PR #35646 (merged 2025-01-13, first released in 4.49.0)
  removed the copy; 5.x pads the labels instead (``nn.functional.pad(labels, (0, 1))``). Before 4.46 the
  forward also rebinds ``logits = logits.float()``, so the 16-bit logits are not held during the loss.
- Mixtral experts: 4.x ``MixtralSparseMoeBlock`` holds ``nn.Linear`` ``gate`` and per-expert ``w1/w2/w3``
  (quantized by bitsandbytes, targeted by LoRA ``all-linear``); 5.x fuses them into 3-D parameters. Modelled in
  the inventory (``fitcheck.readers.families_legacy``); the loop's saved tensors in
  ``fitcheck.core.activations.moe_expert_loop``.

And for torch before 1.11, from the generated autograd of those releases:

- Softmax keeps its input: torch 1.10.2's ``SoftmaxBackward0`` holds ``SavedVariable self_`` beside ``result_``
  (``torch/include/torch/csrc/autograd/generated/Functions.h``), 1.11.0's only ``self_scalar_type`` and
  ``result_`` (pytorch issue #64000). Eager attention's softmax reads a fresh tensor (the scaled scores plus the
  mask), so each layer keeps one more (b, heads, s, s) tensor, in the softmax's dtype, until its backward. Read in
  ``fitcheck.core.activations.layernorm_blocks`` (the LayerNorm families' eager attention).

Anything else outside the modelled versions gets a warning finding. bitsandbytes <= 0.43.1 ``MatMul4Bit.forward``
keeps its input as a ctx attribute (``ctx.tensors = (A, B)``, fixed in 0.43.2 by PR #1270): modelled in
``fitcheck.core.activations.bnb_kept_inputs`` (the Llama-style layer, LoRA without DoRA) and reported as an info
finding; elsewhere :func:`legacy_bnb_kept_inputs` bounds the bytes (the distinct inputs of the layers' 4-bit
linears) in a warning.
"""

from __future__ import annotations

from fitcheck.core.activations.bnb_kept_inputs import SHARED_INPUT, kept_inputs_modelled, old_bnb_4bit
from fitcheck.core.states import trl_bf16_trainables, trl_module_cast, trl_release_modelled
from fitcheck.core.trainers import dpo_release_findings, reward_release_findings, sft_release_findings
from fitcheck.findings import Finding, Severity
from fitcheck.spec import MODELLED_VERSIONS, TrainingSpec
from fitcheck.units import format_bytes

# transformers releases whose differences from 5.23 are modelled (above); 5.x releases share 5.23's code paths
# for everything fitcheck models except where a finding says otherwise.
LEGACY_TRANSFORMERS = ((4, 40), (4, 57))
_SHIFT_COPY_FIXED = (4, 49)  # PR #35646: ForCausalLMLoss no longer copies the shifted logits
_LOSS_IN_LOSS_UTILS = (4, 46)  # loss_utils.ForCausalLMLoss; before it, the forward rebinds logits.float()
_SOFTMAX_DROPS_INPUT = (1, 11)  # torch: SoftmaxBackward0 saves self_scalar_type instead of self_ (issue #64000)


def transformers_release(spec: TrainingSpec) -> tuple[int, ...] | None:
    """``(major, minor, ...)`` of the environment's transformers, or None (the modelled 5.23 is assumed)."""
    return spec.stack.release("transformers")


def legacy_transformers(spec: TrainingSpec) -> bool:
    """True for a transformers 4.x environment (the modelled 4.40-4.57 differences apply)."""
    release = transformers_release(spec)
    return release is not None and release[0] < 5


def legacy_softmax_keeps_input(spec: TrainingSpec) -> bool:
    """True when the stack's torch (before 1.11) keeps a softmax's input for its backward (module docstring)."""
    release = spec.stack.release("torch")
    return release is not None and release[:2] < _SOFTMAX_DROPS_INPUT


def legacy_logits_extra(spec: TrainingSpec, e: int) -> int:
    """Extra bytes at the forward's loss peak from the older causal-LM loss path (0 on transformers >= 4.49).

    Args:
        spec: The training spec (its ``stack`` says the transformers version).
        e: Element bytes of the logits the LM head returns (2 for a 16-bit model or under autocast, 4 fp32).

    Returns:
        ``4·b·(s-1)·V`` for the shifted fp32 copy, less the 16-bit logits the forward no longer holds before
        4.46 (it rebinds ``logits = logits.float()``). At micro-batch 1 there is no copy: the slice
        ``logits[..., :-1, :]`` of a contiguous ``(1, s, V)`` tensor is itself contiguous, so ``.contiguous()``
        returns it (measured: ``benchmarks/fsdp1_lora_cpu.py`` on transformers 4.48.1, the forward's peak at
        micro-batch 1 is one ``4·(s-1)·V`` tensor below the formula that counted it).
    """
    release = transformers_release(spec)
    if release is None or release[:2] >= _SHIFT_COPY_FIXED or not spec.model.shape.causal_lm:
        return 0
    b, s, v = spec.batch.micro_batch, spec.batch.seq_len, spec.model.shape.vocab_size
    extra = 4 * b * (s - 1) * v if b > 1 else 0
    if release[:2] < _LOSS_IN_LOSS_UTILS and e == 2:
        extra -= 2 * b * s * v
    return extra


def legacy_bnb_kept_inputs(spec: TrainingSpec) -> int:
    """Bytes bitsandbytes <= 0.43.1 keeps for the graph's life beyond the modelled 0.50: the inputs of the layers'
    4-bit linears (module docstring); 0 for another version, an unknown one, or no 4-bit base with adapters.

    Args:
        spec: The training spec (``stack`` says the bitsandbytes version).

    Returns:
        An upper bound: per layer, the distinct inputs of its 4-bit linears, ``in_features`` elements per token in
        the compute dtype, times the layers and the micro-batch's tokens.
    """
    from fitcheck.core.states import is_quantized  # states import activations: not at module level

    quant = spec.quant
    if not old_bnb_4bit(spec) or quant is None:
        return 0
    e = quant.compute_dtype.nbytes if quant.compute_dtype is not None else 4  # BitsAndBytesConfig: None -> fp32
    inputs: dict[str, int] = {}
    for entry in spec.model.params:
        if "*" in entry.name and is_quantized(spec, entry):  # a layer's linear (layer index as "*")
            key = SHARED_INPUT.get(entry.module, entry.name)
            inputs[key] = max(inputs.get(key, 0), entry.in_features * entry.repeat)
    return sum(inputs.values()) * e * spec.batch.micro_batch * spec.batch.seq_len


def _differences(spec: TrainingSpec) -> list[str]:
    release = transformers_release(spec)
    out: list[str] = []
    if release is None or release[0] >= 5:
        return out
    out.append("from_pretrained without torch_dtype loads float32 (see the dtype assumption)")
    if release[:2] < _SHIFT_COPY_FIXED:
        out.append("the loss upcasts the logits and copies the shifted logits (+4 B per logit at the loss)")
    if spec.model.shape.traits.v4_linear_experts:
        out.append("Mixtral experts and router are nn.Linear (quantized by bitsandbytes, targeted by LoRA), run by a "
                   "per-expert loop (its saved tensors: moe_expert_loop.py)")
    return out


def versions_findings(spec: TrainingSpec) -> tuple[Finding, ...]:
    """Findings about the environment's library versions versus the modelled ones.

    Returns:
        An info finding listing the modelled transformers-4.x differences applied; a warning per package whose
        version is outside what is modelled.
    """
    stack = spec.stack
    out: list[Finding] = []
    if legacy_softmax_keeps_input(spec):
        out.append(
            Finding(
                "versions-modelled",
                Severity.INFO,
                f"torch {stack.get('torch')} ({stack.source}): softmax keeps its input for backward (torch < 1.11): "
                "the formulas add one (b, heads, s, s) tensor per layer to the LayerNorm families' eager attention "
                "(a trace runs the installed torch: such a run is answered from the formulas); other allocations as "
                "torch 2.13's",
            )
        )
    release = transformers_release(spec)
    if release is not None and release[0] < 5:
        lo, hi = LEGACY_TRANSFORMERS
        if lo <= release[:2] <= hi:
            diffs = _differences(spec)
            out.append(
                Finding(
                    "versions-modelled",
                    Severity.INFO,
                    f"transformers {stack.get('transformers')} ({stack.source}): modelled differences from 5.23 "
                    f"applied: {'; '.join(diffs) if diffs else 'none for this run'}",
                )
            )
        else:
            out.append(_outside(spec, "transformers", f"4.{lo[1]}-4.{hi[1]} and 5.x"))
    for name, modelled in MODELLED_VERSIONS.items():
        if name == "transformers" or stack.get(name) is None or (name == "trl" and trl_release_modelled(spec)):
            continue
        have = stack.release(name)
        want = tuple(int(x) for x in modelled.split("."))
        if have is None or have[: len(want)] != want:
            out.append(_outside(spec, name, modelled))
    if release is not None and release[0] >= 5 and release[:2] > (5, 23):
        out.append(_outside(spec, "transformers", "5.23"))
    if trl_module_cast(spec):
        out.append(
            Finding(
                "versions-modelled",
                Severity.INFO,
                f"trl {stack.get('trl')} ({stack.source}): SFTTrainer's peft_module_casting_to_bf16 (TRL 0.7.5-0.25.1) "
                "modelled: after the k-bit preparation the embedding and LM head are bf16 again, the norms fp32"
                + (", the LoRA adapters bf16 (TRL < 0.9.3)" if trl_bf16_trainables(spec) else ""),
            )
        )
    out.extend(sft_release_findings(spec))  # SFTTrainer's step by TRL release (core/trainers/sft_metrics.py)
    out.extend(dpo_release_findings(spec))  # DPOTrainer's (core/trainers/dpo_releases.py)
    out.extend(reward_release_findings(spec))  # RewardTrainer's (core/trainers/reward_step.py)
    if kept_inputs_modelled(spec):
        out.append(
            Finding(
                "bnb-keeps-inputs",
                Severity.INFO,
                f"bitsandbytes {stack.get('bitsandbytes')} ({stack.source}) keeps every 4-bit linear's input until "
                "the graph is freed (MatMul4Bit ctx.tensors = (A, B), fixed in 0.43.2 by PR #1270): modelled (the "
                "inputs nothing else saves during forward, all of them after each layer's backward and through "
                "non-reentrant checkpointing)",
                "upgrade bitsandbytes to 0.43.2 or later",
            )
        )
    elif kept := legacy_bnb_kept_inputs(spec):
        out.append(
            Finding(
                "bnb-keeps-inputs",
                Severity.WARNING,
                f"bitsandbytes {stack.get('bitsandbytes')} ({stack.source}) keeps every 4-bit linear's input until "
                f"the graph is freed (MatMul4Bit ctx.tensors = (A, B), fixed in 0.43.2 by PR #1270): up to "
                f"{format_bytes(kept)} per micro-batch more than estimated, not modelled for this model or adapter",
                "upgrade bitsandbytes to 0.43.2 or later",
            )
        )
    return tuple(out)


def _outside(spec: TrainingSpec, name: str, modelled: str) -> Finding:
    # bitsandbytes <= 0.43.1's kept 4-bit inputs are modelled (bnb_kept_inputs.py; the bnb-keeps-inputs finding)
    but = ", except the 4-bit inputs it keeps (bnb-keeps-inputs)" if name == "bitsandbytes" and kept_inputs_modelled(
        spec) else ""
    return Finding(
        "versions-not-modelled",
        Severity.WARNING,
        f"{name} {spec.stack.get(name)} ({spec.stack.source}) is outside what is modelled ({name} {modelled}): "
        f"its allocations are estimated as those of {name} {MODELLED_VERSIONS[name]}{but}",
        f"check with a measured step on that environment, or pass --stack {name}={MODELLED_VERSIONS[name]} "
        "to ask about the modelled stack",
    )
