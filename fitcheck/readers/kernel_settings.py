"""Memory levers users switch on: ``--loss``, Liger, activation offloading, checkpointing kwargs, torch.compile.

Reads the typed run settings (:class:`~fitcheck.readers.run_settings.RunSettings`) into the
:class:`~fitcheck.spec.ActivationSpec` fields:

* ``use_liger_kernel`` / ``liger_kernel_config`` (transformers 5.23 TrainingArguments): the config is passed as
  keyword arguments to liger's ``apply_liger_kernel_to_<model_type>``; keys it does not take are dropped by
  ``_apply_liger_kernel_to_instance`` without a word, so an unknown key here is refused (a typo would otherwise
  silently keep the kernel on). ``cross_entropy`` and ``fused_linear_cross_entropy`` both true is refused as
  liger's ``assert`` does.
* ``loss``: ``torch`` (``standard`` read as its alias), ``liger-flce``, ``cce``; ``chunked`` names no
  implementation and is refused with the alternatives.
* ``activation_offloading`` (TRL SFTConfig), ``torch_compile`` (TrainingArguments).
* ``gradient_checkpointing_kwargs`` (or ``activation_checkpointing_kwargs``): ``use_reentrant`` (the
  ``every_n_layers`` key is read by ``fitcheck.readers.merge``).
"""

from __future__ import annotations

from typing import Any

from fitcheck.errors import ConfigError
from fitcheck.readers.run_settings import RunSettings
from fitcheck.readers.sources import as_bool, as_mapping
from fitcheck.spec import LOSS_IMPLEMENTATIONS, DeviceType, LigerSpec, LossKind, StackSpec, TrainingSpec

_LIGER_KEYS = ("rope", "rms_norm", "swiglu", "geglu", "fused_linear_cross_entropy", "cross_entropy")
_LOSS_ALIASES = {"standard": "torch"}
_CHUNKED = (
    "'chunked' names no implementation: pass --loss liger-flce (Liger fused linear cross-entropy, also what "
    "--use_liger_kernel applies), --loss cce (Apple's Cut Cross-Entropy) or --loss torch (transformers' "
    "cross-entropy on full logits)"
)


def liger_spec(s: RunSettings) -> LigerSpec | None:
    """The Liger patches ``use_liger_kernel`` + ``liger_kernel_config`` apply, or None when off.

    Raises:
        ConfigError: A non-boolean value, an unknown config key, or both cross-entropy kernels on.
    """
    raw = s.liger_kernel_config
    if not s.use_liger_kernel:
        if raw:
            raise ConfigError(
                f"{s.where('liger_kernel_config')}: set, but use_liger_kernel is off; pass "
                "--use_liger_kernel true (transformers applies the config only then)"
            )
        return None
    at = s.where("liger_kernel_config")
    config = as_mapping(raw, at=at) if raw not in (None, "") else {}
    unknown = sorted(set(config) - set(_LIGER_KEYS))
    if unknown:
        raise ConfigError(f"{at}: unknown key(s) {', '.join(unknown)}; liger_kernel_config takes "
                          + ", ".join(_LIGER_KEYS))
    flags: dict[str, bool] = {k: as_bool(v, at=f"{at} {k}") for k, v in config.items()}
    if "geglu" in flags:  # Gemma's name for the gated-MLP kernel
        flags["swiglu"] = flags.pop("geglu")
    spec = LigerSpec(**flags)
    if spec.cross_entropy and spec.fused_linear_cross_entropy:
        raise ConfigError(
            f"{at}: cross_entropy and fused_linear_cross_entropy cannot both be true (liger asserts); "
            'add "fused_linear_cross_entropy": false to use the unfused kernel'
        )
    return spec


def loss_name(s: RunSettings, liger: LigerSpec | None) -> LossKind:
    """The ``--loss`` implementation; refuses ``chunked``, unknown names and a clash with Liger's FLCE."""
    raw = s.loss
    if raw is None:
        return "torch"
    name = str(raw).strip().lower()
    name = _LOSS_ALIASES.get(name, name)
    at = s.where("loss")
    if name == "chunked":
        raise ConfigError(f"{at}: {_CHUNKED}")
    loss = next((n for n in LOSS_IMPLEMENTATIONS if n == name), None)
    if loss is None:
        raise ConfigError(f"{at}: {raw!r} is not one of {', '.join(LOSS_IMPLEMENTATIONS)}")
    name = loss
    if liger is not None and liger.fused_linear_cross_entropy and name == "cce":
        raise ConfigError(
            f"{at}: cce, but --use_liger_kernel applies Liger's fused linear cross-entropy to the same head; pass "
            '--liger_kernel_config \'{"fused_linear_cross_entropy": false}\' or drop --loss cce'
        )
    return loss


