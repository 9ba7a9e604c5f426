"""What a TRL 1.16 trainer's step allocates beyond the plain Trainer step: pure functions over components.

``step_spec(spec)`` is the spec the policy's forward/backward actually runs (DPO: chosen + rejected concatenated,
2 x rows of prompt + completion; GRPO: rows of prompt + max_completion_length). ``trainer_components(spec, base)``
takes the plain-Trainer components of that step and

- replaces ``logits.loss`` (full-vocabulary logits, transformers' ForCausalLMLoss) by ``logits.fused_head``: TRL
  1.16 patches every SFT/DPO/GRPO model with ``add_fused_lm_head`` and computes the loss from the chunked
  log-probs (``fitcheck.core.trainers.fused_head``; ``trl/trainer/sft_trainer.py SFTTrainer.compute_loss``,
  ``dpo_trainer.py _compute_loss``, ``grpo_trainer.py _get_per_token_logps_and_entropies``);
- adds ``reference_model.weights`` (DPO without PEFT and without precomputed log-probs: ``create_model_from_path``
  loads a second copy in the policy's dtype, ``dpo_trainer.py`` L908-927; GRPO with ``beta > 0``, grpo_trainer.py
  L983-1003; under PEFT the reference is the base with adapters disabled: no copy);
- adds ``reference_model.forward``: DPO's reference forward runs under ``no_grad`` AFTER the policy forward
  (``_compute_loss``), so its fused head's buffers stack on the policy's saved activations;
- adds the GRPO generation phase (``generation.kv_cache``, ``generation.working_set``; ``Phase.GENERATION``).

GRPO's log-prob pre-pass (``grpo_trainer.py _generate_and_score_completions``, TRL 1.16): after ``generate`` (its KV
cache freed), the reference log-probs (``beta`` > 0) and the old-policy log-probs (when ``gradient_accumulation_steps``
is not a multiple of ``steps_per_generation x num_iterations``, or with vLLM's importance-sampling correction,
default on) run as ``no_grad`` fused forwards over the generation batch in chunks of
``per_device_train_batch_size`` rows (``_get_per_token_logps_and_entropies(batch_size=...)``). Each chunk is the
training forward's own shapes without saved activations, gradients or ``log_z``, so its peak is below the training
step's (``forward_peak(grad=False) <= forward_peak(grad=True)``, and nothing is saved yet): it never sets the peak
and is not a component of its own (measured: ``benchmarks/trl_truth.py`` GRPO rows, beta 0.04, within 0.01%).
"""

from __future__ import annotations

import dataclasses

from fitcheck.core.kernels import liger_cross_entropy
from fitcheck.core.states import partition
from fitcheck.core.trainers.dpo_releases import dpo_release_component, dpo_release_layout
from fitcheck.core.trainers.full_logits import full_logits_component, outside_forward
from fitcheck.core.trainers.fused_head import (
    FusedHeadInputs,
    backward_peak,
    forward_outputs,
    forward_peak,
)
from fitcheck.core.trainers.generation_phase import generation_bytes
from fitcheck.core.trainers.registry import ReferenceRule, fused_outputs, step_runs_fused_head, trainer_row
from fitcheck.core.trainers.reward_step import reward_component
from fitcheck.core.trainers.sft_metrics import sft_metrics_component, sft_metrics_layout
from fitcheck.report import PHASES, Category, Component, Location, Phase
from fitcheck.spec import (
    DeviceType,
    Kind,
    MixedPrecision,
    ModelInventory,
    ParamEntry,
    Role,
    TrainerKind,
    TrainingSpec,
    VllmMode,
)

_TRL = "TRL 1.16 source (trl/trainer/*_trainer.py)"


