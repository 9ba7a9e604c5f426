"""Build the real transformers model class from a config.json mapping, for a traced or a real CPU step.

The model is built with ``from_config`` (never ``trust_remote_code``), at a chosen depth, with the user's
attention implementation, dtype, checkpointing, PEFT LoRA wrapping and (emulated) bitsandbytes 4-bit bases.
Under a ``FakeTensorMode`` every parameter is a fake tensor: no memory, no compute.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Mapping
from typing import Any

from fitcheck.errors import ConfigError, UnsupportedModelError
from fitcheck.spec import FreezeSpec, LoraSpec, PeftAdapterSpec, QuantSpec

_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def _layer_holder(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The mapping that declares the decoder's layers: the config itself, or the ``text_config`` of a composite
    vision-language config that declares none at the top (Gemma-3 image-text: transformers 5.23
    ``configuration_gemma3.py`` ``Gemma3Config`` keeps ``num_hidden_layers`` in ``text_config`` only)."""
    if any(key in config for key in _LAYER_KEYS):
        return config
    text = config.get("text_config")
    if isinstance(text, Mapping) and any(key in text for key in _LAYER_KEYS):
        return text
    return config


def config_layers(config: Mapping[str, Any]) -> int:
    """Number of (text) layers a config.json declares (the ``text_config``'s in a composite config without them).

    Raises:
        ConfigError: When none of the usual keys is present.
    """
    holder = _layer_holder(config)
    for key in _LAYER_KEYS:
        value = holder.get(key)
        if isinstance(value, int) and value > 0:
            return value
    raise ConfigError(
        f"config.json: no layer count (looked for {', '.join(_LAYER_KEYS)}, also in text_config); "
        "add num_hidden_layers"
    )


def layer_group(config: Mapping[str, Any]) -> int:
    """Layers in the smallest repeating group of the stack.

    Gemma-2/3 alternate sliding and full attention (``layer_types``), interleaved MoE stacks put an expert
    layer every ``decoder_sparse_step`` / ``moe_layer_freq`` layers: tracing 1 and 2 of these groups and
    extrapolating linearly reproduces the full depth (design note 04).
    """
    n = config_layers(config)
    config = _layer_holder(config)
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        for period in range(1, len(types) + 1):
            if all(types[i] == types[i % period] for i in range(len(types))):
                return period
    for key in ("decoder_sparse_step", "moe_layer_freq"):
        step = config.get(key)
        if isinstance(step, int) and step > 1:
            return step
    if config.get("model_type") in ("gemma2", "gemma3_text") and n > 1:
        return 2  # transformers' default layer_types alternate sliding/full (configuration_gemma2.py)
    return 1


def reduced_config(config: Mapping[str, Any], num_layers: int | None) -> dict[str, Any]:
    """A copy of the config with ``num_layers`` (text) layers (layer_types truncated to match); in a composite
    config whose layers are declared in ``text_config`` only, that ``text_config`` is reduced (the vision
    tower keeps its depth)."""
    out = dict(config)
    if num_layers is None:
        return out
    if _layer_holder(config) is not config:
        out["text_config"] = reduced_config(config["text_config"], num_layers)
        return out
    for key in _LAYER_KEYS:
        if key in out:
            out[key] = num_layers
    if not any(k in out for k in _LAYER_KEYS):
        out["num_hidden_layers"] = num_layers
    types = out.get("layer_types")
    if isinstance(types, list):
        out["layer_types"] = list(types[:num_layers])
    return out


def hf_config(config: Mapping[str, Any], attn_implementation: str) -> Any:
    """A transformers ``PretrainedConfig`` from a config.json mapping (no remote code)."""
    from transformers import AutoConfig

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError("config.json: missing model_type; fitcheck cannot pick the model class without it")
    # a deep copy: transformers 5.23 writes into the rope_scaling dict it is given (modeling_rope_utils.py
    # convert_rope_params_to_dict: rope_parameters.setdefault("rope_theta", ...)), which changed the spec's own config
    # mapping after the first trace, and with it every key that holds the config (trace_cache)
    kwargs = copy.deepcopy({k: v for k, v in config.items() if k not in ("model_type", "transformers_version",
                                                                           "auto_map")})
    try:
        cfg = AutoConfig.for_model(model_type, **kwargs)
    except (KeyError, ValueError) as exc:
        raise UnsupportedModelError(f"transformers has no config class for model_type {model_type!r}: {exc}") from exc
    cfg.use_cache = False
    cfg._attn_implementation = attn_implementation
    return cfg