def reentrant_by_default(stack: StackSpec) -> bool:
    """Whether ``gradient_checkpointing=True`` without ``use_reentrant`` runs reentrant checkpointing on ``stack``:
    transformers before 5.0.

    transformers 5.0.0 ``modeling_utils.py`` ``gradient_checkpointing_enable`` (and 5.23's
    ``_activation_checkpointing_enable``) default the kwargs to ``{"use_reentrant": False}``; 4.57.0 defaults them to
    ``{"use_reentrant": True}``; 4.35.0 and 4.36.0 to ``{}``, so torch's ``checkpoint`` gets ``use_reentrant=None``
    and runs reentrant (torch 2.13 ``torch/utils/checkpoint.py`` ``checkpoint``: "use_reentrant = True" after the
    warning; torch 2.1 the same). The Trainer passes ``args.gradient_checkpointing_kwargs`` (None unless given) in
    4.35.0, 4.36.0 and 4.57.0 ``trainer.py``. Before 4.35 the models called ``torch.utils.checkpoint.checkpoint``
    without the argument: reentrant too. Unknown (no transformers version): the modelled 5.23, non-reentrant.
    """
    release = stack.release("transformers")
    return release is not None and release < (5,)


def reentrant_default_applied(s: RunSettings, stack: StackSpec) -> bool:
    """Whether the spec's ``use_reentrant=True`` is the stack's default, not a ``gradient_checkpointing_kwargs`` key."""
    kwargs = s.gradient_checkpointing_kwargs
    given = kwargs is not None and as_mapping(kwargs, at="").get("use_reentrant") is not None
    return not given and reentrant_by_default(stack)


def lever_fields(s: RunSettings, stack: StackSpec | None = None) -> dict[str, Any]:
    """ActivationSpec keyword arguments for every lever (``loss``, ``liger``, offloading, reentrant, compile);
    ``use_reentrant`` not given follows the stack's transformers default (:func:`reentrant_by_default`)."""
    liger = liger_spec(s)
    kwargs = s.gradient_checkpointing_kwargs
    reentrant = stack is not None and reentrant_by_default(stack)
    if kwargs is not None:
        at = s.where("gradient_checkpointing_kwargs")
        mapping = as_mapping(kwargs, at=at)
        if mapping.get("use_reentrant") is not None:
            reentrant = as_bool(mapping["use_reentrant"], at=f"{at} use_reentrant")
        if mapping.get("selective"):  # trl 1.16 sft_trainer.py: selective activation checkpointing (SAC)
            raise ConfigError(f"{at}: selective (TRL selective activation checkpointing) is not modelled; "
                              "remove it to estimate plain checkpointing, or measure with FitcheckCallback")
    name = loss_name(s, liger)
    if s.device_type is DeviceType.CPU and (liger is not None or name != "torch"):
        what = "--use_liger_kernel" if liger is not None else f"--loss {name}"
        raise ConfigError(f"{what}: Liger-Kernel and Cut Cross-Entropy are Triton kernels and need a GPU; "
                          "--device_type cpu cannot run them (drop one of the two)")
    return {
        "loss": name,
        "liger": liger,
        "offload_activations": s.activation_offloading,
        "use_reentrant": reentrant,
        "torch_compile": s.torch_compile,
    }


def refuse_peft_problems(spec: TrainingSpec) -> None:
    """Exit 2 where peft itself raises on the LoRA config (e.g. ``lora_dropout != 0`` on a ``ParamWrapper``).

    peft 0.21.2 tuners/lora/layer.py ``ParamWrapper.update_layer``: ``ValueError("lora.ParamWrapper does not work
    with lora_dropout != 0.")``; ``all-linear`` on a transformers 5 MoE model wraps the fused experts and the
    router that way (``fitcheck.core.states.plan_lora``).

    Raises:
        ConfigError: The message peft's error corresponds to, and the fix.
    """
    if spec.lora is None:
        return
    from fitcheck.core.states import plan_lora

    problems = plan_lora(spec).problems
    if problems:
        message, hint = problems[0]
        raise ConfigError(f"LoRA settings: {message}; {hint}")
