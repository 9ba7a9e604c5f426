"""One row per trainer kind: everything the rest of fitcheck reads about a trainer (TRL 1.16).

Every module that branches on a group of trainers reads a column here instead of keeping its own set or table
of ``TrainerKind`` values (``tests/test_trainer_registry.py`` forbids such literals outside this module). A new
trainer kind is one row here, its component module and its tests.

Columns (:class:`TrainerRow`):

- ``config_class``: TRL 1.16's config dataclass (``trl.SFTConfig``, ...); None for the plain ``Trainer``.
- ``fused_head``: the outputs the trainer patches its policy with (``add_fused_lm_head(outputs=...)``,
  ``trl/trainer/utils.py``); None when its loss does not run through TRL's chunked LM head
  (``trl/kernels/chunked_logprob.py``): then the model's own logits and loss run.
- ``reference``: when the trainer keeps a separate reference copy (:class:`ReferenceRule`).
- ``rows_per_example``: sequences the policy step runs per dataset row (DPO, reward: chosen + rejected).
- ``prompt_completion``: rows are prompt + completion tokens; only completion tokens are scored.
- ``evaluation``: which evaluation step runs (:class:`EvalRule`) and ``eval_source``, the TRL source it follows.
- ``defaults``: the TRL config defaults that change memory (pinned by ``tests/test_trl_cli.py`` against the
  installed TRL's dataclasses); ``script_fields``: the config fields ``fitcheck launch`` reads off a script.
- ``full_logits``: the subclass whose loss reads the full fp32 logits instead of the fused head (``--loss
  full-logits``, ``fitcheck.core.trainers.full_logits``): :class:`FullLogits`; None where no such variant is
  modelled.
- ``dataset_columns``: the prepared dataset's token-id columns whose longest row is the sequence (or, with
  ``prompt_completion``, the completion next to ``prompt_ids``); empty when the prompts stay text (GRPO).
- ``disable_dropout``: the trainer's config defaults ``disable_dropout`` to True and ``__init__`` then runs
  ``disable_dropout_in_model`` (``trl/trainer/utils.py``: every ``torch.nn.Dropout``'s ``p`` set to 0) on the
  policy before step 1: peft's LoRA dropout (an ``nn.Dropout`` per wrapped module) saves no mask or copy then
  (``core.trainers.step_spec``). fitcheck has no setting for ``disable_dropout=False``.
- ``replay_step``: the torch adapter that traces this trainer's own step for the whole-run allocator replay
  (``fitcheck.torch_adapters.replay_step_args.run_trace_kwargs``: ``tracer_trl`` for SFT's fused head,
  ``tracer_dpo`` for DPO's reference pass and chosen + rejected rows, ``tracer_kto`` for KTO's KL batch and
  reference pass, ``tracer_grpo`` for GRPO's log-prob pre-pass and loss, ``tracer`` for the reward trainer's
  sequence-classification step); None where the replay has no trace of it.
- ``classifier``: the policy is ``AutoModelForSequenceClassification`` (the reward trainer): the LM head replaced by
  ``score`` [labels, h] (``core.trainers.step_spec``), no vocabulary-sized logits, so the step's peaks are moments
  inside the model (``core/trainers/reward_step.py``).
- ``reference_by_name_from``: the first TRL release whose trainer builds its reference model by name with the
  policy's ``model_init_kwargs`` alone, not as a copy of the policy object (``core/states/trl_adapters.py``
  ``reference_loads_by_name``): GRPO v0.19.0 (``grpo_trainer.py`` ``from_pretrained(model_id, **model_init_kwargs)``),
  DPO v0.29.0 and KTO v1.2.0 (``create_model_from_path(ref_model_path, **ref_model_init_kwargs)``); None where the
  trainer keeps no reference.

Trainers TRL 1.16 ships that are no small step from these are refused with the reason (:data:`REFUSED`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from fitcheck.core.states import DpoLoss, SftLoss, dpo_loss, dpo_release_modelled, sft_loss, trl_release
from fitcheck.spec import TrainerKind, TrainingSpec


class ReferenceRule(str, Enum):
    """When a trainer holds a separate frozen reference copy of the policy (under PEFT: never, the base with
    adapters disabled is the reference)."""

    NONE = "none"
    # DPO / KTO: create_model_from_path loads a second copy unless precompute_ref_log_probs; its no_grad forward
    # runs after the policy's, in the same step (dpo_trainer.py L908-927, kto_trainer.py L919-938, _compute_loss)
    IN_STEP = "in_step"
    # GRPO: a copy when beta != 0 (grpo_trainer.py L983-1003); its log-probs run in the pre-pass after generate
    WHEN_BETA = "when_beta"


class EvalRule(str, Enum):
    """Which evaluation step the trainer runs (``fitcheck.core.trainers.evaluation``)."""

    TRAINER = "trainer"  # transformers Trainer.prediction_step: logits + ForCausalLMLoss
    SFT = "sft"  # Trainer.prediction_step on SFTTrainer.compute_loss: the fused head, no_grad
    PAIRED = "paired"  # DPO / KTO prediction_step: _compute_loss forwards + metrics logits (evaluation_trl._dpo)
    GENERATE = "generate"  # GRPO: generate, then no_grad fused forwards (evaluation_trl._grpo)
    CLASSIFIER = "classifier"  # reward: the sequence-classification forward (evaluation_trl._reward)


@dataclass(frozen=True)
class FullLogits:
    """A trainer subclass computing its log-probs from the full fp32 logits (``fitcheck.core.trainers.full_logits``).

    Attributes:
        source: The subclass and the lines it follows.
        kept: fp32 ``[rows, seq, vocab]`` tensors of the policy alive through the reference forward (besides the
            saved log-softmax).
        reference: fp32 ``[rows, seq, vocab]`` logits alive at the reference forward's peak (besides the one
            log-softmax being computed).
    """

    source: str
    kept: int
    reference: int


@dataclass(frozen=True)
class TrainerRow:
    """Everything fitcheck reads about one trainer kind (module docstring: the columns)."""

    kind: TrainerKind
    config_class: str | None
    fused_head: tuple[str, ...] | None
    reference: ReferenceRule
    rows_per_example: int
    prompt_completion: bool
    evaluation: EvalRule
    eval_source: str
    defaults: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    script_fields: tuple[str, ...] = ()
    dataset_columns: tuple[str, ...] = ()
    full_logits: FullLogits | None = None
    replay_step: str | None = None
    disable_dropout: bool = False
    classifier: bool = False
    reference_by_name_from: tuple[int, int] | None = None

    @property
    def trl(self) -> bool:
        """One of TRL's trainers (its config defaults apply to absent flags)."""
        return self.config_class is not None


