"""Who runs the step and with which libraries: the trainer (the plain ``transformers.Trainer`` or one of TRL's, with
its memory-relevant config fields) and the library versions of the environment (:class:`StackSpec`, against the
:data:`MODELLED_VERSIONS` the formulas were read from).

Part of :mod:`fitcheck.spec` (import from there); :class:`~fitcheck.spec.training.TrainingSpec` holds both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

# The library versions the estimate's formulas were read from (installed source, traces); the version-aware
# differences for older transformers are in fitcheck.core.activations.versions.
MODELLED_VERSIONS: Mapping[str, str] = {
    "torch": "2.13",
    "transformers": "5.23",
    "peft": "0.21",
    "trl": "1.16",
    "bitsandbytes": "0.50",
    "accelerate": "1.15",
    "deepspeed": "0.19",
}


@dataclass(frozen=True)
class StackSpec:
    """The library versions of the environment the estimate is for.

    Attributes:
        versions: Package name -> version string (``"4.46"``, ``"5.23.0"``); a package absent here is not
            installed (or not given).
        source: ``"installed"`` (read with importlib.metadata), ``"--stack"`` (given), or ``""`` (unknown: the
            modelled versions are assumed).
    """

    versions: tuple[tuple[str, str], ...] = ()
    source: str = ""

    def get(self, name: str) -> str | None:
        """The version of ``name``, or None."""
        return dict(self.versions).get(name)

    def release(self, name: str) -> tuple[int, ...] | None:
        """``(major, minor, ...)`` of ``name``'s version (leading numeric parts), or None when unknown."""
        version = self.get(name)
        if version is None:
            return None
        parts: list[int] = []
        for piece in version.split("."):
            digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
            if not digits:
                break
            parts.append(int(digits))
            if not piece.isdigit():
                break
        return tuple(parts) or None


class TrainerKind(str, Enum):
    """Which trainer runs the step: the plain ``transformers.Trainer`` or one of TRL's."""

    TRAINER = "trainer"
    SFT = "sft"
    DPO = "dpo"
    GRPO = "grpo"
    REWARD = "reward"
    KTO = "kto"  # issue 13 (branch i13trl): unpaired completions, reference model, KL pass


class VllmMode(str, Enum):
    """Where GRPO's vLLM engine runs (``GRPOConfig.vllm_mode``)."""

    COLOCATE = "colocate"
    SERVER = "server"


@dataclass(frozen=True)
class TrainerSpec:
    """The trainer and its memory-relevant TRL config fields (TRL 1.16 names; ``fitcheck.core.trainers``).

    The default is the plain ``transformers.Trainer`` (no TRL): nothing below applies.

    Attributes:
        kind: Which trainer.
        packing: SFT ``packing`` (rows packed to ``max_length``).
        padding_free: SFT ``padding_free`` (the micro-batch flattened into one row).
        prompt_length: DPO/GRPO: tokens of every prompt (the worst case; TRL 1.16 has no config field for it).
        completion_length: DPO: tokens of every chosen/rejected completion; GRPO: ``max_completion_length``.
        precompute_ref_log_probs: DPO: reference log-probs computed before training (no reference in the step).
        rpo_alpha: DPO: weight of the added NLL term (TRL 1.16: ``loss_type=[..., "sft"]``), None = none.
        loss_type: DPO ``loss_type`` names; KTO: ``("kto",)`` or ``("apo_zero_unpaired",)`` (no KL batch).
        num_generations: GRPO completions per prompt.
        beta: GRPO KL coefficient (> 0 keeps a reference model).
        generation_batch_size: GRPO ``generation_batch_size``: sequences generated per generation over ALL
            processes (per device: divided by the process count); None = micro-batch x ``steps_per_generation``.
        steps_per_generation: GRPO (None = ``gradient_accumulation_steps``).
        use_vllm: GRPO generates with vLLM.
        vllm_mode: ``colocate`` (same GPU) or ``server`` (other GPUs).
        vllm_gpu_memory_utilization: Fraction of the GPU vLLM takes in colocate mode.
        eval_batch_size: ``per_device_eval_batch_size`` (None = no evaluation phase is estimated).
        eval_accumulation_steps: Evaluation steps whose logits stay on the device before moving to the CPU
            (None = the whole evaluation set).
        prediction_loss_only: Evaluation keeps only the loss (True: what ``Trainer.evaluate`` does without
            ``compute_metrics``); False: the logits of every step are gathered on the device.
        save_only_model: TrainingArguments ``save_only_model``: checkpoints leave the optimizer and scheduler out
            (transformers 5.23 ``Trainer._save_checkpoint``; ``core/saving``).
        prepared_by_sft_trainer: With ``kind`` TRAINER: the model was prepared by TRL's ``SFTTrainer`` of the stack's
            trl release while the plain Trainer's step runs (TRL < 0.15's ``SFTTrainer`` defines no
            ``compute_loss``): that release's casts apply (``core/states/trl_adapters.py``).
    """

    kind: TrainerKind = TrainerKind.TRAINER
    packing: bool = False
    padding_free: bool = False
    prompt_length: int = 0
    completion_length: int = 0
    precompute_ref_log_probs: bool = False
    rpo_alpha: float | None = None
    loss_type: tuple[str, ...] = ("sigmoid",)
    num_generations: int = 8
    beta: float = 0.0
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    use_vllm: bool = False
    vllm_mode: VllmMode = VllmMode.COLOCATE
    vllm_gpu_memory_utilization: float = 0.3
    eval_batch_size: int | None = None
    eval_accumulation_steps: int | None = None
    prediction_loss_only: bool = True
    save_only_model: bool = False
    prepared_by_sft_trainer: bool = False

    def __post_init__(self) -> None:
        for name in ("prompt_length", "completion_length"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.num_generations < 1:
            raise ValueError(f"num_generations must be positive, got {self.num_generations}")
        if not 0.0 < self.vllm_gpu_memory_utilization <= 1.0:
            raise ValueError("vllm_gpu_memory_utilization must be in (0, 1]")
        for name in ("eval_batch_size", "eval_accumulation_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")

    @property
    def is_trl(self) -> bool:
        """A TRL trainer (not the plain Trainer)."""
        return self.kind is not TrainerKind.TRAINER
