"""DeepSpeed fp16/bf16 and FSDP mixed precision compute with 16-bit parameters: the activations are those of a
16-bit model, with no autocast weight cache.

deepspeed 0.19.8 runtime/engine.py ``_configure_distributed_model``: with ``fp16``/``bf16`` enabled,
``_cast_module_mixed_precision(param_dtype, ...)`` sets ``p.data = p.data.to(param_dtype)`` for every floating
parameter (buffers keep their loaded dtype unless ``buffer_dtype`` is set; HF rotary ``inv_freq`` is fp32 either
way), and the optimizer keeps fp32 master copies (``fitcheck.core.states``). accelerate 1.15 ``Accelerator.__init__``
turns native AMP off for ``DistributedType.DEEPSPEED`` (``native_amp`` stays False), so no torch autocast runs and
no 16-bit weight cache exists. A model loaded in fp32 and trained under DeepSpeed bf16 therefore saves exactly the
tensors of the same model loaded in bf16 without autocast (pinned by ``cpu_truth.py``'s bf16 rows; real
DeepSpeed CPU steps: ``benchmarks/deepspeed_cpu.py``).

FSDP: accelerate 1.15 ``FullyShardedDataParallelPlugin.set_mixed_precision`` turns ``mixed_precision`` bf16/fp16
into ``MixedPrecision(param_dtype=..., reduce_dtype=...)`` (FSDP2: ``MixedPrecisionPolicy``, utils/dataclasses.py),
so the unsharded parameters the forward reads are 16-bit; native AMP stays on, but autocast caches casts of fp32
leaves only, and there are none. Not run for real here (FSDP needs several processes); derived from source.

A bitsandbytes base under DeepSpeed fp16/bf16 (:func:`deepspeed_module_view`): the engine's loop casts by dtype,
not by class, so a 4-bit ``Params4bit`` packed in ``uint8`` and an 8-bit ``Int8Params`` (``int8``) are skipped
(not in ``CASTABLE_DTYPES``) and keep their quantization state (``absmax``, ``code``, ``SCB``: attributes, fp32,
never parameters); everything else, the fp32 norms, embeddings and head that peft's
``prepare_model_for_kbit_training`` made and peft's fp32 adapters, becomes 16-bit. transformers 5.23 never builds a
quantized model under ``zero.Init`` (``modeling_utils.py`` ``get_init_context``: ``if not is_quantized``), so the
cast runs at every ZeRO stage. A 4-bit base packed in a float ``bnb_4bit_quant_storage`` other than the DeepSpeed
dtype is cast too, by value, which destroys it (:func:`deepspeed_quant_storage_problem`).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.errors import ConfigError
from fitcheck.spec import Dtype, MixedPrecision, PrecisionSpec, Strategy, TrainingSpec

# deepspeed 0.19.8 runtime/engine.py CASTABLE_DTYPES: the parameter dtypes _cast_module_mixed_precision casts
_CASTABLE = (Dtype.FLOAT16, Dtype.BFLOAT16, Dtype.FLOAT32)


def deepspeed_module_view(spec: TrainingSpec) -> TrainingSpec:
    """The spec as the activations see it: DeepSpeed fp16/bf16 and FSDP mixed-precision full fine-tunes compute
    with a 16-bit module (DeepSpeed: no autocast; FSDP: autocast on 16-bit parameters).

    DeepSpeed casts every floating parameter, not only the trained ones (``_cast_module_mixed_precision``: ``for p
    in self.module.parameters(recurse=True): if p.dtype in CASTABLE_DTYPES``), so a LoRA run's frozen base and
    peft's fp32 adapters are 16-bit too: its view is a 16-bit model with 16-bit adapters
    (``PrecisionSpec.module_cast``). Real engine: ``benchmarks/deepspeed_cpu.py`` ``CASES["lora-fp32"]``, +44 %
    before; the tiny Llama at width 512, ZeRO-0/1/2, fp32- and bf16-loaded peaks equal: +51.7 % -> -0.00 %.
    Under ZeRO-3's ``zero.Init`` the adapters stay fp32 (below; not measured: the real-engine rows build the
    model outside it). FSDP's LoRA runs are returned unchanged (the formula's activations take
    :func:`activation_view`), and so are pre-quantized GPTQ / AWQ / FP8 / MXFP4 bases (not modelled).

    A bitsandbytes 4-bit or 8-bit base under DeepSpeed (the module docstring): the view is a 16-bit model over the
    packed base, with 16-bit adapters and no autocast, and peft's k-bit preparation undone
    (``activations.promoted.kbit_upcast`` is False under ``module_cast``): the 4-bit activations are those of QLoRA
    without the preparation (``activations/qlora16.py``), the 8-bit ones the 16-bit LoRA recipe's plus each 8-bit
    linear's kept input (``activations/bnb_kept_inputs.py``). Real engine: ``benchmarks/deepspeed_cpu.py``
    ``CASES["qlora-*"]`` / ``CASES["int8-*"]`` (tiny Llama h128, 16 tokens, q/v r8), the table in its docstring.

    Raises:
        ConfigError: A 4-bit base packed in a float ``bnb_4bit_quant_storage`` that is not the DeepSpeed dtype
            (:func:`deepspeed_quant_storage_problem`).
    """
    mp = spec.precision.mixed_precision
    strategy = spec.sharding.strategy
    if strategy not in (Strategy.DEEPSPEED, Strategy.FSDP) or mp is MixedPrecision.NO:
        return spec
    quant = spec.quant
    if spec.lora is not None and strategy is Strategy.FSDP:
        return spec  # the formula's activations: activation_view
    if quant is not None and (strategy is Strategy.FSDP or quant.method != "bitsandbytes"):
        return spec
    problem = deepspeed_quant_storage_problem(spec)
    if problem:
        raise ConfigError(problem)
    dtype = Dtype.BFLOAT16 if mp is MixedPrecision.BF16 else Dtype.FLOAT16
    if strategy is Strategy.FSDP:
        return replace(spec, precision=PrecisionSpec(load_dtype=dtype, mixed_precision=mp))
    # ZeRO-3 under zero.Init (transformers' from_pretrained with a ZeRO-3 config, DeepSpeedSpec.zero3_init): the
    # engine skips its cast (is_zero_init_model), zero.Init built the base at the config's dtype, and peft's
    # adapters added after keep fp32 (partition_parameters.py _convert_to_zero_parameters moves, never casts)
    # A quantized model is never built under zero.Init (transformers 5.23 modeling_utils.py get_init_context:
    # ``if not is_quantized and not _is_ds_init_called``; the quantized branch builds on the meta device), so the
    # engine finds no ds_id and casts it at ZeRO-3 too
    ds = spec.sharding.deepspeed
    zero_init = spec.sharding.zero_stage == 3 and ds is not None and ds.zero3_init and quant is None
    return replace(spec, precision=PrecisionSpec(load_dtype=dtype, mixed_precision=MixedPrecision.NO,
                                                 module_cast=not zero_init))


def activation_view(spec: TrainingSpec) -> TrainingSpec:
    """The spec as the formula's activations see it: :func:`deepspeed_module_view`, and an FSDP LoRA run over an
    unquantized base computing from FSDP's 16-bit copies (:func:`fsdp_adapters_16bit`): FSDP2 a 16-bit model with
    16-bit adapters under autocast (``PrecisionSpec.module_cast``), FSDP1 a 16-bit model whose adapters' inputs are
    cast as under plain autocast (peft reads the fp32 shard's dtype). The tracer and the whole-run replays keep
    :func:`deepspeed_module_view` (they trace the plain step: its adapter casts are not FSDP's; not measured).
    Real Trainer, tiny Llama, 1 and 2 gloo ranks (``benchmarks/fsdp_kinds_cpu.py`` ``lora-*``): start of backward
    FSDP2 +4.5 .. +6.2 % -> -0.1 .. -0.2 %, FSDP1 on 2 ranks +0.5 / +1.5 % -> -0.2 %."""
    view = deepspeed_module_view(spec)
    if view is not spec or not fsdp_adapters_16bit(spec) or spec.quant is not None:
        return view
    mp = spec.precision.mixed_precision
    dtype = Dtype.BFLOAT16 if mp is MixedPrecision.BF16 else Dtype.FLOAT16
    fs = spec.sharding.fsdp
    return replace(spec, precision=PrecisionSpec(load_dtype=dtype, mixed_precision=mp,
                                                 module_cast=fs is None or fs.version == 2))


def fsdp_adapters_16bit(spec: TrainingSpec) -> bool:
    """Whether a LoRA run's adapters compute from FSDP's 16-bit copies: FSDP mixed precision over an unquantized or
    a bitsandbytes 4-bit base (QLoRA: FSDP's ``param_dtype`` is then the quant storage dtype, transformers 5.23
    ``update_fsdp_plugin_peft``), so autocast casts no fp32 adapter weight (``activations.autocast_weight_cache``
    and the casts saved into backward hold none of them).

    accelerate 1.15 sets FSDP's ``MixedPrecision`` / ``MixedPrecisionPolicy`` ``param_dtype`` from
    ``mixed_precision`` (``FullyShardedDataParallelPlugin.set_mixed_precision``): FSDP2's unsharded parameters and
    FSDP1's flat-parameter views are 16-bit in forward, the fp32-upcast adapters' too (torch 2.13
    ``_fully_shard/_fsdp_param.py`` ``init_unsharded_param``; ``fsdp/_flat_param.py`` ``_use_low_precision_shard``).
    peft 0.21 ``lora.Linear.forward`` casts the input to ``lora_A.weight.dtype`` before ``lora_A`` runs: under
    FSDP2 the layer's unit is gathered then (16-bit: no cast); under FSDP1 each ``lora_A`` is its own unit
    (transformers 5.23 ``update_fsdp_plugin_peft``), still resharded to its fp32 shard when peft reads its dtype,
    so the input is cast to fp32 and autocast casts it back to 16 bits for ``lora_A`` (one 16-bit copy per adapter
    saved, as under plain autocast). Real Trainer, tiny Llama, 1 and 2 gloo ranks:
    ``benchmarks/fsdp_kinds_cpu.py`` (``lora-*`` engines): FSDP1 holds one 16-bit ``(b, s, h)`` input per adapter
    and no adapter weight cast, FSDP2 neither; ``qlora-*``: no adapter weight cast.
    """
    quant = spec.quant
    four_bit = quant is not None and quant.method == "bitsandbytes" and quant.bits == 4
    return (spec.sharding.strategy is Strategy.FSDP and spec.lora is not None and not spec.lora.use_dora
            and (quant is None or four_bit) and spec.precision.mixed_precision is not MixedPrecision.NO)


def deepspeed_quant_storage_problem(spec: TrainingSpec) -> str:
    """Why DeepSpeed's module cast destroys this run's 4-bit base ('' where it does not).

    ``_cast_module_mixed_precision`` (deepspeed 0.19.8 ``runtime/engine.py``) sets ``p.data = p.data.to(dtype)``
    on every parameter whose dtype is in ``CASTABLE_DTYPES``, a ``Params4bit`` packed in a float
    ``bnb_4bit_quant_storage`` included. ``Tensor.to`` converts values, not bytes: fp32 storage under bf16 halves the
    packed bytes and bitsandbytes 0.50.2 ``dequantize_4bit`` fails in the first forward (the real engine on CPU:
    ``RuntimeError: shape '[128, 64]' is invalid for input of size 4096``); bf16 storage under fp16 keeps the size
    and silently scrambles every weight (``dequantize_4bit`` of the cast packed tensor vs the original, nf4,
    blocksize 64, N(0, 1) weights: max |difference| 7.6). ``uint8`` storage (the default) is not castable and is
    left alone; a storage equal to the DeepSpeed dtype is not cast.
    """
    quant, mp = spec.quant, spec.precision.mixed_precision
    if (spec.sharding.strategy is not Strategy.DEEPSPEED or mp is MixedPrecision.NO or quant is None
            or quant.method != "bitsandbytes" or quant.bits != 4 or quant.quant_storage not in _CASTABLE):
        return ""
    dtype = Dtype.BFLOAT16 if mp is MixedPrecision.BF16 else Dtype.FLOAT16
    if quant.quant_storage is dtype:
        return ""
    broken = ("bitsandbytes' dequantize_4bit fails in the first forward" if quant.quant_storage.nbytes != dtype.nbytes
              else "every weight is silently scrambled")
    return (f"bnb_4bit_quant_storage={quant.quant_storage.value} under DeepSpeed {mp.value}: deepspeed 0.19.8 "
            f"runtime/engine.py _cast_module_mixed_precision casts every float parameter to {dtype.value}, the packed "
            f"4-bit weights too, by value ({broken}); set bnb_4bit_quant_storage to {dtype.value} (the DeepSpeed "
            "dtype, as peft's ZeRO-3 QLoRA recipe does) or leave it at uint8")