def _defaults(**fields: object) -> Mapping[str, object]:
    # gradient_checkpointing True and bf16 True in every TRL 1.16 config (trl/trainer/base_config.py: bf16=None
    # becomes ``not fp16``); the rest from each trainer's *_config.py
    return MappingProxyType({"gradient_checkpointing": True, "bf16": True, **fields})


_TRL_EVAL = "transformers 5.23 trainer.py evaluate / evaluation_loop / prediction_step (no_grad forward)"
_ROWS = (
    TrainerRow(TrainerKind.TRAINER, None, None, ReferenceRule.NONE, 1, False, EvalRule.TRAINER, _TRL_EVAL,
               dataset_columns=("input_ids",)),
    TrainerRow(
        TrainerKind.SFT, "SFTConfig", ("log_probs", "entropy", "is_top1"),  # sft_trainer.py L1144-1147
        ReferenceRule.NONE, 1, False, EvalRule.SFT, _TRL_EVAL,
        _defaults(max_length=1024, packing=False, padding_free=False), ("packing", "padding_free"), ("input_ids",),
        replay_step="tracer_trl"),
    TrainerRow(
        TrainerKind.DPO, "DPOConfig", ("log_probs", "entropy", "mean_logits", "is_top1"),  # dpo_trainer.py L956-960
        ReferenceRule.IN_STEP, 2, True, EvalRule.PAIRED,
        "trl/trainer/dpo_trainer.py prediction_step / _compute_loss (TRL 1.16)",
        _defaults(max_length=1024, precompute_ref_log_probs=False, beta=0.1),
        ("precompute_ref_log_probs", "loss_type"), ("chosen_ids", "rejected_ids"),
        # the policy's fp32 logits (returned for the metrics, L311-312); the reference's own
        full_logits=FullLogits("LLaMA-Factory@ff6d4d1 CustomDPOTrainer (src/llamafactory/train/dpo/trainer.py "
                               "concatenated_forward L219-253, compute_reference_log_probs L255-275)", 1, 1),
        replay_step="tracer_dpo", disable_dropout=True,  # dpo_config.py disable_dropout, dpo_trainer.py L932-935
        reference_by_name_from=(0, 29)),
    TrainerRow(
        TrainerKind.GRPO, "GRPOConfig", ("log_probs", "entropy"),  # grpo_trainer.py L1068-1073
        ReferenceRule.WHEN_BETA, 1, True, EvalRule.GENERATE,
        "trl/trainer/grpo_trainer.py prediction_step / _generate_and_score_completions (TRL 1.16)",
        _defaults(num_generations=8, max_completion_length=512, beta=0.0, use_vllm=False, vllm_mode="colocate",
                  vllm_gpu_memory_utilization=0.3),
        ("num_generations", "max_completion_length", "beta", "generation_batch_size", "steps_per_generation",
         "use_vllm", "vllm_mode", "vllm_gpu_memory_utilization"), replay_step="tracer_grpo",
        reference_by_name_from=(0, 19)),
    TrainerRow(
        TrainerKind.REWARD, "RewardConfig", None,  # AutoModelForSequenceClassification: no LM head at all
        ReferenceRule.NONE, 2, False, EvalRule.CLASSIFIER,
        "trl/trainer/reward_trainer.py compute_loss (can_return_loss, TRL 1.16)", _defaults(max_length=1024),
        dataset_columns=("chosen_ids", "rejected_ids"),
        disable_dropout=True,  # reward_config.py disable_dropout (default True), reward_trainer.py L557-558
        # reward_trainer.py: AutoModelForSequenceClassification, num_labels=1; replayed as tracer's seq-cls step
        classifier=True, replay_step="tracer"),
    TrainerRow(
        TrainerKind.KTO, "KTOConfig", ("log_probs", "entropy", "mean_logits"),  # kto_trainer.py L967-970
        ReferenceRule.IN_STEP, 1, True, EvalRule.PAIRED,  # one (unpaired) completion per row
        "trl/trainer/kto_trainer.py prediction_step / _compute_loss (TRL 1.16)",
        _defaults(max_length=1024, precompute_ref_log_probs=False, beta=0.1),  # trl/trainer/kto_config.py
        ("precompute_ref_log_probs",), ("completion_ids",),
        # the policy's chosen / rejected logits (boolean-index copies, L194-197); at the reference's KL forward its
        # target logits and the KL logits (concatenated_forward L187-189 under no_grad)
        full_logits=FullLogits("LLaMA-Factory@ff6d4d1 CustomKTOTrainer (src/llamafactory/train/kto/trainer.py "
                               "forward L149-181, concatenated_forward L184-199, compute_reference_log_probs "
                               "L202-218)", 1, 2),
        replay_step="tracer_kto", disable_dropout=True,  # kto_config.py disable_dropout, KTOTrainer.__init__
        reference_by_name_from=(1, 2)),
)
# KTOConfig.loss_type's choices and default (trl/trainer/kto_config.py, TRL 1.16; a single string, not a list);
# apo_zero_unpaired runs no KL batch (KTOTrainer.__init__: calculate_kl = args.loss_type not in ["apo_zero_unpaired"])
KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")
KTO_DEFAULT_LOSS = ("kto",)
NO_KL_LOSSES = ("apo_zero_unpaired",)


