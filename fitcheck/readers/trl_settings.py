"""``--trainer trainer|sft|dpo|grpo|reward|kto`` and TRL 1.16's config fields: typed settings -> ``TrainerSpec``.

The TRL fields are :class:`~fitcheck.readers.run_settings.RunSettings` fields like every other setting (rows of
:data:`fitcheck.readers.settings_table.SETTINGS`, converted there). This module adds two steps on the readers'
floor, both pure:

* :func:`trl_default_layer`: the merge layer of TRL's config defaults for absent settings, each with provenance
  ``"TRL <Config> default"`` (``readers/merge.py`` and ``run_args.spec_from_values`` apply it below the
  explicit values); what each trainer is -- its TRL config class, defaults, fused head, reference rule -- is its
  row in ``fitcheck.core.trainers.registry``.
* :func:`trainer_spec`: the run's ``TrainerSpec`` from the typed settings (``run_args.spec_from_settings``).

``--per_device_eval_batch_size`` (``--eval_accumulation_steps``, ``--prediction_loss_only``) adds the evaluation
phase (every trainer: DPO, GRPO and reward through their own ``prediction_step``,
``fitcheck.core.trainers.evaluation_trl``) when given as a flag (``fitcheck estimate``, a TRL script's own flags
read by ``fitcheck launch``): a TrainingArguments file or object carries ``per_device_eval_batch_size`` (8, its
default) whether or not the script evaluates. An absent
``--prediction_loss_only`` means loss only: ``Trainer.evaluate`` without ``compute_metrics``;
``--prediction_loss_only false`` means a ``compute_metrics`` gathers the logits.

With ``--trainer X`` an absent flag takes X's TRL config default (the registry's ``defaults`` column;
``tests/test_trl_cli.py`` pins it against the installed TRL's config dataclasses). ``--trainer sft`` follows the
stack's TRL release (``--stack trl=`` or the installed one; ``core/states/trl_adapters.py``): that release's
SFTConfig defaults (provenance ``"TRL <release> SFTConfig default"``), and before 0.15 the plain Trainer's step with
SFTTrainer's model preparation (``TrainerSpec.prepared_by_sft_trainer``). Defaults that matter for
memory: ``gradient_checkpointing`` True and ``bf16`` True (``trl/trainer/base_config.py``: ``bf16=None`` becomes
``not fp16``) in every TRL config; ``max_length`` 1024 (SFT, DPO, reward, KTO); GRPO ``num_generations`` 8,
``max_completion_length`` 512, ``beta`` 0.0, ``vllm_gpu_memory_utilization`` 0.3.

Where TRL 1.16 has no config field for a length (DPO's prompt/completion split, GRPO's prompt), the flag
describes the data: every prompt/completion is that long (the worst case).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from fitcheck.core.states import (
    MODELLED_TRL,
    SFT_PADDING_FREE_FROM,
    SftLoss,
    TrlLoadDtype,
    reference_loads_by_name,
    sft_loss,
    trl_config_defaults,
    trl_load_dtype,
    trl_prepares_kbit,
    trl_release,
)
from fitcheck.core.trainers import (
    KTO_DEFAULT_LOSS,
    KTO_LOSS_TYPES,
    REFUSED,
    ReferenceRule,
    TrainerRow,
    calculates_kl,
    has_reference_copy,
    trainer_row,
)
from fitcheck.errors import ConfigError, short_repr
from fitcheck.spec import MODELLED_VERSIONS, Dtype, StackSpec, TrainerKind, TrainerSpec, TrainingSpec, VllmMode
from fitcheck.units import format_bytes

if TYPE_CHECKING:  # run_settings imports the settings table, which imports nothing from here
    from collections.abc import Mapping

    from fitcheck.readers.run_settings import RunSettings

# TRL 1.16 config fields (RunSettings fields; the registry's ``defaults`` column gives their defaults)
_BOOL = ("packing", "padding_free", "precompute_ref_log_probs", "use_vllm")
_VALUE = ("max_prompt_length", "max_completion_length", "rpo_alpha", "num_generations", "beta",
          "generation_batch_size", "steps_per_generation", "vllm_mode", "vllm_gpu_memory_utilization")
# The evaluation phase (fitcheck.core.trainers.evaluation): every trainer (the registry's evaluation column)
_EVAL = ("per_device_eval_batch_size", "eval_accumulation_steps", "prediction_loss_only")
TRL_FLAG_NAMES = ("trainer", *_BOOL, *_VALUE, "loss_type", *_EVAL)
# TrainingArguments settings whose TRL config default differs from the Trainer's
_RUN_DEFAULTS = ("gradient_checkpointing", "bf16")


def trainer_kind(name: object) -> TrainerKind:
    """The ``--trainer`` value as a kind (plain Trainer when None).

    Raises:
        ConfigError: ``orpo`` / ``cpo``: TRL 1.16 keeps them in ``trl.experimental``, where their
            ``concatenated_forward`` builds the full ``[2 x rows, seq, vocab]`` logits and runs
            ``selective_log_softmax`` and a cross-entropy NLL over them (``trl/experimental/orpo/orpo_trainer.py``,
            ``cpo/cpo_trainer.py``), not TRL's fused LM head: a loss path of its own, not measured here.
    """
    text = "trainer" if name is None else str(name)
    if text in REFUSED:
        cls, reason = REFUSED[text]
        raise ConfigError(
            f"--trainer {text}: not modelled. TRL 1.16's {cls} (trl.experimental) {reason}. Estimate it as "
            "--trainer trainer with the doubled batch (--per_device_train_batch_size 2 x yours) for a rough figure")
    return TrainerKind(text)


def trl_default_layer(values: Mapping[str, object]) -> dict[str, tuple[object, str]]:
    """The merge layer of the trainer's TRL config defaults: ``name -> (value, "TRL <Config> default")``.

    Only names absent from ``values`` (canonical names, the layers above) are returned; ``values`` is read,
    never changed.

    Raises:
        ConfigError: ``--trainer orpo|cpo`` (see :func:`trainer_kind`).
    """
    row = trainer_row(trainer_kind(values.get("trainer")))
    if not row.trl:
        return {}
    where = f"TRL {row.config_class} default"
    d = row.defaults
    release = _stack_trl(values)
    if _other_release(release):  # the config's defaults of the stack's release (core/states/trl_adapters.py)
        where = f"TRL {_dotted(release)} {row.config_class} default"
        d = {**d, **trl_config_defaults(row.kind, release)}
    out: dict[str, tuple[object, str]] = {}
    for key in _RUN_DEFAULTS:
        if key not in values and not (key == "bf16" and "fp16" in values):
            out[key] = (d[key], where)
    if "prepare_for_kbit_training" not in values:
        # TRL 1.16's trainers never call peft's prepare_model_for_kbit_training (trl/trainer/sft_trainer.py,
        # dpo_trainer.py, grpo_trainer.py, reward_trainer.py build the PEFT model with get_peft_model only);
        # SFTTrainer 0.7.3-0.25.1 did (core/states/trl_adapters.py), for the stack's trl (--stack, or installed)
        prepares = trl_prepares_kbit(release if row.kind is TrainerKind.SFT else None)
        out["prepare_for_kbit_training"] = (prepares, f"TRL {_dotted(release)} SFTTrainer" if prepares else where)
    if "max_length" in d and "max_seq_length" not in values:
        out["max_seq_length"] = (d["max_length"], where)
    out.update({k: (d[k], where) for k in (*_BOOL, *_VALUE) if k in d and k not in values})
    return out


def trl_name_load(s: RunSettings, stack: StackSpec) -> tuple[TrlLoadDtype, str] | None:
    """What a TRL trainer (``--trainer`` a TRL kind) given the model by name loads it in when no dtype is given:
    ``(FLOAT32, the assumption line)`` (TRL >= 0.27), ``(AUTO, where the "auto" comes from)`` (0.26), or None (the
    plain Trainer, or a release that passes no dtype: ``from_pretrained``'s own default); the release rule is
    ``core/states/trl_adapters.py`` ``trl_load_dtype``."""
    row = trainer_row(trainer_kind(s.trainer))
    if not row.trl:
        return None
    release = stack.release("trl")
    rule = trl_load_dtype(release)
    which = f"TRL {_dotted(release)}" if release is not None else f"TRL {MODELLED_VERSIONS['trl']} (modelled)"
    if rule is TrlLoadDtype.FLOAT32:
        trainer = str(row.config_class).replace("Config", "Trainer")
        ref = " (and its reference model)" if row.reference is not ReferenceRule.NONE else ""
        return rule, (
            f"dtype float32: {which}'s {trainer} given the model by name loads it{ref} in float32 when "
            "model_init_kwargs names no dtype (trl/trainer/utils.py create_model_from_path; TRL's scripts: "
            "ModelConfig.dtype default 'float32'); pass --dtype bfloat16 if your script passes "
            "model_init_kwargs={'dtype': 'bfloat16'} (a TRL script: --dtype bfloat16) or loads the model itself")
    if rule is TrlLoadDtype.AUTO:
        return rule, f"{which} create_model_from_path default"
    return None


def _stack_trl(values: Mapping[str, object]) -> tuple[int, ...] | None:
    """The release of the run's trl: ``--stack trl=`` or the installed one (``readers/versions.py``)."""
    from fitcheck.readers.versions import stack_from_values

    return stack_from_values(values, "--stack").release("trl")


def _other_release(release: tuple[int, ...] | None) -> bool:
    """A known TRL release other than the modelled 1.16 (whose defaults are the registry's)."""
    return release is not None and release[:2] != MODELLED_TRL


def _dotted(release: tuple[int, ...] | None) -> str:
    return ".".join(str(x) for x in release or ())


# Counts a run cannot have zero of (TRL 1.16 GRPOConfig accepts steps_per_generation=0 and then samples nothing;
# num_generations=0 divides by zero in GRPOConfig.__post_init__)
_COUNTS = ("num_generations", "generation_batch_size", "steps_per_generation")
# The loss types TRL 1.16's DPOTrainer computes (trl/trainer/dpo_trainer.py _compute_loss: one branch each; any
# other name raises "Unknown loss type" at the first step; DPOConfig itself accepts any string)
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")


def _nonneg(s: RunSettings, name: str) -> None:
    value = getattr(s, name)
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{s.where(name)}: must be a finite number, got {value!r}")
    if value < 0:
        raise ConfigError(f"{s.where(name)}: must not be negative, got {value!r}")
    if name in _COUNTS and s.given(name) and value < 1:
        raise ConfigError(f"{s.where(name)}: must be at least 1, got {value!r}")


def sequence_length(s: RunSettings) -> int:
    """The sequence length a prompt/completion trainer trains on (``max_seq_length`` otherwise).

    DPO/KTO: ``max_prompt_length`` + ``max_completion_length`` when both are given, truncated to
    ``DPOConfig/KTOConfig.max_length`` (given or 1024). GRPO: ``max_prompt_length`` + ``max_completion_length``
    (given or 512) when the prompt length is given.
    """
    for name in ("max_prompt_length", "max_completion_length"):
        _nonneg(s, name)
    row = trainer_row(trainer_kind(s.trainer))
    if not (row.trl and row.prompt_completion and s.max_prompt_length is not None):
        return s.max_seq_length
    if "max_length" in row.defaults:  # DPO, KTO
        if not s.given("max_completion_length") or s.max_completion_length is None:
            return s.max_seq_length
        return min(s.max_prompt_length + s.max_completion_length, s.max_seq_length)
    completion = row.defaults["max_completion_length"] if s.max_completion_length is None \
        else s.max_completion_length
    return s.max_prompt_length + int(str(completion))  # GRPO


def _flag(s: RunSettings, name: str) -> bool:
    """Given as a flag (``--name``), not by a TrainingArguments file or object."""
    return s.given(name) and s.where(name).startswith("--")


def _eval_fields(s: RunSettings) -> dict[str, object]:
    """TrainerSpec evaluation fields from the flags (none when no evaluation batch size is given as a flag)."""
    if not _flag(s, "per_device_eval_batch_size"):
        if _flag(s, "eval_accumulation_steps") or _flag(s, "prediction_loss_only"):
            raise ConfigError("--eval_accumulation_steps / --prediction_loss_only need --per_device_eval_batch_size "
                              "(the evaluation batch)")
        return {}
    return {
        "eval_batch_size": s.per_device_eval_batch_size,
        "eval_accumulation_steps": s.eval_accumulation_steps if _flag(s, "eval_accumulation_steps") else None,
        # absent: what Trainer.evaluate does without compute_metrics (loss only)
        "prediction_loss_only": s.prediction_loss_only,
    }


def _kbit_note(spec: TrainingSpec, kind: TrainerKind) -> tuple[str, ...]:
    """The assumption about peft's ``prepare_model_for_kbit_training`` for a bitsandbytes base (branch i12place)."""
    quant = spec.quant
    if quant is None or quant.pre_quantized:
        return ()
    if quant.prepare_for_kbit_training:
        note = ("prepare_model_for_kbit_training assumed (peft's QLoRA recipe): non-quantized 16-bit parameters "
                "are fp32; pass --prepare_kbit_training false if the script does not call it")
        if spec.activations.checkpointing:
            return (note,)
        # peft 0.21.2 utils/other.py prepare_model_for_kbit_training: use_gradient_checkpointing=True by default,
        # gradient_checkpointing_kwargs={} passed to transformers 5.23 activation_checkpointing_enable, which keeps
        # {} (its use_reentrant=False default is only for None) -> torch 2.13 checkpoint(use_reentrant=None) = True
        return (note, "peft's prepare_model_for_kbit_training(model) with its defaults also turns on gradient "
                "checkpointing (use_gradient_checkpointing=True; reentrant under transformers 5.23 + torch 2.13), "
                "whatever the Trainer's flag says: this estimate has none; if the script calls it with its "
                "defaults, add --gradient_checkpointing --gradient_checkpointing_kwargs '{\"use_reentrant\": true}'")
    who = "TRL 1.16 never calls it" if kind is not TrainerKind.TRAINER else "as given"
    return (f"no prepare_model_for_kbit_training ({who}): norms, embeddings and LM head stay "
            f"{spec.precision.load_dtype.value}",)


def trainer_spec(s: RunSettings, spec: TrainingSpec) -> tuple[TrainerSpec | None, tuple[str, ...]]:
    """The run's ``TrainerSpec`` from the typed settings (None: the plain Trainer, no evaluation), and notes.

    Raises:
        ConfigError: A TRL field without ``--trainer``, a loss implementation TRL never runs, DPO fields with KTO,
            GRPO without ``--max_prompt_length``, a bad ``--vllm_mode`` or a negative value.
    """
    kind = trainer_kind(s.trainer)
    row = trainer_row(kind)
    if not row.trl:
        extra = sorted(k for k in (*_BOOL, *_VALUE, "loss_type") if _flag(s, k))
        if extra:
            raise ConfigError(f"--{extra[0]} is a TRL config field: add --trainer sft|dpo|grpo|reward|kto")
    evaluation = _eval_fields(s)
    kbit = _kbit_note(spec, kind)
    if spec.activations.loss == "full-logits":
        if row.full_logits is None:
            raise ConfigError(f"--loss full-logits is the log-probs-from-full-fp32-logits variant of --trainer "
                              f"dpo|kto (LLaMA-Factory's CustomDPOTrainer / CustomKTOTrainer); --trainer "
                              f"{kind.value} has no such variant: drop --loss")
        if evaluation.get("eval_batch_size") is not None:
            raise ConfigError("--loss full-logits with --per_device_eval_batch_size: the evaluation step of the "
                              "full-logits variant is not modelled; drop the evaluation flags")
    if not row.trl:
        return (TrainerSpec(**evaluation) if evaluation else None), kbit  # type: ignore[arg-type]
    if row.fused_head is not None and spec.activations.loss not in ("torch", "full-logits"):
        # TRL 1.16 computes these losses with its own chunked LM head (trl/kernels/chunked_logprob.py); a
        # --loss implementation would never run (sft_trainer.py also turns Liger's FLCE off, L1134-1140)
        raise ConfigError(
            f"--loss {spec.activations.loss} with --trainer {kind.value}: TRL 1.16 computes this trainer's loss "
            "with its own chunked LM head, so that loss implementation never runs; drop --loss "
            "(--use_liger_kernel still applies Liger's RMSNorm/SwiGLU/RoPE kernels)"
        )
    for name in ("rpo_alpha", "num_generations", "beta", "generation_batch_size", "steps_per_generation",
                 "vllm_gpu_memory_utilization"):
        _nonneg(s, name)
    notes = [*kbit, _defaults_note(kind, row, trl_release(spec))]
    if kind is TrainerKind.SFT and sft_loss(trl_release(spec)) is SftLoss.TRAINER_STEP:
        return _old_sft_spec(s, spec, notes, evaluation)
    t = _kind_spec(s, spec, row, notes)
    notes.extend(_reference_dtype_note(s, dataclasses.replace(spec, trainer=t)))
    return dataclasses.replace(t, **evaluation), tuple(notes)  # type: ignore[arg-type]


def _reference_dtype_note(s: RunSettings, spec: TrainingSpec) -> tuple[str, ...]:
    """The reference model's dtype where the dtype was given otherwise than by ``model_init_kwargs`` and the release
    loads the reference by name with ``model_init_kwargs`` alone (``reference_loads_by_name``): a policy passed as a
    loaded model then gets a reference in the release's default dtype, not the policy's."""
    release, kind = trl_release(spec), spec.trainer.kind
    if (not s.given("dtype") or "model_init_kwargs" in s.where("dtype") or not has_reference_copy(spec)
            or not reference_loads_by_name(trainer_row(kind).reference_by_name_from, release)):
        return ()
    rule, load = trl_load_dtype(release), spec.precision.load_dtype
    transformers = spec.stack.release("transformers")
    if rule is TrlLoadDtype.FLOAT32 or (rule is TrlLoadDtype.TRANSFORMERS and transformers is not None
                                         and transformers[0] < 5):
        ref: Dtype | None = Dtype.FLOAT32
    else:  # "auto": config.json's dtype
        ref = spec.model.shape.config_dtype
    if ref is None or ref is load:
        return ()
    extra = spec.model.total_params * (ref.nbytes - load.nbytes)
    more = f" ({'+' if extra > 0 else '-'}{format_bytes(abs(extra))} of weights where it is held whole)"
    return (f"--trainer {kind.value} with trl {_dotted(release)}: the reference model is loaded by name with "
            f"model_init_kwargs alone, so if the script passes the policy as a loaded model, the reference is "
            f"{ref.value}{more}, not {load.value} (benchmarks/data/trl_load_dtype.json: TRL 1.4 / 1.6); estimated "
            f"in {load.value}, as when model_init_kwargs={{'dtype': '{load.value}'}} loads both",)


def _defaults_note(kind: TrainerKind, row: TrainerRow, release: tuple[int, ...] | None) -> str:
    """The note naming the TRL config defaults the absent flags took (the stack's release's)."""
    other = _other_release(release)
    d = {**row.defaults, **(trl_config_defaults(kind, release) if other else {})}
    which = f"TRL {_dotted(release)}" if other else "TRL 1.16"
    parts = [f"gradient_checkpointing {str(d['gradient_checkpointing']).lower()}", f"bf16 {str(d['bf16']).lower()}"]
    if "max_length" in d:
        parts.append(f"max_length {d['max_length']}")
    if other and kind is TrainerKind.GRPO:
        parts.append(f"max_completion_length {d['max_completion_length']}")
    return f"--trainer {kind.value}: {which} {row.config_class} defaults for absent flags ({', '.join(parts)})"


def _old_sft_spec(s: RunSettings, spec: TrainingSpec, notes: list[str], evaluation: Mapping[str, object]
                  ) -> tuple[TrainerSpec, tuple[str, ...]]:
    """``--trainer sft`` on TRL < 0.15: ``SFTTrainer`` defines no ``compute_loss``, so the step is the plain Trainer's
    with the release's model preparation (``TrainerSpec.prepared_by_sft_trainer``, ``core/states/trl_adapters.py``).

    Raises:
        ConfigError: ``--padding_free`` (``SFTConfig.padding_free`` first appears at TRL 0.16.0).
    """
    release = _dotted(trl_release(spec))
    if s.padding_free:
        raise ConfigError(f"--padding_free with trl {release}: SFTConfig has no padding_free before TRL "
                          f"{_dotted(SFT_PADDING_FREE_FROM)}; drop the flag or pass --stack trl=<your release>")
    notes.append(f"--trainer sft with trl {release}: SFTTrainer before TRL 0.15 has no compute_loss, so the step is "
                 "the plain Trainer's (the model's own loss over the full logits) with SFTTrainer's model preparation"
                 "; max_length 1024 assumed for SFTTrainer's min(tokenizer.model_max_length, 1024)")
    t = TrainerSpec(prepared_by_sft_trainer=True)
    return dataclasses.replace(t, **evaluation), tuple(notes)  # type: ignore[arg-type]


def _kind_spec(s: RunSettings, spec: TrainingSpec, row: TrainerRow, notes: list[str]) -> TrainerSpec:
    """The trainer-kind fields of the ``TrainerSpec`` (``notes`` gets the line describing the rows)."""
    kind = row.kind
    if kind is TrainerKind.SFT:
        return TrainerSpec(kind=kind, packing=s.packing, padding_free=s.padding_free)
    if kind is TrainerKind.REWARD:
        return TrainerSpec(kind=kind)
    seq = spec.batch.seq_len
    if row.reference is ReferenceRule.IN_STEP:  # DPO, KTO
        prompt = s.max_prompt_length or 0
        given_completion = s.max_completion_length if s.given("max_completion_length") else None
        completion = max(0, seq - prompt) if given_completion is None else given_completion
        total = min(seq, prompt + completion)  # DPOConfig.max_length truncates prompt + completion
        completion = max(0, total - prompt)
        unknown = [x for x in (s.loss_type or ()) if x not in DPO_LOSS_TYPES]
        if kind is TrainerKind.DPO and unknown:
            raise ConfigError(f"--loss_type {short_repr(unknown[0])}: TRL 1.16's DPOTrainer computes "
                              f"{', '.join(DPO_LOSS_TYPES)} (any other raises at the first step)")
        if kind is TrainerKind.KTO and s.rpo_alpha is not None:
            raise ConfigError("--rpo_alpha is a DPO field (KTOConfig has none): drop the flag")
        # the configs' defaults
        loss_type = s.loss_type or (KTO_DEFAULT_LOSS if kind is TrainerKind.KTO else ("sigmoid",))
        if kind is TrainerKind.KTO and (len(loss_type) != 1 or loss_type[0] not in KTO_LOSS_TYPES):
            raise ConfigError(f"--loss_type {short_repr(','.join(loss_type))} with --trainer kto: TRL 1.16's "
                              f"KTOConfig.loss_type is one of {', '.join(KTO_LOSS_TYPES)}")
        t = TrainerSpec(kind=kind, prompt_length=min(prompt, total), completion_length=completion,
                        precompute_ref_log_probs=s.precompute_ref_log_probs, rpo_alpha=s.rpo_alpha,
                        loss_type=loss_type)
        if kind is TrainerKind.KTO:
            kl = ("the KL batch runs no_grad forwards of the same size" if calculates_kl(loss_type)
                  else "apo_zero_unpaired: no KL batch")
            notes.append(f"KTO: every row is {min(prompt, total)} prompt + {completion} completion tokens (one "
                         f"completion per row); {kl}")
        else:
            notes.append(f"DPO: every row is {min(prompt, total)} prompt + {completion} completion tokens; chosen "
                         f"and rejected run concatenated ({2 * spec.batch.micro_batch} rows)")
        return t
    if s.max_prompt_length is None:
        raise ConfigError("--trainer grpo needs --max_prompt_length: the length of every prompt (TRL 1.16's "
                          "GRPOConfig has no field for it)")
    mode = str(s.vllm_mode)
    if mode not in {m.value for m in VllmMode}:
        raise ConfigError(f"--vllm_mode: expected colocate or server, got {mode!r}")
    t = TrainerSpec(
        kind=kind, prompt_length=s.max_prompt_length, completion_length=int(str(s.max_completion_length)),
        num_generations=max(1, int(str(s.num_generations))), beta=float(str(s.beta)),
        generation_batch_size=s.generation_batch_size, steps_per_generation=s.steps_per_generation,
        use_vllm=s.use_vllm, vllm_mode=VllmMode(mode),
        vllm_gpu_memory_utilization=float(str(s.vllm_gpu_memory_utilization)),
    )
    notes.append(f"GRPO: every sequence is {t.prompt_length} prompt + {t.completion_length} completion tokens")
    return t
