"""What TRL's trainers do to a bitsandbytes-quantized PEFT model's parameter dtypes, by TRL release; pure.

The one home of TRL's casts and of the releases they belong to (read from the tags of huggingface/trl):

- **TRL >= 0.26** (and TRL 1.16, the modelled release): ``trl/trainer/sft_trainer.py`` (and the same block in
  ``dpo_trainer.py``, ``grpo_trainer.py``, ``reward_trainer.py``): after ``get_peft_model``, ``if
  _is_quantized_model:`` (``is_loaded_in_4bit`` or ``is_loaded_in_8bit``: bitsandbytes only) every parameter with
  ``requires_grad`` except DoRA's ``lora_magnitude_vector`` gets ``param.data = param.data.to(torch.bfloat16)``, "to
  follow the recommendations from the original paper" (QLoRA). So the adapters (and ``modules_to_save`` copies),
  their gradients and torch AdamW's states (allocated ``zeros_like`` the parameter) are bf16, not peft's fp32; under
  bf16 autocast their casts are no-ops (nothing is cached for backward). The block first appears at v0.26.0
  (``sft_trainer.py``, "Clean up model preparation", #4577); v0.25.1 has none.
- **TRL 0.7.5 - 0.25.1**: ``SFTTrainer.__init__`` (from 0.15 ``_prepare_peft_model``, from 0.22
  ``trl/models/utils.py prepare_peft_model``) calls peft's ``prepare_model_for_kbit_training`` on a 4-bit / 8-bit
  base unless ``is_sharded_qlora`` (a ``Params4bit`` on cpu/meta: FSDP / ZeRO-3 loading), then ``get_peft_model``,
  then ``if args.bf16 and is_loaded_in_4bit [and not is_sharded_qlora]: peft_module_casting_to_bf16(model)``
  (``trl/trainer/utils.py``; v0.13.0 lines 872-879): every module with ``"norm"`` in its name (or an
  ``nn.LayerNorm``) ``.to(torch.float32)``; else every module named with ``lm_head``, ``embed_tokens``, ``wte`` or
  ``wpe`` whose ``weight`` is fp32 ``.to(torch.bfloat16)``. After the k-bit preparation's fp32 upcast that makes the
  embedding and the LM head bf16 again (frozen: no gradient, no state) and leaves the norms fp32. First tag that calls
  it: v0.7.5 (v0.7.4 has no such function); last: v0.25.1 (v0.26.0's ``SFTTrainer`` no longer prepares the model).
  The preparation and the cast share their condition (``not is_sharded_qlora``), so fitcheck applies the cast where
  the run's k-bit preparation is on (``QuantSpec.prepare_for_kbit_training``, which the readers turn off for
  FSDP-QLoRA).
- **TRL 0.7.5 - 0.8.6** also cast every peft ``BaseTunerLayer`` ``.to(torch.bfloat16)`` in that function: the LoRA
  adapters are bf16. Removed by "don't cast the trainable lora layers to half precision" (#1644), first in v0.9.3.
- **TRL 0.7.3 - 0.25.1**'s ``SFTTrainer`` runs the k-bit preparation itself (v0.7.3 is the first tag that calls
  ``prepare_model_for_kbit_training``); TRL >= 0.26 never does (the readers' TRL default,
  ``readers/trl_settings.py``, reads :func:`trl_prepares_kbit`).

- **SFTTrainer's step by release** (``sft_loss``, ``sft_metrics``, ``sft_config_defaults``; read at the tags,
  ``trl/trainer/sft_trainer.py`` / ``sft_config.py`` and the PyPI wheels of trl 1.10-1.16): before v0.15.0 the plain
  Trainer's step; 0.15 - 1.6 the model's own loss over the full logits, then token accuracy (argmax) and, from v0.22,
  entropy over them (``core/trainers/sft_metrics.py`` counts them); 1.7 - 1.14 the default ``loss_type``
  ``chunked_nll`` (``_chunked_cross_entropy_loss``, not modelled); from 1.15.0 the fused LM head
  (``add_fused_lm_head``, ``trl/kernels/chunked_logprob.py``). SFTConfig's defaults: ``bf16`` from 0.19,
  ``gradient_checkpointing`` from 0.22, ``max_length`` 1024 (the readers' ``trl_default_layer`` applies them).

- **DPOTrainer's step by release** (``dpo_loss``; ``trl/trainer/dpo_trainer.py`` at the tags v0.19.0 - v1.9.0 and
  the PyPI wheels of trl 1.10-1.16; ``core/trainers/dpo_releases.py`` counts the bytes): 0.19 - 0.28
  ``concatenated_forward`` (``output_hidden_states=True``, ``selective_log_softmax`` over the fp32 logits of chosen +
  rejected, the reference's after the policy's); 0.29 - 1.5 ``_compute_loss`` over shifted ``.contiguous()`` copies
  of the policy's and the reference's logits, then entropy and token accuracy over the policy's; 1.6 - 1.13 the same
  over views; 1.14 ``_get_per_token_logps_and_entropies`` (not modelled); from 1.15 the fused LM head. Before 0.19
  not modelled.
- **RewardTrainer** (``reward_step_modelled``): from v0.24.0 ``compute_loss`` runs chosen + rejected as one batch
  (``torch.chunk(outputs.logits, 2)``), TRL 1.16's step; before, two forwards per step (chosen, then rejected):
  not modelled.
- **The TRL configs' defaults** (``trl_config_defaults``; ``*_config.py`` at the tags): ``bf16`` None -> ``not fp16``
  from v0.19.0 in SFT / DPO / reward / KTO / GRPO configs, ``gradient_checkpointing`` True from v0.22.0 in all five
  (TrainingArguments' False before), GRPOConfig ``max_completion_length`` 256 before 1.10.0 (512 from it).

- **The dtype a TRL trainer loads a model given by name in** (``trl_load_dtype``), when ``model_init_kwargs`` names
  none: TRL >= 0.27 ``float32`` (``trl/trainer/utils.py`` ``create_model_from_path``: ``dtype =
  kwargs.get("dtype", "float32")``, at every tag v0.27.0 - v1.9.0 and in the 1.10 - 1.16 wheels; every trainer given a
  string calls it, the reference model of DPO / KTO / GRPO too, and ``ModelConfig.dtype``, what TRL's scripts pass,
  defaults to ``"float32"`` from v0.27.0); TRL 0.26 ``"auto"`` (``kwargs.get("dtype", "auto")``; its
  ``ModelConfig.dtype`` is None, so TRL's scripts pass None: transformers' default); before 0.26 no dtype is passed
  unless given (``sft_trainer.py`` / ``dpo_trainer.py`` / ``grpo_trainer.py`` / ``kto_trainer.py`` /
  ``reward_trainer.py``: ``model_init_kwargs.get("torch_dtype")`` / ``get("dtype")`` kept None), so
  ``from_pretrained``'s own default: float32 on transformers 4.x, ``"auto"`` on 5.x. The reference model of GRPO
  (0.19 - 1.15), DPO (0.29 - 1.15) and KTO (1.2 - 1.15) is loaded by name with the policy's ``model_init_kwargs``, so a
  policy passed as a loaded 16-bit model gets a reference in that release's default dtype
  (``reference_loads_by_name``; ``benchmarks/data/trl_load_dtype.json``: float32 at TRL 1.4 / 1.6); 1.16 gives the
  reference the policy's dtype.

Which run is TRL's: a TRL trainer kind (``--trainer sft``), or a run whose model ``SFTTrainer`` prepared while the
plain Trainer's step runs (``TrainerSpec.prepared_by_sft_trainer``: TRL < 0.15's ``SFTTrainer`` defines no
``compute_loss``, so its step is ``Trainer.compute_loss``; git grep at the tags). The TRL release is the stack's
(``--stack trl=`` or the installed one); an unknown release is the modelled 1.16.
"""