def step_spec(spec: TrainingSpec) -> TrainingSpec:
    """The spec of the policy's forward/backward as the trainer runs it (its rows and length; DPO's, KTO's and
    the reward trainer's model without dropout modules: :func:`_dropout_disabled`)."""
    t = spec.trainer
    row = trainer_row(t.kind)
    if row.disable_dropout:
        spec = _dropout_disabled(spec)
    if row.prompt_completion:  # DPO: chosen + rejected concatenated; GRPO, KTO: one completion per row
        seq = t.prompt_length + t.completion_length or spec.batch.seq_len
        rows = row.rows_per_example * spec.batch.micro_batch
        return dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, micro_batch=rows, seq_len=seq))
    if t.kind is TrainerKind.SFT and t.padding_free:
        # DataCollatorForLanguageModeling(padding_free=True) flattens the micro-batch into ONE row of b x s tokens
        # with position_ids (sft_trainer.py); packing alone keeps rows of max_length (the seq_len semantics here)
        rows, seq = spec.batch.micro_batch, spec.batch.seq_len
        return dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, micro_batch=1, seq_len=rows * seq))
    if row.classifier:  # chosen + rejected concatenated (reward_trainer.py compute_loss)
        batch = dataclasses.replace(spec.batch, micro_batch=row.rows_per_example * spec.batch.micro_batch)
        return dataclasses.replace(spec, batch=batch, model=_sequence_classifier(spec))
    return spec


def _dropout_disabled(spec: TrainingSpec) -> TrainingSpec:
    """``spec`` after TRL's ``disable_dropout_in_model`` (``trl/trainer/utils.py``: every ``torch.nn.Dropout``'s
    ``p`` set to 0), which DPO, KTO and the reward trainer run on the policy before step 1 (the registry's
    ``disable_dropout``). torch's dropout with ``p`` 0 returns its input (aten Dropout.cpp ``_dropout_impl``), so
    no mask or copy is saved:

    - peft's ``lora_dropout`` (an ``nn.Dropout`` per wrapped module; real KTOTrainer, LoRA without checkpointing:
      the formula's 33,028,920 B with it vs 30,768,836 B live, ``benchmarks/trl_replay.py``);
    - the family's own ``nn.Dropout`` modules (GPT-2's ``attn_pdrop`` / ``resid_pdrop`` / ``embd_pdrop``, BERT's,
      Phi's ``resid_pdrop`` / ``embd_pdrop``, a classifier head's), not the probabilities a family passes as a
      float (``Dropout.functional``: BLOOM's / Falcon's ``dropout_add``, Phi's attention dropout). GPT-2's SDPA
      reads ``attn_dropout.p`` (modeling_gpt2.py ``GPT2Attention.forward``), so its CPU attention takes the flash
      kernel then, not the math path with its s x s tensors.
    """
    sh = spec.model.shape
    traits = sh.traits.dropout_modules_disabled()
    if traits != sh.traits:
        model = dataclasses.replace(spec.model, shape=dataclasses.replace(sh, traits=traits))
        spec = dataclasses.replace(spec, model=model)
    if spec.lora is not None and spec.lora.dropout:
        spec = dataclasses.replace(spec, lora=dataclasses.replace(spec.lora, dropout=0.0))
    return spec


def _sequence_classifier(spec: TrainingSpec) -> ModelInventory:
    """The model as ``AutoModelForSequenceClassification`` loads it: the LM head replaced by ``score`` [labels, h].

    RewardTrainer (reward_trainer.py, TRL 1.16) loads the model with ``num_labels=1``; transformers'
    ``*ForSequenceClassification`` has a bias-free ``score`` Linear and returns ``[rows, seq, labels]`` logits
    pooled at the last token: the vocabulary-sized tensors are gone (``vocab_size`` of the step = labels).
    """
    inv = spec.model
    labels = inv.shape.traits.config_num_labels
    if any(p.name == "score.weight" for p in inv.params):
        return inv
    params = tuple(p for p in inv.params if p.role is not Role.LM_HEAD)
    params += (ParamEntry("score.weight", (labels, inv.shape.hidden_size), Role.OTHER, Kind.OTHER, module="score"),)
    shape = dataclasses.replace(inv.shape, vocab_size=labels, tied_embeddings=False)
    return dataclasses.replace(inv, params=params, shape=shape)


def fused_head_inputs(spec: TrainingSpec, *, grad: bool, outputs: tuple[str, ...], scored: int | None = None
                      ) -> FusedHeadInputs:
    """The fused head's shapes for one call of ``spec``'s step (``scored``: labelled positions, CUDA only)."""
    sh = spec.model.shape
    half = spec.precision.load_dtype.nbytes
    amp = spec.precision.mixed_precision is not MixedPrecision.NO
    compute = 2 if amp else half
    full = spec.lora is None and spec.quant is None and spec.freeze is None
    return FusedHeadInputs(
        rows=spec.batch.micro_batch, seq=spec.batch.seq_len, scored=scored, hidden=sh.hidden_size,
        vocab=sh.vocab_size, compute_bytes=compute, hidden_bytes=half, weight_bytes=half,
        cuda=spec.hardware.device_type is DeviceType.CUDA, outputs=outputs, weight_grad=full and grad, grad=grad,
    )