def calculates_kl(loss_type: tuple[str, ...]) -> bool:
    """``KTOTrainer.calculate_KL``: every loss type but ``apo_zero_unpaired`` estimates the KL term (a KL batch
    and its forwards)."""
    return not any(name in NO_KL_LOSSES for name in loss_type)


TRAINERS: Mapping[TrainerKind, TrainerRow] = MappingProxyType({row.kind: row for row in _ROWS})
assert set(TRAINERS) == set(TrainerKind), "every TrainerKind needs a row in fitcheck/core/trainers/registry.py"
CONFIG_CLASSES: Mapping[str, TrainerKind] = MappingProxyType(
    {row.config_class: row.kind for row in _ROWS if row.config_class is not None})

# TRL 1.16 trainers that are no small step from the modelled ones: ``--trainer`` value -> (class, reason).
# ORPO / CPO live in trl.experimental; their concatenated_forward builds the full [2 x rows, seq, vocab] logits and
# runs selective_log_softmax and a cross-entropy NLL over them (trl/experimental/orpo/orpo_trainer.py,
# cpo/cpo_trainer.py), not TRL's fused LM head: a loss path of its own, not measured here.
_FULL_LOGITS = ("has no reference model but computes its loss from full-vocabulary logits of chosen + rejected "
                "(concatenated_forward, selective_log_softmax, an NLL cross-entropy), not from the fused LM head "
                "the modelled TRL trainers use; its step was not measured")
