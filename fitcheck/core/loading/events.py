"""The device allocations ``from_pretrained`` and peft's preparation make, in order, as caching-allocator events.

Sources (the installed versions):

* transformers 5.23 ``core_model_loading.py`` ``convert_and_load_state_dict_in_model``: checkpoint tensors are
  sorted by ``dot_natural_key`` (layer indices numerically) and each is materialised by ``_materialize_copy``:
  ``tensor[...]`` (read on the host) then ``tensor.to(device=param_device, dtype=_dtype)``; a CPU-to-GPU copy
  with a dtype change converts on the host (torch ``aten/src/ATen/native/cuda/Copy.cu``: conversions of
  CPU-GPU copies are done on the CPU), so the device sees one tensor in the target dtype. A parameter quantized
  on load keeps the load dtype (``needs_quantization`` skips the cast to the empty parameter's dtype).
  With on-the-fly quantization the loading is synchronous ("avoid worker threads loading full-precision tensors
  to GPU faster than the main thread can quantize them"), so one 16-bit weight at a time is on the device.
* transformers 5.23 ``modeling_utils.py`` ``caching_allocator_warmup`` (called by ``_load_pretrained_model`` when a
  ``device_map`` is given, unless the quantizer is HQQ or Quark): before any weight is loaded, one
  ``torch.empty(byte_count // 2, dtype=float16)`` on the device, freed at once, where ``byte_count`` is
  ``get_total_byte_count``: every parameter's ``numel x element size`` (tied parameters once; a bitsandbytes
  quantizer's ``quantized_element_size``: 0.5 for 4-bit, 1 for 8-bit, for the weights it quantizes), less what the
  allocator already caches unused, at most the device's memory less 1.2 GiB. The block stays cached: the weights
  are then carved out of it (best fit, split), and with ``max_split_size_mb`` below its size it is an oversize
  block that no smaller weight may take (``CUDACachingAllocator.cpp`` ``get_free_block``), so the weights get
  segments of their own beside it: the H200 measured 4718 MiB reserved after loading Llama-3.2-1B bf16 with
  ``max_split_size_mb:128`` against 2360 MiB without (``benchmarks/data/gpu_truth_nvidia_h200.json``).
* transformers 5.23 ``integrations/bitsandbytes.py`` ``Bnb4bitQuantize.convert``: ``Params4bit(value,
  ...).to(value.device)``; bitsandbytes 0.50.2 ``nn/modules.py`` ``Params4bit._quantize`` calls
  ``functional.quantize_4bit``: the packed weight and the fp32 ``absmax`` (one per ``blocksize`` block) are
  allocated while the 16-bit weight is alive; with ``compress_statistics`` (nested quantization) ``offset =
  absmax.mean()``, the temporary ``absmax - offset`` and ``quantize_blockwise`` (uint8 absmax + fp32 absmax of
  256-blocks, and a copy of the 256-entry dynamic code table, ``code.to(A.device, copy=True)``) follow, then the fp32
  ``absmax`` is deleted. The 16-bit weight is dropped when the parameter is
  replaced (``set_param_for_module``, ``del realized_value``).
* transformers 5.23 ``Bnb8bitQuantize.convert`` passes ``value.to("cpu")`` to ``Int8Params`` and moves it back;
  bitsandbytes 0.50.2 ``Int8Params._quantize``: ``B = data.contiguous().to(device, dtype=torch.float16)`` (a new
  GPU copy for every load dtype, fp16 included, while the loaded value is still alive), ``int8_vectorwise_quant(B)``:
  fp32 ``SCB`` (one per row), then int8 ``CB`` (one byte per element).
* A pre-quantized bitsandbytes checkpoint (``Bnb4bitDeserialize``) loads the packed weight and its statistics as
  stored: no 16-bit copy.
* peft 0.21.2 ``utils/other.py`` ``prepare_model_for_kbit_training``: every fp16/bf16 parameter that is not
  quantized gets ``param.data = param.data.to(torch.float32)`` (an fp32 copy, then the 16-bit tensor is freed).

Not modelled here (their placements keep their own rules): FSDP (``core/states/fsdp_qlora.py`` ``load_peak``),
DeepSpeed without a bitsandbytes base (ZeRO-3 partitions during ``from_pretrained``; ZeRO-0/1/2 load on the host and
the engine moves the model), a ``device_map`` over several GPUs. DeepSpeed over a bitsandbytes base loads as one
device does, on every rank (``phase.loads_on_one_device``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.core.states import base_weights, is_quantized, quantized_bytes
from fitcheck.spec import DeviceType, Dtype, ParamEntry, Strategy, TrainingSpec

_CODE_4BIT = 16 * 4  # get_4bit_type: 16 fp32 code values, a new tensor per weight
_CODE_DYNAMIC = 256 * 4  # quantize_blockwise: QuantState(code=code.to(A.device, copy=True)): a copy per weight
_NESTED_BLOCK = 256  # quantize_blockwise(..., blocksize=256) of the absmax


def _ceil_div(a: int, b: int) -> int:
    return -(a // -b)


def natural_key(name: str) -> list[tuple[int, int | str] | tuple[int, str, int]]:
    """transformers 5.23 ``dot_natural_key``: digits numerically, other parts by text (then trailing digits)."""
    parts: list[tuple[int, int | str] | tuple[int, str, int]] = []
    for part in name.split("."):
        if part.isdigit():
            parts.append((0, int(part)))
        else:
            text = part.rstrip("0123456789")
            digits = part[len(text):]
            parts.append((1, text, int(digits)) if digits else (1, text))
    return parts


@dataclass(frozen=True)
class LoadEvent:
    """One allocation or free on the device.

    Attributes:
        kind: ``alloc`` or ``free``.
        handle: Names the tensor (an allocation and its free share it).
        nbytes: Bytes requested (0 for a free).
        what: What the tensor is (for the report's detail).
    """

    kind: str
    handle: int
    nbytes: int
    what: str = ""


class _Seq:
    def __init__(self) -> None:
        self.events: list[LoadEvent] = []
        self._n = 0

    def alloc(self, nbytes: int, what: str = "") -> int:
        self._n += 1
        self.events.append(LoadEvent("alloc", self._n, max(nbytes, 1), what))
        return self._n

    def free(self, handle: int) -> None:
        self.events.append(LoadEvent("free", handle, 0))


def load_order(spec: TrainingSpec) -> list[tuple[str, ParamEntry]]:
    """Every parameter instance with its checkpoint name, in loading order (``dot_natural_key``): the order of
    :func:`load_events`' parameters."""
    out = [
        (e.name.replace("*", str(i), 1), e)
        for e in spec.model.params
        for i in range(e.repeat if e.per_layer else 1)
    ]
    out.sort(key=lambda ne: natural_key(ne[0]))
    return out


def _quantize_4bit(seq: _Seq, spec: TrainingSpec, entry: ParamEntry, load: Dtype) -> None:
    quant = spec.quant
    assert quant is not None
    n = entry.numel_each
    w = seq.alloc(n * load.nbytes, "16-bit weight before quantization")
    qb = quantized_bytes(n, quant, entry.out_features or entry.shape[0])
    seq.alloc(qb.data, "packed 4-bit weight")
    blocks = _ceil_div(n, quant.blocksize)
    absmax = seq.alloc(4 * blocks, "fp32 absmax")
    seq.alloc(_CODE_4BIT, "4-bit code table")
    if quant.double_quant:
        seq.alloc(4, "absmax offset")
        tmp = seq.alloc(4 * blocks, "absmax - offset")
        seq.alloc(_CODE_DYNAMIC, "nested code table (a copy per weight)")
        seq.alloc(blocks, "uint8 nested absmax")
        seq.alloc(4 * _ceil_div(blocks, _NESTED_BLOCK), "fp32 absmax of the nested blocks")
        seq.free(tmp)
        seq.free(absmax)
    seq.free(w)


def _quantize_8bit(seq: _Seq, entry: ParamEntry, load: Dtype, cpu: bool) -> None:
    """transformers 5.23 ``Bnb8bitQuantize.convert``: ``Int8Params(value.to("cpu"), ...).to(value.device)`` while
    the loaded ``value`` stays on the GPU; ``Int8Params.to`` quantizes a CPU tensor (``_quantize``): ``B =
    data.contiguous().to(device=device, dtype=torch.float16)`` is a new GPU copy whatever the load dtype (fp16
    too: the data is the CPU copy; on a CPU run ``value.to("cpu")`` is the value itself and an fp16 one is not
    copied), then the CUDA ``int8_vectorwise_quant`` (``backends/cuda/ops.py``) allocates ``row_stats`` (SCB, fp32)
    before ``out_row`` (CB, int8); the copy and the loaded value are freed after."""
    n = entry.numel_each
    w = seq.alloc(n * load.nbytes, "16-bit weight before quantization")
    copy = not (cpu and load is Dtype.FLOAT16)
    fp16 = seq.alloc(n * 2, "fp16 copy for int8_vectorwise_quant (from the CPU copy)") if copy else None
    seq.alloc(4 * (entry.out_features or entry.shape[0]), "fp32 row scales (SCB)")
    seq.alloc(n, "int8 weight (CB)")
    if fp16 is not None:
        seq.free(fp16)
    seq.free(w)


_WARMUP_HEADROOM = int(1.2 * 1024**3)  # caching_allocator_warmup: byte_count <= total memory - 1.2 GiB


def warmup_bytes(spec: TrainingSpec, capacity: int | None = None) -> int:
    """The block ``caching_allocator_warmup`` allocates and frees before loading (0: no warm-up).

    Args:
        spec: The training spec.
        capacity: The device's bytes, if known (the block is at most that less 1.2 GiB).

    Returns:
        Bytes requested: ``byte_count // 2`` fp16 elements. 0 under DDP: trl 1.16 ``SFTTrainer`` loads with
        ``device_map=None`` for ``MULTI_GPU`` (``sft_trainer.py``: "Distributed training requires device_map=None"),
        and without a ``device_map`` there is no warm-up; 0 for a non-bitsandbytes quantized base (its quantizers
        size their parameters their own way; not modelled).
    """
    quant = spec.quant
    if (quant is not None and quant.method != "bitsandbytes") or spec.sharding.strategy is Strategy.DDP:
        return 0
    load = spec.precision.load_dtype.nbytes
    total = 0.0
    for e in spec.model.params:
        count = e.numel_each * (e.repeat if e.per_layer else 1)
        size = (0.5 if quant.bits == 4 else 1.0) if quant is not None and is_quantized(spec, e) else load
        total += count * size
    if capacity is not None:
        total = min(total, capacity - _WARMUP_HEADROOM)
    return max(int(total // 2) * 2, 0)


def load_events(spec: TrainingSpec, capacity: int | None = None) -> list[LoadEvent]:
    """The device allocations and frees of ``from_pretrained`` for a model loaded onto one GPU.

    Args:
        spec: The training spec.
        capacity: The device's bytes, if known (caps ``caching_allocator_warmup``'s block).

    Returns:
        Events in order: ``caching_allocator_warmup``'s block allocated and freed, unquantized parameters in
        their resident dtype, bitsandbytes weights quantized on load
        (16-bit copy, packed weight and statistics, the copy freed), or pre-quantized weights as stored.
    """
    seq = _Seq()
    quant = spec.quant
    load = spec.precision.load_dtype
    bnb = quant is not None and quant.method == "bitsandbytes"
    warm = warmup_bytes(spec, capacity)
    if warm:
        seq.free(seq.alloc(warm, "caching_allocator_warmup"))
    for _name, entry in load_order(spec):
        if quant is not None and is_quantized(spec, entry):
            qb = quantized_bytes(entry.numel_each, quant, entry.out_features or entry.shape[0])
            if not bnb or quant.pre_quantized:
                seq.alloc(qb.data, "quantized weight as stored")
                seq.alloc(qb.meta, "quantization statistics as stored")
            elif quant.bits == 4:
                _quantize_4bit(seq, spec, entry, load)
            else:
                _quantize_8bit(seq, entry, load, spec.hardware.device_type is DeviceType.CPU)
            continue
        seq.alloc(entry.numel_each * load.nbytes, "parameter")
    return seq.events


def prepare_events(spec: TrainingSpec, after_load: list[LoadEvent]) -> list[LoadEvent]:
    """peft ``prepare_model_for_kbit_training``'s fp32 casts of the unquantized 16-bit parameters, after loading.

    Args:
        spec: The training spec.
        after_load: The load events (their handles name the parameters to replace).

    Returns:
        Events: for each upcast parameter, the fp32 copy allocated and the 16-bit tensor freed.
    """
    quant = spec.quant
    if quant is None or not quant.prepare_for_kbit_training or not spec.precision.load_dtype.is_half:
        return []
    if not base_weights(spec).upcast_params:
        return []
    seq = _Seq()
    seq._n = max((e.handle for e in after_load), default=0)
    params = iter(e for e in after_load if e.kind == "alloc" and e.what == "parameter")
    for _name, entry in load_order(spec):
        if is_quantized(spec, entry):
            continue
        old = next(params, None)
        if old is None:
            break
        seq.alloc(entry.numel_each * 4, "fp32 copy (prepare_model_for_kbit_training)")
        seq.free(old.handle)
    return seq.events