from __future__ import annotations

from enum import Enum

from fitcheck.spec import (
    MODELLED_VERSIONS,
    Dtype,
    Kind,
    MixedPrecision,
    ParamEntry,
    Strategy,
    TrainerKind,
    TrainingSpec,
)

# first and last TRL releases whose SFTTrainer calls peft_module_casting_to_bf16 (tags v0.7.5 .. v0.25.1)
MODULE_CAST_RELEASES = ((0, 7, 5), (0, 25, 1))
# releases before this one also cast the LoRA layers (BaseTunerLayer) to bf16 (#1644, first in v0.9.3)
ADAPTER_CAST_BEFORE = (0, 9, 3)
# first TRL release whose trainers cast a quantized model's trainables to bf16 and no longer prepare it (v0.26.0)
TRAINABLES_BF16_FROM = (0, 26)
# first TRL release whose SFTTrainer calls prepare_model_for_kbit_training (v0.7.3)
KBIT_PREP_FROM = (0, 7, 3)
# first TRL release whose SFTTrainer overrides compute_loss (v0.15.0; earlier ones run Trainer.compute_loss)
SFT_COMPUTE_LOSS_FROM = (0, 15)
# SFTTrainer's loss and metrics by release (git show <tag>:trl/trainer/sft_trainer.py compute_loss, sft_config.py;
# the wheels of trl 1.10-1.16 from PyPI): the default loss_type becomes "chunked_nll" (_chunked_cross_entropy_loss)
# at v1.7.0 and TRL's fused LM head (add_fused_lm_head, trl/kernels/chunked_logprob.py) at 1.15.0
SFT_CHUNKED_NLL_FROM = (1, 7)
SFT_FUSED_HEAD_FROM = (1, 15)
# SFTConfig defaults (sft_config.py at the tags): bf16 None -> ``not fp16`` from v0.19.0 (TrainingArguments' False
# before); gradient_checkpointing True from v0.22.0 (False before); max_length 1024 (max_seq_length 1024 in v0.15,
# None -> min(tokenizer.model_max_length, 1024) in SFTTrainer before: 1024 assumed)
SFT_BF16_DEFAULT_FROM = (0, 19)
SFT_CHECKPOINTING_DEFAULT_FROM = (0, 22)
SFT_MAX_LENGTH_DEFAULT = 1024
# DPOTrainer's loss by release (git show <tag>:trl/trainer/dpo_trainer.py; the wheels of trl 1.10-1.16): the first
# release of concatenated_forward with output_hidden_states=True (v0.19.0; selective_log_softmax from v0.15.0), of
# _compute_loss over the shifted .contiguous() copies (v0.29.0), of the shifted views (v1.6.0), of
# _get_per_token_logps_and_entropies (the 1.14.0 wheel) and of the fused LM head (1.15.0, SFT_FUSED_HEAD_FROM)
DPO_CONCATENATED_FROM = (0, 19)
DPO_COMPUTE_LOSS_FROM = (0, 29)
DPO_SHIFTED_VIEWS_FROM = (1, 6)
DPO_PER_TOKEN_HELPER_FROM = (1, 14)
# RewardTrainer.compute_loss: one forward of chosen + rejected from v0.24.0 (two forwards before; reward_trainer.py)
REWARD_CONCATENATED_FROM = (0, 24)
# GRPOConfig.max_completion_length: 256 before 1.10.0, 512 from it (grpo_config.py at v1.9.0, the 1.10.0 wheel)
GRPO_COMPLETION_512_FROM = (1, 10)
# SFTConfig.padding_free first appears at v0.16.0
SFT_PADDING_FREE_FROM = (0, 16)
# create_model_from_path's dtype default (trl/trainer/utils.py): "auto" from v0.26.0, "float32" from v0.27.0 (also
# ModelConfig.dtype's default from v0.27.0); before v0.26.0 the trainers pass no dtype (module docstring)
TRL_AUTO_LOAD_FROM = (0, 26)
TRL_FLOAT32_LOAD_FROM = (0, 27)
# the first release whose trainer builds its reference model by name with the policy's model_init_kwargs (not a copy
# of the policy object) is the registry's ``reference_by_name_from`` column; from the 1.16 wheel
# ``ref_model_init_kwargs.setdefault("dtype", self.model.dtype)`` gives it the policy's dtype
REFERENCE_POLICY_DTYPE_FROM = (1, 16)
# the TRL release the rules of TRL 1.16 describe (spec/trainer.py MODELLED_VERSIONS): (major, minor)
MODELLED_TRL = tuple(int(x) for x in MODELLED_VERSIONS["trl"].split(".")[:2])
# trl/trainer/utils.py entropy_from_logits(chunk_size=128), v0.23.0 - v1.13.0 (SFT's metrics, DPO's from v0.29.0)
ENTROPY_CHUNK_TOKENS = 128
# peft_module_casting_to_bf16's name patterns (trl/trainer/utils.py v0.13.0 L876)
_HEAD_NAMES = ("lm_head", "embed_tokens", "wte", "wpe")


