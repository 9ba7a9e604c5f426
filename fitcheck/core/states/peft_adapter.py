"""A PEFT adapter other than LoRA (``TrainingSpec.peft``): its tensors as peft built them, and what is refused.

The formulas know LoRA's tensors (:mod:`.lora`); for IA3, LoHa, LoKr, OFT, VeRA, AdaLoRA, prompt / prefix /
p-tuning and LN tuning the tensors are read from the real peft model (peft 0.21.2 ``get_peft_model`` on fake
tensors: ``torch_adapters/peft_adapters.py`` fills ``PeftAdapterSpec.tensors``) and the step's activations from its
trace. Without that inventory (no torch, ``--no_trace``) nothing here can answer, and :func:`check_peft_adapter`
refuses the run rather than estimate it as LoRA or as full fine-tuning.
"""

from __future__ import annotations

from fitcheck.errors import NotModelledError
from fitcheck.findings import Finding, Severity
from fitcheck.spec import AdapterTensor, TrainingSpec

# peft types the libraries refuse to train with gradient checkpointing: peft 0.21.2 ``peft_model.py``
# ``PeftModel._setup_prompt_encoder`` raises ``ValueError("PREFIX_TUNING does not work with gradient checkpointing.")``
# when the base model is checkpointed before ``get_peft_model``; enabled after (``Trainer.train``), transformers 5.23
# ``modeling_layers.py`` ``GradientCheckpointingLayer`` sets ``past_key_values=None`` in every checkpointed layer, so
# the prefix is dropped and SDPA fails on the prefix-wide attention mask (a real ``Trainer`` step on CPU:
# "RuntimeError: The size of tensor a (16) must match the size of tensor b (20)"). Every other type of
# ``TRACED_PEFT_TYPES`` trained one real Trainer step with ``gradient_checkpointing=True`` on CPU.
_NO_CHECKPOINTING = frozenset({"PREFIX_TUNING"})


def check_peft_adapter(spec: TrainingSpec) -> None:
    """Refuse a ``TrainingSpec.peft`` run fitcheck cannot estimate.

    Raises:
        NotModelledError: The adapter's tensors were not built (no torch, ``--no_trace``), or it is combined with
            what the traced adapter step does not describe (LoRA, a quantized base, freezing, sharding, a tp / cp / sp
            layout, TRL), or with what the libraries refuse to train (prefix tuning with gradient checkpointing).
    """
    peft = spec.peft
    if peft is None:
        return
    if not peft.tensors:
        raise NotModelledError(
            f"{peft.source}:peft_type: {peft.peft_type} adapters are estimated only from the real peft model and a "
            "traced step; the formulas do not model them. Install torch, transformers and peft and drop "
            "--no_trace (or pass a LoRA adapter_config.json)")
    others = [what for what, on in (
        ("a LoRA config too", spec.lora is not None),
        ("a quantized base", spec.quant is not None),
        ("partial freezing", spec.freeze is not None),
        ("DeepSpeed / FSDP sharding", spec.sharding.fsdp or spec.sharding.zero_stage is not None),
        ("a tp / cp / sp layout", spec.sharding.parallelism is not None),
        ("a TRL trainer", spec.trainer.is_trl),
    ) if on]
    if others:
        raise NotModelledError(
            f"{peft.source}:peft_type: {peft.peft_type} adapters are estimated for a plain (DDP) run of a 16/32-bit "
            f"base only, not with {', '.join(others)}; drop that setting or use a LoRA adapter_config.json")
    if peft.peft_type in _NO_CHECKPOINTING and spec.activations.checkpointing:
        raise NotModelledError(
            f"{peft.source}:peft_type: {peft.peft_type} does not train with gradient checkpointing: peft refuses to "
            "wrap a checkpointed model (\"PREFIX_TUNING does not work with gradient checkpointing.\"), and when the "
            "Trainer enables it afterwards transformers drops the prefix from every layer (past_key_values=None) and "
            "the step fails on the prefix's attention mask; drop --gradient_checkpointing")


def peft_adapter_tensors(spec: TrainingSpec) -> tuple[AdapterTensor, ...]:
    """The built adapter's tensors (empty without ``TrainingSpec.peft``)."""
    return () if spec.peft is None else spec.peft.tensors


def peft_adapter_params(spec: TrainingSpec) -> int:
    """Parameters the adapter adds to the model (trainable or frozen; buffers and base parameters made trainable
    in place are not added)."""
    return sum(t.numel_each * t.repeat for t in peft_adapter_tensors(spec) if not (t.in_base or t.buffer))


def peft_adapter_findings(spec: TrainingSpec) -> list[Finding]:
    """INFO on a ``TrainingSpec.peft`` run: where its numbers come from; its code unpins the answer (checked only
    against real CPU steps of a tiny model, ``benchmarks/peft_adapters_cpu.py``, never at the user's shape)."""
    peft = spec.peft
    if peft is None:
        return []
    trainable = sum(t.numel_each * t.repeat for t in peft.tensors if t.trainable)
    # benchmarks/data/adalora_tinit_cpu.json (a real CPU loop of peft 0.21.2): the step's peak is the same before
    # tinit and while mask_to_budget masks (13,957,896 B at steps 1-8); after total_step - tfinal, reset_ipt frees
    # the allocator's states (12,578,568 B, -9.9 %)
    adalora = (" AdaLoRA: the step is traced before tinit with the rank allocator's states; its masking after tinit "
               "is not traced (on a real CPU loop it left the step's peak unchanged: "
               "benchmarks/adalora_tinit_cpu.py), and its last tfinal steps free those states (lower)."
               if peft.peft_type == "ADALORA" else "")
    return [Finding(
        "peft-adapter-traced", Severity.INFO,
        f"{peft.peft_type} adapters: {trainable:,} trainable parameters from peft's own model (get_peft_model on "
        "fake tensors) and the step traced with them; checked against real CPU steps of a tiny Llama "
        f"(benchmarks/peft_adapters_cpu.py), not at this shape.{adalora}",
        "measure one step (FitcheckCallback) to pin it")]
