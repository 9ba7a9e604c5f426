"""A bitsandbytes LLM.int8 (8-bit) base for the tracer: real ``Linear8bitLt`` layers on CPU, emulated on fake tensors.

What ``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_8bit=True))`` does to a model
(transformers 5.23): ``integrations/bitsandbytes.py::replace_with_bnb_linear`` makes every convertible linear a
``bnb.nn.Linear8bitLt(has_fp16_weights=llm_int8_has_fp16_weight (False), threshold=llm_int8_threshold (6.0))``,
then ``Bnb8bitQuantize.convert`` wraps each weight as ``Int8Params(value, requires_grad=False, ...).to(device)``,
which quantizes it (bitsandbytes 0.50.2 ``nn/modules.py::Int8Params._quantize``: ``int8_vectorwise_quant`` of
the fp16 weight; ``data = CB`` int8 ``(out, in)``, ``SCB`` fp32 ``(out,)``), and sets
``model.is_loaded_in_8bit = True`` (peft dispatches its ``lora.bnb.Linear8bitLt`` on it).

On the first forward ``Linear8bitLt.init_8bit_state`` moves ``CB``/``SCB`` from the weight into
``self.state`` (``MatmulLtState``); ``bnb.matmul`` (``autograd/_functions.py``) then runs, in training mode,
``MatMul8bitFp`` when the input is on CPU/XPU and ``MatMul8bitLt`` otherwise (CUDA). ``MatMul8bitFp``
dequantizes the weight into a temporary in the input's dtype (``CB.to(A.dtype).mul_(SCB/127)``), runs
``F.linear`` (autocast applies: it is not a ``custom_fwd`` function) and keeps its input as ``ctx.A`` (an
attribute, not ``save_for_backward``: saved-tensor hooks, hence non-reentrant checkpointing, never see it); its
backward dequantizes the weight again for ``grad_A``.

Under ``FakeTensorMode`` an ``Int8Params`` cannot wrap a FakeTensor (``_make_subclass``), so the fake weight is a
plain ``nn.Parameter`` holding an int8 ``(out, in)`` tensor with the attributes ``Int8Params`` carries
(``CB`` = the same tensor, ``SCB`` fp32 ``(out,)``, ``has_fp16_weights=False``): the module class stays
``bnb.nn.Linear8bitLt``, so its forward, ``bnb.matmul``'s dispatch, ``MatMul8bitFp`` and peft's wrapper are the
real code. ``tests/test_tracer_int8.py`` checks fake == real.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from fitcheck.spec import QuantSpec


def bnb_config_8bit(quant: QuantSpec) -> Any:
    """The ``transformers.BitsAndBytesConfig(load_in_8bit=True)`` of a QuantSpec (threshold 6.0, int8 weights)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(  # type: ignore[no-untyped-call]
        load_in_8bit=True, llm_int8_skip_modules=list(quant.skip_modules) or None
    )


def quantize_base_8bit(model: Any, quant: QuantSpec, *, fake: bool, skip: list[str], originals: dict[str, Any]) -> Any:
    """Replace the model's linears by ``bnb.nn.Linear8bitLt`` layers holding its (random) weights as int8.

    Args:
        model: A transformers model built with ``from_config`` in the load dtype.
        quant: The 8-bit settings.
        fake: The model lives in a FakeTensorMode (emulated ``Int8Params``).
        skip: Module names kept unquantized (``tracer_quant.model_modules_to_not_convert``).
        originals: ``name -> (weight, bias)`` of the linears before replacement.

    Returns:
        The same model object, quantized in place.
    """
    import torch
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    bnb_nn: Any = importlib.import_module("bitsandbytes.nn")
    with _outside_fake_mode(fake):  # Linear8bitLt.__init__ wraps its weight in Int8Params
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=bnb_config_8bit(quant))
    for name, module in model.named_modules():
        if not isinstance(module, bnb_nn.Linear8bitLt) or name not in originals:
            continue
        weight, bias = originals[name]
        data = weight.data if getattr(module, "source_cls", None) is torch.nn.Linear else weight.data.T.contiguous()
        module.bias = bias
        if not fake:
            # Int8Params.to(cpu) on an unquantized CPU tensor quantizes it (Int8Params.to -> _quantize)
            module.weight = bnb_nn.Int8Params(data, requires_grad=False, has_fp16_weights=False).to(data.device)
            continue
        out_features = data.shape[0]
        cb = torch.empty(tuple(data.shape), dtype=torch.int8)  # Int8Params._quantize: data = CB, int8 (out, in)
        param = torch.nn.Parameter(cb, requires_grad=False)
        param.CB = cb  # type: ignore[attr-defined]
        param.SCB = torch.empty(out_features, dtype=torch.float32)  # type: ignore[attr-defined]  # per-row absmax
        param.has_fp16_weights = False  # type: ignore[attr-defined]
        module.weight = param
    model.is_loaded_in_8bit = True
    model.requires_grad_(False)
    return model


@contextlib.contextmanager
def _outside_fake_mode(fake: bool) -> Iterator[None]:
    if not fake:
        yield
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        yield


def int8_scales(model: Any) -> Iterator[Any]:
    """The fp32 ``SCB`` row scales of every ``bnb.nn.Linear8bitLt`` (on the weight before the first forward, in
    ``module.state`` after it): model state that is neither a parameter nor a buffer."""
    bnb_nn: Any = importlib.import_module("bitsandbytes.nn")
    for module in model.modules():
        if isinstance(module, bnb_nn.Linear8bitLt):
            scb = getattr(module.weight, "SCB", None)
            if scb is None:
                scb = module.state.SCB
            if scb is not None:
                yield scb