def trl_release(spec: TrainingSpec) -> tuple[int, ...] | None:
    """``(major, minor, patch)`` of the stack's TRL, or None (the modelled 1.16 is assumed)."""
    return spec.stack.release("trl")


def _padded(release: tuple[int, ...]) -> tuple[int, ...]:
    return (*release, 0, 0, 0)[:3]


def _trl_prepared(spec: TrainingSpec) -> bool:
    """The model went through TRL's SFTTrainer preparation: ``--trainer sft``, or ``prepared_by_sft_trainer``."""
    return spec.trainer.kind is TrainerKind.SFT or spec.trainer.prepared_by_sft_trainer


def trl_prepares_kbit(release: tuple[int, ...] | None) -> bool:
    """Whether that TRL release's SFTTrainer runs peft's ``prepare_model_for_kbit_training`` (0.7.3 - 0.25.x)."""
    return release is not None and _padded(release) >= KBIT_PREP_FROM and release[:2] < TRAINABLES_BF16_FROM


def sft_runs_trainer_step(release: tuple[int, ...] | None) -> bool:
    """Whether that TRL release's SFTTrainer runs the plain Trainer's step (no ``compute_loss`` before v0.15.0): a run
    of it is the Trainer's with ``TrainerSpec.prepared_by_sft_trainer``."""
    return sft_loss(release) is SftLoss.TRAINER_STEP


