"""GRPO's generation phase traced: the real transformers ``generate`` of the run's model on fake tensors.

TRL 1.16 ``trl/trainer/grpo_trainer.py`` ``GRPOTrainer._generate_single_turn`` (regular path, no vLLM) calls
``unwrapped_model.generate(**generate_inputs, generation_config=self.generation_config)`` inside
``unwrap_model_for_generation`` (``trl/models/utils.py`` ``_unwrap_model_for_generation``: gradient checkpointing
disabled, **no** ``eval()``: the policy generates in train mode, LoRA's dropout on) and ``torch.no_grad()``;
``self.generation_config`` is ``GenerationConfig(max_new_tokens=max_completion_length, do_sample=True, pad_token_id,
bos_token_id, eos_token_id, temperature, top_p, top_k, min_p, repetition_penalty, cache_implementation,
**generation_kwargs, disable_compile=True)`` (``GRPOTrainer.__init__``), GRPOConfig's defaults: temperature 1.0,
top_p 1.0, top_k 0, min_p None, repetition_penalty 1.0, no cache implementation (a ``DynamicCache``). A full model's
forward is the one ``Accelerator.prepare_model`` wrapped (accelerate 1.15 ``accelerator.py`` L1824-1835: autocast,
then ``convert_outputs_to_fp32``; ``unwrap_model(keep_fp32_wrapper=True)`` keeps it); a PEFT model's
``PeftModelForCausalLM.generate`` calls the inner model's ``generate``, whose forward is not wrapped.

:func:`trace_generate` runs that ``generate`` (transformers 5.23 ``generation/utils.py`` ``GenerationMixin.generate``
/ ``_sample``: the prefill forward, then one decode forward per new token, ``DynamicLayer.update``'s ``torch.cat``)
under the tracer's ``FakeTensorMode`` and ``LiveTensorRecorder``, and records the peak of live bytes of each
forward's step (from its forward to the next one's: the previous step's sampling tensors are alive through it) and
the cache's bytes. Two things a fake tensor cannot do are given their value for the traced run (one prompt length,
no padding, no EOS sampled, as ``tracer_grpo``'s step): the stop decision (``StopCheck.__call__``'s
``bool(unfinished_sequences.max() == 0)``) is ``length >= max_length`` (every completion runs to
``max_completion_length``, GRPO's longest generation), and ``generate``'s checks on its inputs read an ``any()`` as
False and an ``all()`` as True (``_prepare_special_tokens``' EOS checks; no right padding; the all-ones attention
mask dropped, L2897-2905; ``_get_logits_processor``'s negative-id check); any other data-dependent read fails the
trace (the formula answers, with the reason).

Two runs are traced, not the whole generation: the prefill at the prompt, and the last decode step (cache
``prompt + completion - 2`` tokens before it) as the second decode step after a prompt of ``prompt + completion - 3``
tokens: at that step the ids, the cache, the previous step's sampling tensors and the processors' state are those of
the real run's last step (the longer prefill's tensors are gone by then). Each decode step's peak grows with its
cache, so the last one is the largest of them. An extrapolation from the first decode steps is not exact: their
peak can be at the sampling moment while the last step's is at the last layer's ``torch.cat`` (Llama h 256, 4
layers, 8 x (16 + 128): -1.8 % on the real ``_generate``, ``benchmarks/grpo_generation.py``).
The model is traced two repeating layer groups deep and deepened by the added layers' cache
(:func:`traced_generation`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from fitcheck.report import Component
from fitcheck.spec import TrainingSpec

GENERATE_SOURCE = ("fake-tensor trace of the real generate (transformers 5.23 generation/utils.py _sample, "
                   "trl 1.16 grpo_trainer.py _generate_single_turn: train mode, no_grad; "
                   "fitcheck.torch_adapters.tracer_generate)")
LAST_STEPS = 3  # new tokens of the run that ends at the last decode step (a prefill, then two decode steps)
_BUILD_KEYS = ("dtype", "attn_implementation", "lora", "quant", "adapter")


@dataclasses.dataclass(frozen=True)
class GenerationTrace:
    """Peak live bytes of ``generate``'s steps above the model state (its inputs excluded, as the trainer made them).

    Attributes:
        layers: Decoder layers of the traced model.
        prompt: Prompt tokens.
        steps: Peak of each forward's step: the prefill's, then each decode step's (cache before its forward:
            ``prompt``, ``prompt + 1``, ...).
        cache: Bytes of the ``DynamicCache`` after each forward.
    """

    layers: int
    prompt: int
    steps: tuple[int, ...]
    cache: tuple[int, ...]

    def deepened(self, layers: int) -> GenerationTrace:
        """The trace of a model ``layers`` deep: each step's peak and cache plus the added layers' share of the
        cache after it (:func:`traced_generation`)."""
        add = [c * (layers - self.layers) // self.layers for c in self.cache]
        return GenerationTrace(layers, self.prompt, tuple(p + a for p, a in zip(self.steps, add, strict=True)),
                               tuple(c + a for c, a in zip(self.cache, add, strict=True)))


@contextlib.contextmanager
def _fake_reads(max_length: int) -> Iterator[None]:
    """What a fake tensor cannot answer, answered for the traced run (module docstring)."""
    import torch
    import transformers.generation.utils as generation_utils
    from torch.utils._python_dispatch import TorchDispatchMode

    class Reads(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.known: dict[int, tuple[Any, bool]] = {}  # id -> (weak reference to the scalar, its value)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten._local_scalar_dense.default:
                ref, value = self.known.get(id(args[0]), (None, False))
                if ref is None or ref() is not args[0]:
                    raise RuntimeError("generate read a value of a fake tensor that the trace cannot give")
                return value
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket in (torch.ops.aten.any, torch.ops.aten.all):
                self.known[id(out)] = (weakref.ref(out), func.overloadpacket is torch.ops.aten.all)
            return out

    stop = generation_utils.StopCheck.__call__

    def stop_at_length(self: Any, unfinished: Any, tokens: Any, length: int) -> bool:
        return length >= max_length

    generation_utils.StopCheck.__call__ = stop_at_length  # type: ignore[method-assign, assignment]
    try:
        with Reads():
            yield
    finally:
        generation_utils.StopCheck.__call__ = stop  # type: ignore[method-assign]


def _cache_bytes(cache: Any) -> int:
    """Bytes of a ``DynamicCache``'s keys and values (``cache_utils.py`` ``DynamicLayer``)."""
    return sum(t.untyped_storage().nbytes() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None and hasattr(t, "untyped_storage"))