def _scored(spec: TrainingSpec) -> int:
    """Positions with a label (the CUDA path scores only these): completion tokens for DPO/GRPO."""
    t, b, s = spec.trainer, spec.batch.micro_batch, spec.batch.seq_len
    if trainer_row(t.kind).prompt_completion and t.completion_length:
        return b * t.completion_length
    return b * (s - 1)


def _weights_bytes(spec: TrainingSpec) -> int:
    return spec.model.total_params * spec.precision.load_dtype.nbytes


def has_reference_copy(spec: TrainingSpec) -> bool:
    """The trainer keeps a separate reference copy (DPO/KTO without PEFT or precomputed log-probs, GRPO beta > 0)."""
    t = spec.trainer
    if spec.lora is not None:
        return False
    rule = trainer_row(t.kind).reference
    if rule is ReferenceRule.IN_STEP:  # KTO: kto_trainer.py L919-938, the same create_model_from_path copy as DPO
        return not t.precompute_ref_log_probs
    return rule is ReferenceRule.WHEN_BETA and t.beta != 0.0


def reference_weights(spec: TrainingSpec) -> Component:
    """The reference copy's weights on one GPU, placed as TRL 1.16 prepares it under the run's sharding.

    ``dpo_trainer.py`` L984-990 / ``grpo_trainer.py`` L1182-1188 (TRL 1.16): with DeepSpeed the reference goes
    through ``trl/models/utils.py prepare_deepspeed``, which keeps ZeRO-3 (and its ``offload_param``: only
    ``offload_optimizer`` is dropped) and sets every other stage to 0 -- ZeRO-1/2 keep a whole copy per GPU; with
    FSDP ``prepare_fsdp`` wraps it with the run's own plugin (sharding strategy, CPU offload); otherwise
    ``accelerator.prepare_model(evaluation_mode=True)``: a whole copy (DDP replicas). The policy's weights are
    divided the same way (``fitcheck.core.states.partition``: ZeRO-3 / FSDP divide by the shard group).
    """
    part = partition(spec)
    nbytes = -(-_weights_bytes(spec) // part.weights)
    share = f", 1/{part.weights} per GPU ({part.description})" if part.weights > 1 else ""
    location = Location.HOST if part.params_on_host else Location.DEVICE
    source = (_TRL + ": create_model_from_path(policy id); trl/models/utils.py prepare_deepspeed (stage 3 kept, "
              "else 0) / prepare_fsdp")
    detail = f"{spec.model.total_params:,} params frozen copy in {spec.precision.load_dtype.value}{share}"
    if location is Location.HOST:  # host components are per node, as the policy's (states/model_states.py)
        nbytes *= spec.sharding.processes_per_machine
        detail += "; offloaded to host RAM with the policy's (per node)"
    return Component.persistent("reference_model.weights", Category.WEIGHTS, nbytes, source, detail, location)


def _last_hidden(spec: TrainingSpec) -> int:
    sh = spec.model.shape
    return spec.batch.micro_batch * spec.batch.seq_len * sh.hidden_size * spec.precision.load_dtype.nbytes


def _fused_head_component(spec: TrainingSpec, head_input: int) -> Component:
    t = spec.trainer
    x = fused_head_inputs(spec, grad=True, outputs=fused_outputs(t.kind), scored=_scored(spec))
    fwd = forward_peak(x)
    bwd, _ = backward_peak(x)
    labels = 8 * spec.batch.micro_batch * spec.batch.seq_len  # labels / completion mask (int64)
    # the backbone's last hidden state is held by the patched forward while the head runs, then freed: only the
    # kernel's own copy is saved. The plain LM head's input that activations.saved counts (the norm output, kept
    # by a trained head only: head_input) is not kept. Before: the whole last hidden state was taken away for a
    # frozen head too (LoRA, QLoRA): the formula 130-170 KB (-0.3 %) under every real LoRA row of
    # benchmarks/trl_replay.py (SFT, DPO, KTO, GRPO)
    fwd_phase = fwd + labels
    bwd_phase = bwd + labels - head_input
    if trainer_row(t.kind).reference is ReferenceRule.IN_STEP and not t.precompute_ref_log_probs:
        # the reference forward (no_grad, after the policy's): the policy's outputs stay, the reference's
        # backbone output and its fused head's buffers (log-probs only) come on top. KTO runs two of them one after
        # the other (the KL batch's, then the completions'; kto_trainer.py _compute_loss), of the same size; its
        # policy KL pass (no_grad, before the policy forward) is smaller than the policy's own forward
        ref = fused_head_inputs(spec, grad=False, outputs=("log_probs",), scored=_scored(spec))
        fwd_phase = max(fwd_phase, forward_outputs(x) + labels + _last_hidden(spec) + forward_peak(ref))
    return Component(
        "logits.fused_head",
        Category.LOGITS,
        Location.DEVICE,
        {Phase.FORWARD_END: fwd_phase, Phase.BACKWARD_START: bwd_phase},
        "trl/kernels/chunked_logprob.py ChunkedLogProbFunction (TRL 1.16): mm_buf min(N,4096)x32768 + "
        + ("Triton folds (CUDA)" if x.cuda else "torch fallback tiles (CPU)"),
        f"{x.n} positions x {x.vocab} vocab in tiles; buffer {min(x.n, 4096)}x32768 "
        f"({'scored positions only' if x.cuda else 'every position'})",
        )


GENERATION_TRACED = ("generation.kv_cache", "generation.working_set")  # the parts a trace of generate gives


def generation_rows(spec: TrainingSpec) -> int:
    """Sequences ``generate`` runs together: ``generation_batch_size`` per process, else ``per_device_train_batch_size
    x steps_per_generation`` (GRPOConfig: ``steps_per_generation`` defaults to ``gradient_accumulation_steps``)."""
    t = spec.trainer
    steps = t.steps_per_generation or spec.batch.grad_accum
    return t.generation_batch_size // spec.data_parallel_size if t.generation_batch_size \
        else spec.batch.micro_batch * steps


def generation_parts(spec: TrainingSpec, kv: int, working: int, source: str) -> tuple[Component, Component]:
    """The KV cache and working-set components of GRPO's generation phase (the formula's or a trace's)."""
    sh = spec.model.shape
    tokens = spec.trainer.prompt_length + spec.trainer.completion_length - 1
    return (
        Component("generation.kv_cache", Category.ACTIVATIONS, Location.DEVICE, {Phase.GENERATION: kv},
                  "transformers DynamicCache: K and V per layer [rows, kv_heads, tokens, head_dim]",
                  f"{generation_rows(spec)} sequences x {tokens} tokens x {sh.num_layers} layers"),
        Component("generation.working_set", Category.TEMPORARIES, Location.DEVICE, {Phase.GENERATION: working},
                  source,
                  "the prefill's excess over the whole cache (prompt K/V, residual stream, MLP or LoRA moment) or "
                  "the last step's torch.cat block / sampling tensors"),
    )


# What stays allocated between training steps, in a phase outside the step (generation, evaluation): the model's and
# the optimizer's tensors, and the cuBLAS / cuBLASLt workspaces (``overhead.cublas_workspace``: allocated through the
# caching allocator at a thread's first cuBLAS call and kept for the process, torch ``CublasHandlePool.cpp``;
# ``core/overheads.py``). Gradients are not: ``zero_grad(set_to_none=True)`` freed them after the optimizer step.
HELD_BETWEEN_STEPS = (Category.WEIGHTS, Category.ADAPTERS, Category.QUANT_META, Category.OPTIMIZER, Category.MASTER,
                      Category.OVERHEAD)


def held_between_steps(c: Component) -> bool:
    """Whether a step's component is alive on the device between steps (an overhead only where it is inside the
    caching allocator, ``Location.DEVICE``: the cuBLAS workspaces; the CUDA context and NCCL are outside it).

    Measured (H200, torch 2.11): the bytes allocated before ``GRPOTrainer._generate`` of step 2 are the weights,
    the optimizer states and the two threads' workspaces (``benchmarks/data/trl_gpu_nvidia_h200.json``), and
    ``Trainer.evaluate``'s peak is 68 MB (the workspaces) above the weights, states and forward without them
    (``benchmarks/data/trainer_gpu_nvidia_h200.json``).
    """
    return c.location is Location.DEVICE and c.category in HELD_BETWEEN_STEPS


def _generation(spec: TrainingSpec, persistent: int, traced: bool = False) -> list[Component]:
    """GRPO without vLLM: ``model.generate`` for the generation batch (no grad), after the optimizer step; with
    ``traced``, the cache and working set are a trace's (already among the components), only the held state is
    added here."""
    t = spec.trainer
    if t.kind is not TrainerKind.GRPO or (t.use_vllm and t.vllm_mode is VllmMode.SERVER):
        return []
    held = Component("generation.weights_and_states", Category.WEIGHTS, Location.DEVICE,
                     {Phase.GENERATION: persistent},
                     "weights, optimizer states (and reference) and the cuBLAS workspaces stay during generate",
                     "everything persistent; gradients were freed by zero_grad")
    if t.use_vllm:  # colocate: vLLM holds its share of the GPU for the whole run (grpo_trainer.py vllm_generation)
        share = int(spec.hardware.gpu_memory_bytes * t.vllm_gpu_memory_utilization)
        return [held, Component("generation.vllm_colocate", Category.OVERHEAD, Location.DEVICE_OTHER,
                          {p: share for p in (*PHASES, Phase.GENERATION)},
                          "GRPOConfig.vllm_gpu_memory_utilization (TRL 1.16): vLLM's share of the same GPU",
                          f"{t.vllm_gpu_memory_utilization:.0%} of the GPU")]
    if traced:
        return [held]
    kv, working = generation_bytes(spec, generation_rows(spec))
    return [held, *generation_parts(
        spec, kv, working, "transformers 5.23 generation/utils.py _sample, cache_utils.py DynamicLayer.update, peft "
        "0.21.2 lora Linear.forward in train mode (core/trainers/generation_phase.py)")]


def trainer_components(spec: TrainingSpec, base: tuple[Component, ...], head_input: int = 0, *,
                       traced: bool = False) -> tuple[Component, ...]:
    """The components of a TRL trainer's step, from the plain-Trainer components of ``step_spec(spec)``.

    Args:
        spec: The training spec as given (``spec.trainer`` says which trainer).
        base: ``collect_components(step_spec(spec))`` of the plain step.
        head_input: Bytes of the LM head's input that ``base``'s activations count
            (``core.activations.lm_head_input_saved`` of the step), which TRL's fused head does not keep.
        traced: ``base``'s activations come from a trace of the step (which holds the reward step's moments
            itself: no ``activations.reward_step``).

    Returns:
        The components with the fused head, the reference model and the generation phase where they apply.
    """
    t = spec.trainer
    if not t.is_trl:
        return base
    run = step_spec(spec)
    out: list[Component] = []
    metrics = sft_metrics_layout(run) is not None and not liger_cross_entropy(run)  # Liger returns no logits
    old_dpo = dpo_release_layout(run) is not None  # TRL 0.19 - 1.13: every moment outside the forward
    cache = next((c for c in base if c.name == "activations.autocast_weight_cache"), None)
    for c in base:
        if c.name == "logits.loss" and metrics:
            out.append(sft_metrics_component(run, c, cache))
        elif old_dpo:
            out.append(dpo_release_component(run, c) if c.name == "logits.loss" else outside_forward(c))
        elif c.name == "logits.loss" and step_runs_fused_head(run):
            out.append(_fused_head_component(run, head_input))
        elif spec.activations.loss == "full-logits" and trainer_row(t.kind).full_logits:
            out.append(full_logits_component(run, c) if c.name == "logits.loss" else outside_forward(c))
        else:
            out.append(c)
    if has_reference_copy(spec):
        out.append(reference_weights(spec))
    if trainer_row(t.kind).classifier and not traced:  # the reward step's moments inside the model
        reward = reward_component(run, tuple(out))
        out.extend(() if reward is None else (reward,))
    persistent = sum(c.at(Phase.FORWARD_END) for c in out if held_between_steps(c))
    traced = any(c.name in GENERATION_TRACED for c in base)  # the default path traced generate (tracer_generate)
    out.extend(_generation(run, persistent, traced))
    return tuple(out)


def lm_head_params(spec: TrainingSpec) -> int:
    """Parameters of the LM head (0 for tied heads)."""
    return sum(p.numel for p in spec.model.params if p.role is Role.LM_HEAD)