REFUSED: Mapping[str, tuple[str, str]] = MappingProxyType({
    "orpo": ("ORPOTrainer", _FULL_LOGITS),
    "cpo": ("CPOTrainer", _FULL_LOGITS),
})


def trainer_row(kind: TrainerKind) -> TrainerRow:
    """The registry row of ``kind``."""
    return TRAINERS[kind]


def fused_outputs(kind: TrainerKind) -> tuple[str, ...]:
    """The fused-head outputs the trainer's policy model is patched with (``add_fused_lm_head(outputs=...)``).

    Raises:
        KeyError: The trainer's loss does not run through TRL's fused LM head.
    """
    outputs = TRAINERS[kind].fused_head
    if outputs is None:
        raise KeyError(f"{kind.value}: its loss does not run through TRL's fused LM head")
    return outputs


def runs_fused_head(kind: TrainerKind, loss: str = "torch") -> bool:
    """The trainer's loss runs through TRL's chunked LM head (no ``[rows, seq, vocab]`` logits, no head moment).

    ``loss`` is ``--loss``: ``full-logits`` is the subclass that reads the full logits instead (``full_logits``).
    """
    return TRAINERS[kind].fused_head is not None and not (loss == "full-logits" and TRAINERS[kind].full_logits)


def step_runs_fused_head(spec: TrainingSpec) -> bool:
    """:func:`runs_fused_head` for this run: the trainer's row and ``--loss``, and for ``--trainer sft`` the stack's
    TRL release (``SFTTrainer`` < 0.15 runs the plain Trainer's step, 0.15 - 1.6 computes the model's own loss over
    the full logits, ``core/trainers/sft_metrics.py``; 1.7 - 1.14's ``chunked_nll`` is answered as the fused head,
    not modelled), and for ``--trainer dpo`` the release's log-probs (0.19 - 1.13 from the full logits,
    ``core/trainers/dpo_releases.py``, where modelled; else the fused head, not modelled)."""
    t = spec.trainer
    if t.kind is TrainerKind.SFT and sft_loss(trl_release(spec)) in (SftLoss.TRAINER_STEP, SftLoss.FULL_LOGITS):
        return False  # < 0.15: the plain Trainer's step (the readers give TrainerSpec.prepared_by_sft_trainer)
    if t.kind is TrainerKind.DPO and dpo_loss(trl_release(spec)) not in (DpoLoss.FUSED_HEAD, DpoLoss.UNCHECKED) \
            and dpo_release_modelled(spec):
        return False  # 0.19 - 1.13: log-probs from the full fp32 logits (core/trainers/dpo_releases.py)
    return runs_fused_head(t.kind, spec.activations.loss)