def trl_module_cast(spec: TrainingSpec) -> bool:
    """Whether ``peft_module_casting_to_bf16`` runs on this model (TRL 0.7.5 - 0.25.1's SFTTrainer, ``bf16=True``, a
    bitsandbytes 4-bit base with LoRA, prepared for k-bit training: module docstring)."""
    release = trl_release(spec)
    quant = spec.quant
    if release is None or not _trl_prepared(spec) or quant is None or spec.lora is None:
        return False
    lo, hi = MODULE_CAST_RELEASES
    return (
        lo <= _padded(release) <= hi
        and spec.precision.mixed_precision is MixedPrecision.BF16
        and quant.method == "bitsandbytes"
        and quant.bits == 4
        and quant.prepare_for_kbit_training
    )


def trl_module_cast_dtype(spec: TrainingSpec, entry: ParamEntry, dtype: Dtype) -> Dtype:
    """The dtype of an unquantized base parameter after ``peft_module_casting_to_bf16`` (``dtype`` where it does not
    run): norms fp32, an fp32 embedding / LM head bf16 (module docstring)."""
    if not trl_module_cast(spec):
        return dtype
    module = entry.name.rsplit(".", 1)[0]
    if "norm" in module or entry.kind is Kind.NORM:
        return Dtype.FLOAT32
    if dtype is Dtype.FLOAT32 and entry.name.endswith("weight") and any(n in module for n in _HEAD_NAMES):
        return Dtype.BFLOAT16
    return dtype


def trl_bf16_trainables(spec: TrainingSpec) -> bool:
    """Whether TRL casts the trainable parameters of this (bitsandbytes-quantized, PEFT) run to bf16: TRL >= 0.26's
    trainers (and an unknown release: the modelled 1.16), or TRL 0.7.5 - 0.8.6's SFTTrainer casting its LoRA layers
    (module docstring). The release gate is SFTTrainer's; the other trainers keep TRL 1.16's rule at every release
    (their own histories differ: DPOTrainer's block first appears at v0.29.0) and get the versions warning."""
    quant = spec.quant
    release = trl_release(spec)
    if _trl_prepared(spec) and release is not None and release[:2] < TRAINABLES_BF16_FROM:
        return trl_module_cast(spec) and _padded(release) < ADAPTER_CAST_BEFORE
    return (
        spec.trainer.kind is not TrainerKind.TRAINER
        and quant is not None
        and quant.method == "bitsandbytes"
        and not quant.pre_quantized
        and spec.lora is not None
    )


class SftLoss(str, Enum):
    """What a TRL release's ``SFTTrainer`` step computes its loss from (module constants, read at the tags)."""

    TRAINER_STEP = "trainer_step"  # < 0.15: no compute_loss, the plain Trainer's step
    FULL_LOGITS = "full_logits"  # 0.15 - 1.6: the model's own loss + metrics over the full logits
    CHUNKED_NLL = "chunked_nll"  # 1.7 - 1.14: _chunked_cross_entropy_loss (256-token checkpointed chunks)
    FUSED_HEAD = "fused_head"  # >= 1.15 (and an unknown release: the modelled 1.16): add_fused_lm_head


def sft_loss(release: tuple[int, ...] | None) -> SftLoss:
    """How that TRL release's ``SFTTrainer`` computes its loss with its default ``loss_type`` (None: TRL 1.16)."""
    if release is None or release[:2] >= SFT_FUSED_HEAD_FROM:
        return SftLoss.FUSED_HEAD
    if release[:2] < SFT_COMPUTE_LOSS_FROM:
        return SftLoss.TRAINER_STEP
    return SftLoss.CHUNKED_NLL if release[:2] >= SFT_CHUNKED_NLL_FROM else SftLoss.FULL_LOGITS


