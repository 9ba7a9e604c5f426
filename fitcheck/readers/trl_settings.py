"""``--trainer trainer|sft|dpo|grpo|reward|kto`` and TRL 1.16's config fields: read into the run's ``TrainerSpec``.

The readers' floor builds the ``TrainerSpec`` (``fitcheck estimate`` and ``fitcheck launch`` call
:func:`split_trl_values` before the merge and :func:`apply_trainer` after ``spec_from_settings``); what each
trainer is -- its TRL config class, defaults, fused head, reference rule -- is its row in
``fitcheck.core.trainers.registry``.

``--per_device_eval_batch_size`` (``--eval_accumulation_steps``, ``--prediction_loss_only``) adds the evaluation
phase (every trainer: DPO, GRPO and reward through their own ``prediction_step``,
``fitcheck.core.trainers.evaluation_trl``). An absent ``--prediction_loss_only`` means loss only:
``Trainer.evaluate`` without ``compute_metrics``; ``--prediction_loss_only false`` means a ``compute_metrics``
gathers the logits.

With ``--trainer X`` an absent flag takes X's TRL config default. The defaults are a table here (importing TRL
imports torch: seconds per CLI call); ``tests/test_trl_cli.py`` pins the table against the installed TRL's config
dataclasses (``trl.SFTConfig``, ``DPOConfig``, ``GRPOConfig``, ``RewardConfig``). Defaults that matter for memory:
``gradient_checkpointing`` True and ``bf16`` True (``trl/trainer/base_config.py``: ``bf16=None`` becomes
``not fp16``) in every TRL config; ``max_length`` 1024 (SFT, DPO, reward); GRPO ``num_generations`` 8,
``max_completion_length`` 512, ``beta`` 0.0, ``vllm_gpu_memory_utilization`` 0.3.

Where TRL 1.16 has no config field for a length (DPO's prompt/completion split, GRPO's prompt), the flag
describes the data: every prompt/completion is that long (the worst case).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from fitcheck.core.trainers import REFUSED, ReferenceRule, trainer_row
from fitcheck.errors import ConfigError, short_repr
from fitcheck.spec import TrainerKind, TrainerSpec, TrainingSpec, VllmMode

# TRL 1.16 config defaults that change memory: the registry's ``defaults`` column (fitcheck.core.trainers.registry)
_BOOL = ("packing", "padding_free", "precompute_ref_log_probs", "use_vllm")
_VALUE = ("max_prompt_length", "max_completion_length", "rpo_alpha", "num_generations", "beta",
          "generation_batch_size", "steps_per_generation", "vllm_mode", "vllm_gpu_memory_utilization")
# The evaluation phase (fitcheck.core.trainers.evaluation): every trainer (the registry's evaluation column)
_EVAL = ("per_device_eval_batch_size", "eval_accumulation_steps", "prediction_loss_only")
TRL_FLAG_NAMES = ("trainer", *_BOOL, *_VALUE, "loss_type", *_EVAL)
# Counts a run cannot have zero of (TRL 1.16 GRPOConfig accepts steps_per_generation=0 and then samples nothing;
# num_generations=0 divides by zero in GRPOConfig.__post_init__)
_COUNTS = ("num_generations", "generation_batch_size", "steps_per_generation", "per_device_eval_batch_size",
           "eval_accumulation_steps")
# The loss types TRL 1.16's DPOTrainer computes (trl/trainer/dpo_trainer.py _compute_loss: one branch each; any
# other name raises "Unknown loss type" at the first step; DPOConfig itself accepts any string)
DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")


def _bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"--{name}: expected true or false, got {value!r}")


def _num(name: str, value: object, kind: type) -> Any:
    try:
        out = kind(str(value))
    except (ValueError, OverflowError):
        raise ConfigError(
            f"--{name}: expected a{'n integer' if kind is int else ' number'}, got {short_repr(value)}") from None
    if not math.isfinite(out):
        raise ConfigError(f"--{name}: must be a finite number, got {short_repr(value)}")
    if out < 0:
        raise ConfigError(f"--{name}: must not be negative, got {short_repr(value)}")
    if name in _COUNTS and out < 1:
        raise ConfigError(f"--{name}: must be at least 1, got {short_repr(value)}")
    return out


def _eval_fields(trl: Mapping[str, object]) -> dict[str, object]:
    """TrainerSpec evaluation fields from the flags (none when no evaluation batch size is given)."""
    if "per_device_eval_batch_size" not in trl:
        if "eval_accumulation_steps" in trl or "prediction_loss_only" in trl:
            raise ConfigError("--eval_accumulation_steps / --prediction_loss_only need --per_device_eval_batch_size "
                              "(the evaluation batch)")
        return {}
    size = _num("per_device_eval_batch_size", trl["per_device_eval_batch_size"], int)
    steps = trl.get("eval_accumulation_steps")
    if size < 1 or (steps is not None and _num("eval_accumulation_steps", steps, int) < 1):
        raise ConfigError("--per_device_eval_batch_size and --eval_accumulation_steps must be positive")
    return {
        "eval_batch_size": size,
        "eval_accumulation_steps": None if steps is None else _num("eval_accumulation_steps", steps, int),
        # absent: what Trainer.evaluate does without compute_metrics (loss only)
        "prediction_loss_only": _bool("prediction_loss_only", trl.get("prediction_loss_only", True)),
    }


def trainer_kind(values: Mapping[str, object]) -> TrainerKind:
    """The ``--trainer`` value (plain Trainer when absent).

    Raises:
        ConfigError: ``orpo`` / ``cpo``: TRL 1.16 keeps them in ``trl.experimental``, where their
            ``concatenated_forward`` builds the full ``[2 x rows, seq, vocab]`` logits and runs
            ``selective_log_softmax`` and a cross-entropy NLL over them (``trl/experimental/orpo/orpo_trainer.py``,
            ``cpo/cpo_trainer.py``), not TRL's fused LM head: a loss path of its own, not measured here.
    """
    name = str(values.get("trainer", "trainer"))
    if name in REFUSED:
        cls, reason = REFUSED[name]
        raise ConfigError(
            f"--trainer {name}: not modelled. TRL 1.16's {cls} (trl.experimental) {reason}. Estimate it as "
            "--trainer trainer with the doubled batch (--per_device_train_batch_size 2 x yours) for a rough figure")
    return TrainerKind(name)


def split_trl_values(values: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """(the run's other flags with the TRL config defaults filled in, the TRL-only flags).

    Raises:
        ConfigError: An evaluation flag (not modelled), or a TRL flag without ``--trainer``.
    """
    trl = {k: v for k, v in values.items() if k in TRL_FLAG_NAMES}
    rest = {k: v for k, v in values.items() if k not in TRL_FLAG_NAMES}
    kind = trainer_kind(trl)
    row = trainer_row(kind)
    if not row.trl:
        extra = sorted(k for k in trl if k not in ("trainer", *_EVAL))
        if extra:
            raise ConfigError(f"--{extra[0]} is a TRL config field: add --trainer sft|dpo|grpo|reward|kto")
        return rest, trl
    defaults = row.defaults
    for key in ("gradient_checkpointing", "bf16"):
        if key not in rest and not (key == "bf16" and "fp16" in rest):
            rest[key] = defaults[key]
    if "prepare_for_kbit_training" not in rest:
        # TRL 1.16's trainers never call peft's prepare_model_for_kbit_training (trl/trainer/sft_trainer.py,
        # dpo_trainer.py, grpo_trainer.py, reward_trainer.py build the PEFT model with get_peft_model only)
        rest["prepare_for_kbit_training"] = False
    if "max_length" in defaults and "max_seq_length" not in rest:
        rest["max_seq_length"] = defaults["max_length"]
    if row.prompt_completion and "max_length" in defaults and "max_prompt_length" in trl \
            and "max_completion_length" in trl:
        # DPOConfig/KTOConfig.max_length (given or 1024) truncates prompt + completion
        total = _num("max_prompt_length", trl["max_prompt_length"], int) + _num(
            "max_completion_length", trl["max_completion_length"], int)
        rest["max_seq_length"] = min(total, _num("max_length", rest["max_seq_length"], int))
    if row.prompt_completion and "max_length" not in defaults and "max_prompt_length" in trl:  # GRPO
        completion = trl.get("max_completion_length", defaults["max_completion_length"])
        rest["max_seq_length"] = _num("max_prompt_length", trl["max_prompt_length"], int) + _num(
            "max_completion_length", completion, int)
    return rest, trl


def _kbit_note(spec: TrainingSpec, kind: TrainerKind) -> tuple[str, ...]:
    """The assumption about peft's ``prepare_model_for_kbit_training`` for a bitsandbytes base (branch i12place)."""
    quant = spec.quant
    if quant is None or quant.pre_quantized:
        return ()
    if quant.prepare_for_kbit_training:
        return ("prepare_model_for_kbit_training assumed (peft's QLoRA recipe): non-quantized 16-bit parameters "
                "are fp32; pass --prepare_kbit_training false if the script does not call it",)
    who = "TRL 1.16 never calls it" if kind is not TrainerKind.TRAINER else "as given"
    return (f"no prepare_model_for_kbit_training ({who}): norms, embeddings and LM head stay "
            f"{spec.precision.load_dtype.value}",)


def apply_trainer(spec: TrainingSpec, trl: Mapping[str, object]) -> tuple[TrainingSpec, tuple[str, ...]]:
    """The spec with ``spec.trainer`` set from the TRL flags (defaults: the registry's ``defaults`` column)."""
    kind = trainer_kind(trl)
    for name, value in trl.items():  # every number given is read, also those this trainer's memory ignores
        if name in ("beta", "rpo_alpha", "vllm_gpu_memory_utilization"):
            _num(name, value, float)
        elif name in ("max_prompt_length", "max_completion_length", *_COUNTS):
            _num(name, value, int)
    evaluation = _eval_fields(trl)
    kbit = _kbit_note(spec, kind)
    row = trainer_row(kind)
    if not row.trl:
        if not evaluation:
            return spec, kbit
        return dataclasses.replace(spec, trainer=TrainerSpec(**evaluation)), kbit  # type: ignore[arg-type]
    d = row.defaults
    if row.fused_head is not None and spec.activations.loss != "torch":
        # TRL 1.16 computes these losses with its own chunked LM head (trl/kernels/chunked_logprob.py); a
        # --loss implementation would never run (sft_trainer.py also turns Liger's FLCE off, L1134-1140)
        raise ConfigError(
            f"--loss {spec.activations.loss} with --trainer {kind.value}: TRL 1.16 computes this trainer's loss "
            "with its own chunked LM head, so that loss implementation never runs; drop --loss "
            "(--use_liger_kernel still applies Liger's RMSNorm/SwiGLU/RoPE kernels)"
        )

    def get(name: str) -> object:
        return trl.get(name, d.get(name))

    seq = spec.batch.seq_len
    notes = [*kbit, f"--trainer {kind.value}: TRL 1.16 {row.config_class} defaults for absent flags "
             "(gradient_checkpointing true, bf16 true" + (", max_length 1024)" if "max_length" in d else ")")]
    if kind is TrainerKind.SFT:
        t = TrainerSpec(kind=kind, packing=_bool("packing", get("packing")),
                        padding_free=_bool("padding_free", get("padding_free")))
    elif kind is TrainerKind.REWARD:
        t = TrainerSpec(kind=kind)
    elif row.reference is ReferenceRule.IN_STEP:  # DPO, KTO
        prompt = _num("max_prompt_length", trl.get("max_prompt_length", 0), int)
        completion = _num("max_completion_length", trl.get("max_completion_length", max(0, seq - prompt)), int)
        total = min(seq, prompt + completion)  # DPOConfig.max_length truncates prompt + completion
        completion = max(0, total - prompt)
        rpo = trl.get("rpo_alpha")
        raw = trl.get("loss_type") or ("sigmoid",)
        losses = tuple(str(x) for x in raw) if isinstance(raw, (list, tuple)) else (str(raw),)
        unknown = [x for x in losses if x not in DPO_LOSS_TYPES]
        if kind is TrainerKind.DPO and unknown:
            raise ConfigError(f"--loss_type {short_repr(unknown[0])}: TRL 1.16's DPOTrainer computes "
                              f"{', '.join(DPO_LOSS_TYPES)} (any other raises at the first step)")
        if kind is TrainerKind.KTO and (rpo is not None or "loss_type" in trl):
            raise ConfigError("--rpo_alpha / --loss_type are DPO fields; KTO's loss types (kto, apo_zero_unpaired) "
                              "allocate the same step here: drop the flag")
        t = TrainerSpec(kind=kind, prompt_length=min(prompt, total), completion_length=completion,
                        precompute_ref_log_probs=_bool("precompute_ref_log_probs", get("precompute_ref_log_probs")),
                        rpo_alpha=None if rpo is None else _num("rpo_alpha", rpo, float), loss_type=losses)
        if kind is TrainerKind.KTO:
            notes.append(f"KTO: every row is {min(prompt, total)} prompt + {completion} completion tokens (one "
                         "completion per row); the KL batch runs no_grad forwards of the same size")
        else:
            notes.append(f"DPO: every row is {min(prompt, total)} prompt + {completion} completion tokens; chosen "
                         f"and rejected run concatenated ({2 * spec.batch.micro_batch} rows)")
    else:
        if "max_prompt_length" not in trl:
            raise ConfigError("--trainer grpo needs --max_prompt_length: the length of every prompt (TRL 1.16's "
                              "GRPOConfig has no field for it)")
        mode = str(get("vllm_mode"))
        if mode not in {m.value for m in VllmMode}:
            raise ConfigError(f"--vllm_mode: expected colocate or server, got {mode!r}")
        gbs = trl.get("generation_batch_size")
        spg = trl.get("steps_per_generation")
        t = TrainerSpec(
            kind=kind, prompt_length=_num("max_prompt_length", trl["max_prompt_length"], int),
            completion_length=_num("max_completion_length", get("max_completion_length"), int),
            num_generations=_num("num_generations", get("num_generations"), int),
            beta=_num("beta", get("beta"), float),
            generation_batch_size=None if gbs is None else _num("generation_batch_size", gbs, int),
            steps_per_generation=None if spg is None else _num("steps_per_generation", spg, int),
            use_vllm=_bool("use_vllm", get("use_vllm")), vllm_mode=VllmMode(mode),
            vllm_gpu_memory_utilization=_num("vllm_gpu_memory_utilization", get("vllm_gpu_memory_utilization"),
                                             float),
        )
        notes.append(f"GRPO: every sequence is {t.prompt_length} prompt + {t.completion_length} completion tokens")
    t = dataclasses.replace(t, **evaluation)  # type: ignore[arg-type]
    try:
        return dataclasses.replace(spec, trainer=t), tuple(notes)
    except ValueError as exc:  # pragma: no cover - TrainerSpec validation
        raise ConfigError(str(exc)) from None