def trace_generate(model: Any, *, rows: int, prompt: int, new_tokens: int, fp32_outputs: bool,
                   autocast: Any = None, generation_kwargs: Mapping[str, Any] | None = None,
                   use_cache: bool = True, state: Iterable[Any] = ()) -> GenerationTrace:
    """Run ``model.generate`` as GRPOTrainer does and record each step's peak (module docstring).

    Works on real CPU tensors (``fake`` off: the truth the tests compare with) and under the tracer's
    ``FakeTensorMode`` (the caller enters it and builds ``model`` inside).

    Args:
        model: The policy (PEFT-wrapped for adapters), in train mode.
        rows: Sequences generated together.
        prompt: Prompt tokens (one length: no padding).
        new_tokens: ``max_new_tokens`` of this run (prefill + ``new_tokens - 1`` decode forwards).
        fp32_outputs: The forward is accelerate's wrapped one (a full model): ``convert_outputs_to_fp32``.
        autocast: The autocast context accelerate's wrapper enters (None: none); full models only.
        generation_kwargs: ``GRPOConfig.generation_kwargs`` (e.g. ``min_new_tokens``).
        use_cache: config.json's ``use_cache`` (default True): ``_prepare_generation_config`` fills the
            generation config's defaults from ``model.generation_config``, which the loaded model derives from it
            (the tracer's build turns it off for the training step, ``tracer_build.hf_config``).
        state: Model state that is neither a parameter nor a buffer (a 4-bit base's quantization state).
    """
    import torch
    from transformers import GenerationConfig

    from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner.generation_config.use_cache = use_cache
    cfg = inner.config.get_text_config(decoder=True)
    eos = getattr(cfg, "eos_token_id", None)
    gen = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=new_tokens, do_sample=True, pad_token_id=getattr(cfg, "pad_token_id", None),
        bos_token_id=getattr(cfg, "bos_token_id", None), eos_token_id=eos, temperature=1.0, top_p=1.0, top_k=0,
        min_p=None, repetition_penalty=1.0, cache_implementation=None, **dict(generation_kwargs or {}),
        disable_compile=True)
    fake = _is_fake(next(inner.parameters()))
    ids = torch.randint(2, int(cfg.vocab_size), (rows, prompt))
    mask = torch.ones_like(ids)
    rec = LiveTensorRecorder()
    rec.track(model.parameters())  # the model state: known (their views are not new storages), not counted
    rec.track(model.buffers())
    rec.track(state)
    base = rec.current
    caches: list[int] = []

    def before(_module: Any, _args: Any) -> None:  # a step runs from its forward to the next one's
        rec.enter_region(f"step{len(caches)}")

    def after(_module: Any, _args: Any, output: Any) -> None:
        caches.append(0 if output.past_key_values is None else _cache_bytes(output.past_key_values))

    handles = [inner.register_forward_pre_hook(before), inner.register_forward_hook(after)]
    restore = inner.forward
    if fp32_outputs:  # Accelerator.prepare_model's forward (full model)
        from accelerate.utils import convert_outputs_to_fp32

        forward = restore if autocast is None else autocast(restore)
        inner.forward = convert_outputs_to_fp32(forward)
    reads = _fake_reads(prompt + new_tokens) if fake else contextlib.nullcontext()
    try:
        with torch.no_grad(), rec, reads:
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
            rec.enter_region("done")
    finally:
        for h in handles:
            h.remove()
        inner.forward = restore
    if tuple(out.shape) != (rows, prompt + new_tokens):
        raise RuntimeError(f"generate returned {tuple(out.shape)}, not {rows} x {prompt + new_tokens} tokens")
    peaks = [rec.regions[f"step{i}"].peak - base for i in range(len(caches))]
    layers = int(cfg.num_hidden_layers)
    return GenerationTrace(layers, prompt, tuple(peaks), tuple(caches))