class SftMetrics(str, Enum):
    """The vocabulary-sized temporaries ``SFTTrainer.compute_loss`` of a full-logits release (0.15 - 1.6) makes
    for its logged metrics, after the model's forward returned ``outputs.logits``."""

    GATHERED_COPY = "gathered_copy"  # 0.15: logits[..., :-1, :].contiguous(), gather_for_metrics of that copy
    COPY = "copy"  # 0.16 - 0.21: the contiguous shifted copy, its argmax (token accuracy)
    ROW_ENTROPY_THEN_COPY = "row_entropy_then_copy"  # 0.22: entropy_from_logits(chunk_size=1 row), then the copy
    CHUNK_ENTROPY_THEN_COPY = "chunk_entropy_then_copy"  # 0.23 - 1.2: entropy in 128-token chunks, then the copy
    COPY_ENTROPY_THEN_COPY = "copy_entropy_then_copy"  # 1.3 - 1.5: entropy of its own copy; accuracy's copy
    VIEW_ENTROPY = "view_entropy"  # 1.6: one shifted view for both (reshape copies it when rows > 1)


# the first release of each layout (compute_loss at the tags v0.15.0 .. v1.6.0; utils.py entropy_from_logits:
# chunk_size=1 over dim 0 at v0.22.0, 128 tokens of the flattened logits from v0.23.0)
_METRICS_FROM = (
    ((1, 6), SftMetrics.VIEW_ENTROPY),
    ((1, 3), SftMetrics.COPY_ENTROPY_THEN_COPY),
    ((0, 23), SftMetrics.CHUNK_ENTROPY_THEN_COPY),
    ((0, 22), SftMetrics.ROW_ENTROPY_THEN_COPY),
    ((0, 16), SftMetrics.COPY),
    ((0, 15), SftMetrics.GATHERED_COPY),
)


def sft_metrics(release: tuple[int, ...] | None) -> SftMetrics | None:
    """The metrics layout of that release's ``SFTTrainer.compute_loss`` (None outside the full-logits releases)."""
    if release is None or sft_loss(release) is not SftLoss.FULL_LOGITS:
        return None
    return next(layout for first, layout in _METRICS_FROM if release[:2] >= first)


def trl_config_defaults(kind: TrainerKind, release: tuple[int, ...] | None) -> dict[str, object]:
    """The defaults of ``kind``'s TRL config that change memory and differ by release (None: TRL 1.16's): ``bf16``
    and ``gradient_checkpointing`` in every config, SFT's ``max_length``, GRPO's ``max_completion_length``."""
    minor = MODELLED_TRL if release is None else release[:2]
    out: dict[str, object] = {
        "gradient_checkpointing": minor >= SFT_CHECKPOINTING_DEFAULT_FROM,
        "bf16": minor >= SFT_BF16_DEFAULT_FROM,
    }
    if kind is TrainerKind.SFT:
        out["max_length"] = SFT_MAX_LENGTH_DEFAULT
    if kind is TrainerKind.GRPO:
        out["max_completion_length"] = 512 if minor >= GRPO_COMPLETION_512_FROM else 256
    return out


def sft_config_defaults(release: tuple[int, ...] | None) -> dict[str, object]:
    """``SFTConfig``'s defaults that change memory at that release (None: TRL 1.16's)."""
    return trl_config_defaults(TrainerKind.SFT, release)


class DpoLoss(str, Enum):
    """How a TRL release's ``DPOTrainer`` computes its log-probs (module constants, read at the tags)."""

    UNCHECKED = "unchecked"  # < 0.19 and 1.14: not modelled
    CONCATENATED_FORWARD = "concatenated_forward"  # 0.19 - 0.28: output_hidden_states, fp32 logits per row
    SHIFTED_COPIES = "shifted_copies"  # 0.29 - 1.5: _compute_loss over logits[..., :-1, :].contiguous()
    SHIFTED_VIEWS = "shifted_views"  # 1.6 - 1.13: the same over views
    FUSED_HEAD = "fused_head"  # >= 1.15 (and an unknown release: the modelled 1.16)


