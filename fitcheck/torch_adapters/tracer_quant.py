"""A bitsandbytes 4-bit base for the tracer: real ``Linear4bit`` layers on CPU, an emulated one on fake tensors.

What ``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True, ...))`` does to a model,
without a checkpoint (transformers 5.23):

1. ``quantizers/quantizer_bnb_4bit.py::_process_model_before_weight_loading``: the modules to keep
   (``quantizers/base.py::get_keys_to_not_convert``: LM head, tied weights, the last module;
   ``llm_int8_skip_modules``; ``_keep_in_fp32_modules``) and ``integrations/bitsandbytes.py::
   replace_with_bnb_linear`` (every ``nn.Linear``/``Conv1D`` becomes ``bnb.nn.Linear4bit``);
2. ``integrations/bitsandbytes.py::Bnb4bitQuantize.convert``: each weight becomes
   ``Params4bit(value, requires_grad=False, **old.__dict__).to(device)``, which quantizes it
   (``bitsandbytes/nn/modules.py::Params4bit._quantize`` -> ``functional.quantize_4bit``);
3. ``_process_model_after_weight_loading``: ``model.is_loaded_in_4bit = True`` (peft dispatches its bnb LoRA
   layers on it).

Then, where the run asks for it (``QuantSpec.prepare_for_kbit_training``: peft recipes and TRL's experimental
ORPO/CPO trainers; trl 1.16's SFTTrainer does not call it, and the readers default it off for TRL), peft's
``prepare_model_for_kbit_training`` runs with the run's checkpointing setting: every 16-bit parameter that is
not a ``Params4bit`` becomes fp32 and, with checkpointing, the input embeddings' output is made to require
grad (``enable_input_require_grads``).

Under ``FakeTensorMode`` a ``Params4bit`` cannot wrap a FakeTensor (``_make_subclass`` refuses a tensor already
bound to a FakeTensor object), so the fake base is a plain ``nn.Parameter`` holding the packed weight from
``functional.quantize_4bit`` run on the fake weight (bitsandbytes registers fake kernels for its ops,
``bitsandbytes/_ops.py``) and carrying the same attributes (``quant_state``, ``quant_type``, ...): the module
class stays ``bnb.nn.Linear4bit``, so its forward, ``MatMul4Bit`` and peft's dispatch are the real code.
``tests/test_tracer_qlora.py`` proves fake == real.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from fitcheck.errors import NotModelledError
from fitcheck.spec import QuantSpec
from fitcheck.torch_adapters.tracer_fake_mode import outside_fake_mode


def bnb_config(quant: QuantSpec) -> Any:
    """The ``transformers.BitsAndBytesConfig`` that describes a QuantSpec."""
    import torch
    from transformers import BitsAndBytesConfig

    def dtype(d: Any) -> Any:
        return None if d is None else getattr(torch, d.value)

    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_4bit=True,
        bnb_4bit_quant_type=quant.quant_type,
        bnb_4bit_use_double_quant=quant.double_quant,
        bnb_4bit_compute_dtype=dtype(quant.compute_dtype),  # None -> float32 (BitsAndBytesConfig.__init__)
        bnb_4bit_quant_storage=dtype(quant.quant_storage),
        llm_int8_skip_modules=list(quant.skip_modules) or None,
    )


def quantize_base(model: Any, quant: QuantSpec, *, fake: bool) -> Any:
    """Replace the model's linears by bitsandbytes 4-bit layers holding its (random) weights, quantized.

    Args:
        model: A transformers model built with ``from_config`` in the load dtype.
        quant: The 4-bit settings.
        fake: The model lives in a FakeTensorMode (emulated ``Params4bit``).

    Returns:
        The same model object, quantized in place.

    Raises:
        NotModelledError: For bits other than 4 and 8.
    """
    if quant.bits not in (4, 8):
        raise NotModelledError(f"tracing a {quant.bits}-bit bitsandbytes base is not implemented")
    import bitsandbytes.functional as bnbf
    import torch
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    bnb_nn: Any = importlib.import_module("bitsandbytes.nn")

    config = bnb_config(quant)
    skip = model_modules_to_not_convert(model, quant)
    originals = {name: (m.weight, m.bias) for name, m in model.named_modules() if _convertible(m)}
    if quant.bits == 8:  # LLM.int8: tracer_int8.py
        from fitcheck.torch_adapters.tracer_int8 import quantize_base_8bit

        return quantize_base_8bit(model, quant, fake=fake, skip=skip, originals=originals)
    # Linear4bit.__init__ wraps a meta weight in Params4bit, which a FakeTensor cannot be: build the layers
    # outside the fake mode (their meta weights and biases are replaced below)
    with outside_fake_mode(fake):
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=config)
    for name, module in model.named_modules():
        if not isinstance(module, bnb_nn.Linear4bit) or name not in originals:
            continue
        weight, bias = originals[name]
        if getattr(module, "source_cls", None) is not torch.nn.Linear:  # Conv1D stores (in, out)
            weight = torch.nn.Parameter(weight.data.T.contiguous(), requires_grad=False)
        module.bias = bias
        if not fake:
            module.weight = bnb_nn.Params4bit(
                weight.data, requires_grad=False, **{**module.weight.__dict__, "blocksize": quant.blocksize}
            ).to(weight.device)
            continue
        packed, state = bnbf.quantize_4bit(
            weight.data,
            blocksize=quant.blocksize,
            compress_statistics=quant.double_quant,
            quant_type=quant.quant_type,
            quant_storage=config.bnb_4bit_quant_storage,
        )
        param = torch.nn.Parameter(packed, requires_grad=False)
        attrs = {**module.weight.__dict__, "quant_state": state, "bnb_quantized": True, "blocksize": quant.blocksize}
        for key, value in attrs.items():
            setattr(param, key, value)
        module.weight = param
        module.quant_state = state
    model.is_loaded_in_4bit = True
    model.requires_grad_(False)
    return model


def model_modules_to_not_convert(model: Any, quant: QuantSpec) -> list[str]:
    """Modules transformers keeps unquantized (``HfQuantizer.get_modules_to_not_convert``)."""
    from transformers.quantizers.base import get_keys_to_not_convert

    keep = list(get_keys_to_not_convert(model)) + list(quant.skip_modules)
    keep += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return sorted(set(keep))


def _convertible(module: Any) -> bool:
    import torch
    from transformers.pytorch_utils import Conv1D

    return type(module) is torch.nn.Linear or isinstance(module, Conv1D)


def prepare_for_kbit_training(model: Any, quant: QuantSpec, checkpointing: bool) -> Any:
    """peft's ``prepare_model_for_kbit_training`` as a recipe that asks for it calls it (non-reentrant checkpointing).

    An emulated 16-bit-storage weight (``bnb_4bit_quant_storage=bfloat16``) is a plain Parameter that peft's
    class-name test would upcast; it is restored to its storage dtype, as a real ``Params4bit`` is left alone.
    """
    if not quant.prepare_for_kbit_training:
        return model
    from peft import prepare_model_for_kbit_training

    packed = {id(p): p.data for p in packed_weights(model)}
    model = prepare_model_for_kbit_training(  # type: ignore[no-untyped-call]
        model, use_gradient_checkpointing=checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    for p in packed_weights(model):
        if p.data.dtype != packed[id(p)].dtype:
            p.data = packed[id(p)]
    return model


def trl_module_casting_to_bf16(model: Any, *, adapters: bool) -> None:
    """TRL's ``peft_module_casting_to_bf16`` (``trl/trainer/utils.py`` v0.13.0 L872-879), parameter by parameter as
    ``nn.Module.to`` casts them (floating ones only: packed 4-bit weights stay): every module with ``norm`` in its
    name (or an ``nn.LayerNorm``) to fp32, else an ``lm_head`` / ``embed_tokens`` / ``wte`` / ``wpe`` module whose
    fp32 ``weight`` to bf16; with ``adapters`` (TRL 0.7.5-0.8.6) every peft ``BaseTunerLayer`` to bf16 first."""
    import torch
    from peft.tuners.tuners_utils import BaseTunerLayer

    def cast(module: Any, dtype: Any) -> None:
        for p in module.parameters():
            if p.dtype.is_floating_point and p.dtype != dtype:
                p.data = p.data.to(dtype)

    for name, module in model.named_modules():
        if adapters and isinstance(module, BaseTunerLayer):
            cast(module, torch.bfloat16)
        elif isinstance(module, torch.nn.LayerNorm) or "norm" in name:
            cast(module, torch.float32)
        elif any(x in name for x in ("lm_head", "embed_tokens", "wte", "wpe")):
            weight = getattr(module, "weight", None)
            if weight is not None and weight.dtype == torch.float32:
                cast(module, torch.bfloat16)


def packed_weights(model: Any) -> Iterator[Any]:
    """The packed weights of every ``bnb.nn.Linear4bit`` (real or emulated)."""
    bnb_nn: Any = importlib.import_module("bitsandbytes.nn")
    for module in model.modules():
        if isinstance(module, bnb_nn.Linear4bit):
            yield module.weight


def quant_state_tensors(model: Any) -> list[Any]:
    """absmax, code tables, nested state and offsets of every 4-bit weight (not parameters nor buffers)."""
    import torch

    out: list[Any] = []
    for weight in packed_weights(model):
        state = getattr(weight, "quant_state", None)
        while state is not None:
            out += [t for t in (state.absmax, state.code, state.offset) if isinstance(t, torch.Tensor)]
            state = state.state2
    from fitcheck.torch_adapters.tracer_int8 import int8_scales

    return out + list(int8_scales(model))  # LLM.int8: the fp32 SCB row scales


@contextlib.contextmanager
def matmul4bit_keeps_input(keep: bool) -> Iterator[None]:
    """Trace bitsandbytes <= 0.43.1's ``MatMul4Bit``, which keeps its input A as a ctx attribute.

    bitsandbytes 0.41.0-0.43.1 ``autograd/_functions.py`` ``MatMul4Bit.forward`` ends ``if
    any(ctx.needs_input_grad[:2]): ctx.tensors = (A, B)``; PR #1270 (released in 0.43.2) made it ``(None, B)``, as
    the installed 0.50.2 has it. Only the kept tensor differs (backward never reads A), so the installed class is
    patched for the block to put A back, and restored after it. Where the installed bitsandbytes is already
    >= 0.43.2 and the older one is named by ``--stack``, this patch is the only way a trace can describe that run
    (``fitcheck.core.activations.bnb_kept_inputs``).

    Args:
        keep: Patch (True) or leave the installed class alone (False).
    """
    if not keep:
        yield
        return
    from bitsandbytes.autograd import _functions as bnb_functions

    cls: Any = bnb_functions.MatMul4Bit
    original = cls.__dict__["forward"]  # the staticmethod object itself, restored as it was
    forward = original.__func__

    def old_forward(ctx: Any, A: Any, B: Any, out: Any = None, bias: Any = None, quant_state: Any = None) -> Any:
        output = forward(ctx, A, B, out, bias, quant_state)
        if not ctx.is_empty and any(ctx.needs_input_grad[:2]):
            ctx.tensors = (A, ctx.tensors[1])  # bitsandbytes 0.43.1 autograd/_functions.py MatMul4Bit.forward
        return output

    cls.forward = staticmethod(old_forward)
    try:
        yield
    finally:
        cls.forward = original