def _is_fake(tensor: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(tensor, FakeTensor)


def traced_generation(spec: TrainingSpec, rows: int, kwargs: Mapping[str, Any],
                      generation_kwargs: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """(whole KV cache, peak above the model state) of GRPO's ``generate`` for ``rows`` sequences of the spec's
    prompt + completion (``kwargs``: ``trace_arguments.activation_trace_kwargs`` of the spec, whose model build, mixed
    precision and CUDA kernels the generation shares; ``generation_kwargs``: ``GRPOConfig.generation_kwargs``, which
    fitcheck's spec does not carry: the benchmark's ``min_new_tokens``).

    Traced at two repeating layer groups (the whole stack when it is at most three deep) and deepened by the cache
    of the layers added: from the second layer on, a deeper model's every moment holds one more layer's K/V and
    nothing else (the top layer's tensors are the same). At one layer it does not: the prefill's peak is higher by
    more than one layer's K/V (the embedding output is the layer's input). Qwen2.5-0.5B 8 x 512 bf16, fake: 1 -> 2
    -> 3 -> 4 layers, prefill +9,437,184, +2,097,152, +2,097,152 B (one layer's prompt K/V), the decode steps
    +2,101,248 / +2,105,344 B each (one layer's cache at 513 / 514 tokens); checked on the real ``generate`` by
    ``tests/test_grpo_generation.py``.
    """
    from fitcheck.torch_adapters.tracer_build import config_layers
    from fitcheck.torch_adapters.tracer_depth import depth_plan

    t, config = spec.trainer, spec.model.config
    prompt, completion = t.prompt_length, t.completion_length
    traced = depth_plan(config, None, skip_first=True)[0]
    if completion <= LAST_STEPS:  # every step traced as it runs
        runs = [(prompt, completion)]
    else:  # the prefill at the prompt; the last decode step as the second decode step after a longer prompt
        runs = [(prompt, 1), (prompt + completion - LAST_STEPS, LAST_STEPS)]
    depth = int(config_layers(config))
    traces = [tr.deepened(depth) for tr in _trace_at(config, traced, rows, runs, kwargs, generation_kwargs)]
    if len(traces) == 1:
        return traces[0].cache[-1], max(traces[0].steps)
    prefill, last = traces
    return last.cache[-1], max(prefill.steps[0], last.steps[-1])


def _trace_at(config: Mapping[str, Any], layers: int, rows: int, runs: list[tuple[int, int]],
              kwargs: Mapping[str, Any], generation_kwargs: Mapping[str, Any] | None = None
              ) -> list[GenerationTrace]:
    """``generate`` on fake tensors for each ``(prompt, new tokens)`` of ``runs``, one model ``layers`` deep built as
    the step's trace builds it (checkpointing off, as ``unwrap_model_for_generation`` leaves it), in train mode."""
    import torch

    from fitcheck.torch_adapters.tracer import fake_mode, torch_dtype
    from fitcheck.torch_adapters.tracer_build import build_model, reduced_config

    build = {k: kwargs[k] for k in _BUILD_KEYS if k in kwargs}
    build["dtype"] = torch_dtype(build.get("dtype", "bfloat16"))
    kernels = contextlib.ExitStack()
    if kwargs.get("cuda_kernels"):
        from fitcheck.torch_adapters.cuda_emulation import cuda_kernels

        kernels.enter_context(cuda_kernels())
    if kwargs.get("quant") is not None:
        from fitcheck.torch_adapters.tracer_patches import warm_bitsandbytes

        warm_bitsandbytes()
    mixed = kwargs.get("mixed_precision", "no")
    autocast = None
    if mixed in ("bf16", "fp16"):
        autocast = torch.autocast("cpu", dtype=torch.bfloat16 if mixed == "bf16" else torch.float16)
    with fake_mode(True), kernels:
        model = build_model(reduced_config(config, layers), checkpointing=False, fake=True, **build)
        model.train()
        peft = hasattr(model, "get_base_model")
        state: list[Any] = []
        if kwargs.get("quant") is not None:
            from fitcheck.torch_adapters.tracer_quant import quant_state_tensors

            state = quant_state_tensors(model)
        return [trace_generate(model, rows=rows, prompt=prompt, new_tokens=new_tokens, fp32_outputs=not peft,
                               autocast=None if peft else autocast, use_cache=bool(config.get("use_cache", True)),
                               state=state, generation_kwargs=generation_kwargs) for prompt, new_tokens in runs]


def traces_generate(spec: TrainingSpec) -> bool:
    """Whether the run generates with ``model.generate`` (GRPO without vLLM: ``core.trainers`` gives it a
    generation phase)."""
    from fitcheck.core.trainers import TrainerKind

    return spec.trainer.kind is TrainerKind.GRPO and not spec.trainer.use_vllm


class GenerationTraces:
    """GRPO's ``generate`` traced per kind of run, every generation batch after the first two of a kind interpolated
    (every tensor of ``generate`` is ``[rows, ...]`` or independent of the rows: the peak and the cache are affine
    in the rows, as ``trace_batch`` takes the step's in the micro-batch; ``tests/test_grpo_generation.py``).

    Attributes:
        cache: A ``trace_cache.TraceCache`` that keeps each trace across processes (None: this process only).
    """

    def __init__(self, cache: Any = None) -> None:
        self.cache = cache
        self._points: dict[str, dict[int, tuple[int, int]]] = {}

    def components(self, spec: TrainingSpec) -> tuple[Component, ...]:
        """The traced ``generation.kv_cache`` and ``generation.working_set`` of a GRPO run (empty for any other
        run) at the spec's generation batch (``core.trainers.generation_rows``); the core adds the persistent
        state (``Phase.GENERATION``).

        Raises:
            Exception: Whatever stops the trace (the caller falls back to the formula with the reason).
        """
        from fitcheck.core.trainers import generation_parts, generation_rows, step_spec
        from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs

        if not traces_generate(spec):
            return ()
        run = step_spec(spec)
        rows, kwargs = generation_rows(run), activation_trace_kwargs(spec)
        t = run.trainer
        kind = repr([sorted((k, repr(v)) for k, v in kwargs.items() if k != "micro_batch"), run.model.model_id,
                     run.model.shape, t.prompt_length, t.completion_length])
        points = self._points.setdefault(kind, {})
        if rows not in points and len(points) >= 2:
            (r1, (c1, p1)), (r2, (c2, p2)) = sorted(points.items())[:2]
            kv, peak = (c1 + (c2 - c1) * (rows - r1) // (r2 - r1), p1 + (p2 - p1) * (rows - r1) // (r2 - r1))
        elif rows not in points:
            def compute() -> tuple[int, int]:
                return traced_generation(run, rows, kwargs)

            points[rows] = compute() if self.cache is None else self.cache.remember(
                "generation", [kind, run.model.config, rows], compute, list, lambda v: (int(v[0]), int(v[1])))
            kv, peak = points[rows]
        else:
            kv, peak = points[rows]
        return generation_parts(run, kv, peak - kv, GENERATE_SOURCE)