def dpo_loss(release: tuple[int, ...] | None) -> DpoLoss:
    """How that TRL release's ``DPOTrainer`` computes its log-probs (None: TRL 1.16)."""
    if release is None or release[:2] >= SFT_FUSED_HEAD_FROM:
        return DpoLoss.FUSED_HEAD
    minor = release[:2]
    if minor < DPO_CONCATENATED_FROM or minor >= DPO_PER_TOKEN_HELPER_FROM:
        return DpoLoss.UNCHECKED
    if minor < DPO_COMPUTE_LOSS_FROM:
        return DpoLoss.CONCATENATED_FORWARD
    return DpoLoss.SHIFTED_VIEWS if minor >= DPO_SHIFTED_VIEWS_FROM else DpoLoss.SHIFTED_COPIES


def dpo_release_modelled(spec: TrainingSpec) -> bool:
    """Whether this DPO run's step is modelled at the stack's TRL release: the fused head (>= 1.15), or a full-logits
    release (0.19 - 1.13 but 1.14's helper) under accelerate's mixed precision (the layout checked: its fp32 outputs;
    DeepSpeed's engine runs a 16-bit module instead), over an unquantized base, with the default losses (no
    ``rpo_alpha`` / ``sft`` NLL over the chosen logits) and torch's loss."""
    loss = dpo_loss(trl_release(spec))
    if loss is DpoLoss.FUSED_HEAD:
        return True
    t = spec.trainer
    return (
        loss is not DpoLoss.UNCHECKED
        and spec.precision.mixed_precision is not MixedPrecision.NO
        and spec.sharding.strategy is not Strategy.DEEPSPEED  # the engine's bf16 module: no fp32 outputs
        and spec.quant is None
        and t.rpo_alpha is None
        and "sft" not in t.loss_type
        and spec.activations.loss == "torch"
    )


def reward_step_modelled(release: tuple[int, ...] | None) -> bool:
    """Whether that release's ``RewardTrainer`` runs TRL 1.16's step (one forward of chosen + rejected, >= 0.24)."""
    return release is None or release[:2] >= REWARD_CONCATENATED_FROM


def trl_release_modelled(spec: TrainingSpec) -> bool:
    """Whether what the run takes from the stack's TRL is modelled at that release: nothing (the plain Trainer's
    step; a model TRL < 0.15's ``SFTTrainer`` prepared is modelled by release above), ``SFTTrainer`` at a release
    whose step is modelled (:func:`sft_loss`; 1.7 - 1.14's ``chunked_nll`` is not), ``DPOTrainer`` where
    :func:`dpo_release_modelled`, ``RewardTrainer`` from 0.24. KTO and GRPO follow TRL 1.16 at every release
    (``versions-not-modelled`` says so for another)."""
    kind = spec.trainer.kind
    release = trl_release(spec)
    if kind is TrainerKind.TRAINER:
        return True
    if kind is TrainerKind.DPO:
        return dpo_release_modelled(spec)
    if kind is TrainerKind.REWARD:
        return reward_step_modelled(release)
    return kind is TrainerKind.SFT and sft_loss(release) is not SftLoss.CHUNKED_NLL


class TrlLoadDtype(str, Enum):
    """What a TRL release's trainers pass as ``from_pretrained``'s dtype for a model given by name, when
    ``model_init_kwargs`` names none (module docstring)."""

    TRANSFORMERS = "transformers"  # < 0.26: nothing: from_pretrained's default (float32 on 4.x, "auto" on 5.x)
    AUTO = "auto"  # 0.26: create_model_from_path's kwargs.get("dtype", "auto")
    FLOAT32 = "float32"  # >= 0.27 (and an unknown release: the modelled 1.16): kwargs.get("dtype", "float32")


def trl_load_dtype(release: tuple[int, ...] | None) -> TrlLoadDtype:
    """The dtype that TRL release's trainers load a model given by name in, by default (None: TRL 1.16)."""
    if release is None or release[:2] >= TRL_FLOAT32_LOAD_FROM:
        return TrlLoadDtype.FLOAT32
    return TrlLoadDtype.AUTO if release[:2] >= TRL_AUTO_LOAD_FROM else TrlLoadDtype.TRANSFORMERS


def reference_loads_by_name(first: tuple[int, int] | None, release: tuple[int, ...] | None) -> bool:
    """Whether a trainer whose reference is built by name from release ``first`` on (the registry's
    ``reference_by_name_from``: GRPO 0.19, DPO 0.29, KTO 1.2; None: no reference) loads it, at ``release``, with
    ``model_init_kwargs`` alone, not the policy's dtype: up to 1.15 (None: TRL 1.16, which does not)."""
    return first is not None and release is not None and first <= release[:2] < REFERENCE_POLICY_DTYPE_FROM
