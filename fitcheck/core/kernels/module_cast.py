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
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.spec import Dtype, MixedPrecision, PrecisionSpec, Strategy, TrainingSpec


def deepspeed_module_view(spec: TrainingSpec) -> TrainingSpec:
    """The spec as the activations see it: DeepSpeed fp16/bf16 and FSDP mixed-precision full fine-tunes compute
    with a 16-bit module (DeepSpeed: no autocast; FSDP: autocast on 16-bit parameters).

    DeepSpeed casts every floating parameter, not only the trained ones (``_cast_module_mixed_precision``: ``for p
    in self.module.parameters(recurse=True): if p.dtype in CASTABLE_DTYPES``), so a LoRA run's frozen base and
    peft's fp32 adapters are 16-bit too: its view is a 16-bit model with 16-bit adapters
    (``PrecisionSpec.module_cast``). Real engine: ``benchmarks/deepspeed_cpu.py`` ``CASES["lora-fp32"]``, +44 %
    before; the tiny Llama at width 512, ZeRO-0/1/2, fp32- and bf16-loaded peaks equal: +51.7 % -> -0.00 %.
    Under ZeRO-3's ``zero.Init`` the adapters stay fp32 (below; not measured: the real-engine rows build the
    model outside it). Quantized bases are returned unchanged (bitsandbytes' uint8/int8 storage is not castable,
    its other parameters and the adapters are: not modelled here); so are FSDP's LoRA runs (accelerate's fp32
    upcast of the trainables, ``core/states/fsdp_upcast.py``).
    """
    mp = spec.precision.mixed_precision
    strategy = spec.sharding.strategy
    if strategy not in (Strategy.DEEPSPEED, Strategy.FSDP) or mp is MixedPrecision.NO:
        return spec
    if spec.quant is not None or (spec.lora is not None and strategy is Strategy.FSDP):
        return spec
    dtype = Dtype.BFLOAT16 if mp is MixedPrecision.BF16 else Dtype.FLOAT16
    if strategy is Strategy.FSDP:
        return replace(spec, precision=PrecisionSpec(load_dtype=dtype, mixed_precision=mp))
    # ZeRO-3 under zero.Init (transformers' from_pretrained with a ZeRO-3 config, DeepSpeedSpec.zero3_init): the
    # engine skips its cast (is_zero_init_model), zero.Init built the base at the config's dtype, and peft's
    # adapters added after keep fp32 (partition_parameters.py _convert_to_zero_parameters moves, never casts)
    ds = spec.sharding.deepspeed
    zero_init = spec.sharding.zero_stage == 3 and ds is not None and ds.zero3_init
    return replace(spec, precision=PrecisionSpec(load_dtype=dtype, mixed_precision=MixedPrecision.NO,
                                                 module_cast=not zero_init))