def model_class(config: Mapping[str, Any], task: str | None = None) -> Any:
    """The transformers class named by ``architectures[0]``, or AutoModelForCausalLM's choice; with a ``task``
    whose class ``architectures[0]`` is not (``--task seq-cls`` on a causal-LM config), that task's class."""
    import transformers

    from fitcheck.readers import task_from_config

    if task is not None and task not in ("causal-lm", "masked-lm") and task_from_config(config) != task:
        from fitcheck.torch_adapters.task_classes import task_class

        return task_class(config, task)
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        cls = getattr(transformers, archs[0], None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM


def build_model(
    config: Mapping[str, Any],
    *,
    dtype: Any,
    attn_implementation: str,
    checkpointing: bool,
    every_n_layers: int = 1,
    lora: LoraSpec | None = None,
    quant: QuantSpec | None = None,
    fake: bool = True,
    task: str | None = None,
    freeze: FreezeSpec | None = None,
    use_reentrant: bool = False,
    adapter: PeftAdapterSpec | None = None,
) -> Any:
    """Build the model as the training run would have it.

    Args:
        config: config.json mapping (already reduced in depth if wanted).
        dtype: torch dtype the model is loaded in.
        attn_implementation: ``eager`` / ``sdpa``.
        checkpointing: Activation checkpointing as the Trainer enables it (non-reentrant).
        every_n_layers: Checkpoint one decoder layer in n.
        lora: PEFT LoRA wrapping.
        adapter: A PEFT method other than LoRA, wrapped by peft's ``get_peft_model`` (``peft_adapters``).
        quant: bitsandbytes 4-bit base (emulated on fake tensors; real bnb on real ones).
        fake: True when called inside a FakeTensorMode.
        task: ``--task`` (None: the class ``architectures`` names).
        freeze: Partial training without PEFT: only the parameters it selects keep ``requires_grad``.
        use_reentrant: ``gradient_checkpointing_kwargs={"use_reentrant": True}`` (with a frozen embedding the
            inputs are made to require a gradient, as TRL's SFTTrainer does: ``enable_input_require_grads``).

    Returns:
        The ``torch.nn.Module`` in train mode.
    """
    from fitcheck.torch_adapters.tracer_patches import (
        bitsandbytes_uncompiled,
        fake_deepcopy,
        fake_trunc_normal,
        module_to_is_noop,
    )

    if fake and (lora is not None or quant is not None or adapter is not None):  # peft imports bitsandbytes
        bitsandbytes_uncompiled()
    cfg = hf_config(config, attn_implementation)
    cls = model_class(config, task)
    # an auto class (a config without ``architectures``, as a model built from its config holds): transformers 5.23
    # ``models/auto/auto_factory.py`` ``_BaseAutoModelClass.from_config`` picks the concrete class and calls its
    # ``_from_config`` with the same arguments
    make = cls._from_config if hasattr(cls, "_from_config") else cls.from_config
    guard = contextlib.ExitStack()
    if fake:
        guard.enter_context(module_to_is_noop())
        guard.enter_context(fake_deepcopy())
        guard.enter_context(fake_trunc_normal())
    with guard:
        try:
            model = make(cfg, dtype=dtype)
        except ValueError as exc:
            if attn_implementation != "sdpa" or "scaled_dot_product_attention" not in str(exc):
                raise
            # transformers has no SDPA path for this class (Gemma-2 soft-capping, BLOOM ALiBi): eager runs
            cfg._attn_implementation = "eager"
            model = make(cfg, dtype=dtype)
        if quant is not None:
            from fitcheck.torch_adapters.tracer_quant import prepare_for_kbit_training, quantize_base

            model = prepare_for_kbit_training(quantize_base(model, quant, fake=fake), quant, checkpointing)
        if lora is not None:
            model = _wrap_lora(model, lora, task)
        if adapter is not None:  # a PEFT method other than LoRA, built by peft itself
            from fitcheck.torch_adapters.peft_build import wrap_adapter

            model = wrap_adapter(model, adapter)
    if freeze is not None:
        from fitcheck.torch_adapters.tracer_freeze import apply_freeze

        apply_freeze(model, freeze)
    if checkpointing:
        # what Trainer.train() calls in transformers 5 (trainer.py: activation_checkpointing_enable)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": use_reentrant}, every_n_layers=every_n_layers
        )
        if use_reentrant and (lora is not None or quant is not None or adapter is not None):
            model.enable_input_require_grads()
    model.train()
    return model


def _wrap_lora(model: Any, lora: LoraSpec, task: str | None = None) -> Any:
    from peft import LoraConfig, get_peft_model

    targets: Any = list(lora.target_modules) or None
    if lora.target_modules == ("all-linear",):
        targets = "all-linear"
    if lora.target_regex:
        targets = lora.target_regex
    cfg = LoraConfig(
        r=lora.r,
        lora_alpha=int(lora.alpha),
        lora_dropout=lora.dropout,
        target_modules=targets,
        modules_to_save=list(lora.modules_to_save) or None,
        use_dora=lora.use_dora,
        use_rslora=lora.use_rslora,
        target_parameters=list(lora.target_parameters) or None,
        layers_to_transform=list(lora.layers_to_transform) if lora.layers_to_transform else None,
        rank_pattern=dict(lora.rank_pattern),
        # peft peft_model.py: SEQ_CLS / TOKEN_CLS add "classifier"/"score" to modules_to_save (readers/task_heads)
        task_type={"seq-cls": "SEQ_CLS", "token-cls": "TOKEN_CLS"}.get(task or ""),
    )
    return get_peft_model(model, cfg)
