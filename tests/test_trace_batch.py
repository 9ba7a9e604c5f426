"""The fast default trace: micro-batches interpolated from two traces, one optimizer-free step, shared traces.

Every claim the default path's speed rests on (``fitcheck.torch_adapters.trace_batch``,
``trace_arguments.activation_trace_kwargs``, ``pinned_path.PinnedPath``) is checked here against real fake-tensor traces
of the real transformers / peft / bitsandbytes models: a third trace, every phase (during backward included),
every category.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from tiny_models import family_config, spec_from_config

from fitcheck.spec import LoraSpec, OptimizerSpec, QuantSpec

pytest.importorskip("transformers")

WIDTHS = {"hidden_size": 128, "intermediate_size": 344, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 3, "vocab_size": 512}
LLAMA = family_config("llama", WIDTHS)
GEMMA2 = family_config("gemma2", WIDTHS, head_dim=32)
PHI = {"model_type": "phi", "architectures": ["PhiForCausalLM"], "hidden_size": 128, "intermediate_size": 344,
       "num_attention_heads": 4, "num_hidden_layers": 3, "vocab_size": 512}
FALCON = {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "hidden_size": 128,
          "num_attention_heads": 4, "num_hidden_layers": 3, "vocab_size": 512, "new_decoder_architecture": False,
          "multi_query": True, "parallel_attn": True, "bias": False, "alibi": False}

KINDS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("llama-full-sdpa", LLAMA, {}),
    ("llama-full-eager-ckpt", LLAMA, {"attn_implementation": "eager", "checkpointing": True}),
    ("llama-lora-dropout-fp32", LLAMA, {"lora": LoraSpec(r=8, dropout=0.1), "dtype": "float32"}),
    ("llama-dora-ckpt", LLAMA, {"lora": LoraSpec(r=8, use_dora=True, dropout=0.05), "checkpointing": True,
                                "dtype": "float32"}),
    ("llama-qlora-ckpt-autocast", LLAMA, {"lora": LoraSpec(r=8), "quant": QuantSpec(), "checkpointing": True,
                                          "dtype": "float32", "mixed_precision": "bf16"}),
    ("gemma2-lora-eager", GEMMA2, {"lora": LoraSpec(r=8), "attn_implementation": "eager"}),
    ("phi-lora-ckpt", PHI, {"lora": LoraSpec(r=8, target_modules=("all-linear",)), "checkpointing": True}),
    ("falcon-full-eager", FALCON, {"attn_implementation": "eager"}),
]
SEQ = 48


def _trace(config: dict[str, Any], micro_batch: int, **kw: Any) -> Any:
    from fitcheck.torch_adapters.tracer import trace_step

    return trace_step(config, seq_len=SEQ, micro_batch=micro_batch, num_layers=2, **{"optimizer": None,
                                                                                      "steps": 1, **kw})


@pytest.mark.parametrize(("label", "config", "kw"), KINDS, ids=[k[0] for k in KINDS])
def test_micro_batch_interpolation_equals_a_third_trace(label: str, config: dict[str, Any],
                                                        kw: dict[str, Any]) -> None:
    """Traces at 2 and 3 sequences give the trace at 7 exactly, in every phase and category; the peak of the
    phase during backward moves between events as the micro-batch grows, which interpolating peaks would miss."""
    from fitcheck.torch_adapters.trace_batch import at_micro_batch

    two, three, seven = (_trace(config, b, **kw) for b in (2, 3, 7))
    got = at_micro_batch(two, 2, three, 3, 7)
    assert got is not None, label
    for phase, want in seven.phases.items():
        assert dict(got.phases[phase].by_category) == dict(want.by_category), (label, phase)
    assert got.final_grads == seven.final_grads
    back = at_micro_batch(three, 3, seven, 7, 2)  # and back down to 2 from 3 and 7
    assert back is not None and back.phases == two.phases
    _assert_events_interpolate(label, two, three, seven)


def _assert_events_interpolate(label: str, two: Any, three: Any, seven: Any) -> None:
    """The whole-run replay's one-step events (``step_traces.events_at``) at 7 from 2 and 3: the same allocations
    (serial, size, region, in order), the same storages freed, the same regions; and the allocator replay of
    those events gives the traced events' peaks."""
    from fitcheck.torch_adapters.allocator_replay import replay_events
    from fitcheck.torch_adapters.step_traces import events_at

    got = events_at(three, 3, two, 2, 7)
    assert got is not None, label
    assert [e for e in got.alloc_events if e[1] > 0] == [e for e in seven.alloc_events if e[1] > 0], label
    assert sorted(e for e in got.alloc_events if e[1] < 0) == sorted(e for e in seven.alloc_events if e[1] < 0)
    assert (got.region_starts, got.accumulated_after) == (seven.region_starts, seven.accumulated_after), label
    mine, traced = replay_events([got.alloc_events]), replay_events([seven.alloc_events])
    assert (mine.peak_allocated, mine.peak_reserved) == (traced.peak_allocated, traced.peak_reserved), label


def test_micro_batch_one_is_traced_not_interpolated() -> None:
    """A micro-batch of 1 runs other allocations (one copy fewer): it is never interpolated, and BatchTraces
    answers it with its own trace."""
    from fitcheck.torch_adapters.trace_batch import BatchTraces, at_micro_batch
    from fitcheck.torch_adapters.tracer_depth import trace_extrapolated

    kw = {"seq_len": SEQ, "optimizer": None, "steps": 1, "lora": LoraSpec(r=8)}
    one, two = _trace(LLAMA, 1, lora=LoraSpec(r=8)), _trace(LLAMA, 2, lora=LoraSpec(r=8))
    assert one.structure != two.structure and at_micro_batch(one, 1, two, 2, 5) is None
    traces = BatchTraces(LLAMA, kw)
    for b in (1, 2, 3):
        traces.result(b)
    assert traces.result(9).phases == trace_extrapolated(LLAMA, micro_batch=9, **kw).phases
    assert traces.result(1).phases == trace_extrapolated(LLAMA, micro_batch=1, **kw).phases
    assert sorted(traces.traced) == [1, 2, 3] and traces.interpolated == 1


@pytest.mark.parametrize(("label", "config", "kw"), KINDS, ids=[k[0] for k in KINDS])
def test_one_optimizer_free_step_gives_the_same_components(label: str, config: dict[str, Any],
                                                           kw: dict[str, Any]) -> None:
    """The default path traces one step without an optimizer: its activation, logits and temporary components
    equal those of two AdamW steps (the optimizer's bytes are the formulas' in both)."""
    from fitcheck.torch_adapters.trace_result import components_from_trace

    fast = components_from_trace(_trace(config, 2, **kw))
    full = components_from_trace(_trace(config, 2, **{**kw, "optimizer": "adamw_torch", "steps": 2}))
    assert fast == full, label


def test_pinned_path_shares_traces_across_optimizer_sharding_and_micro_batch() -> None:
    """One kind of step is traced at two micro-batches; changing the optimizer or the accumulation, or asking
    another micro-batch, traces nothing more, and the answer equals a direct trace (an accumulating one: the same
    traces seen as the later micro-step, ``trace_result.accumulating_step``)."""
    from fitcheck.core import estimate
    from fitcheck.torch_adapters import PinnedPath, trace_components

    spec = spec_from_config(LLAMA, seq=SEQ, batch=2, lora=LoraSpec(r=8), checkpointing=True, attn="eager")
    path = PinnedPath("always")
    path(spec)
    path(dataclasses.replace(spec, batch=dataclasses.replace(spec.batch, micro_batch=3)))
    assert len(path._traces) == 1
    (traces,) = path._traces.values()
    adam8 = dataclasses.replace(spec, optimizer=OptimizerSpec("adamw_bnb_8bit"),
                                batch=dataclasses.replace(spec.batch, micro_batch=6, grad_accum=4))
    got = path(adam8)
    assert len(path._traces) == 1 and sorted(traces.traced) == [2, 3] and traces.interpolated == 1
    assert got == estimate(adam8, activations=trace_components(adam8))


def test_failed_trace_answers_from_the_formula_not_pinned() -> None:
    """A trace that cannot run (here: a model class transformers cannot build from this config) never fails the
    default answer: the formula answers, pinned false, with the reason; ``--trace`` (strict) raises."""
    from fitcheck.core.activations import in_envelope
    from fitcheck.torch_adapters import PinnedPath

    spec = spec_from_config(LLAMA, seq=SEQ, batch=2, lora=LoraSpec(r=8), quant=QuantSpec(), checkpointing=True)
    broken = dataclasses.replace(spec, model=dataclasses.replace(
        spec.model, config={**LLAMA, "num_attention_heads": 5}))  # 128 not divisible by 5 heads
    assert not in_envelope(broken)
    report = PinnedPath("auto", can_trace=True)(broken)
    codes = {f.code for f in report.findings}
    assert "trace-failed" in codes and "not-pinned" in codes and not report.pinned
    assert not any(c.name == "activations.traced" for c in report.components)
    with pytest.raises(Exception):  # noqa: B017 - whatever transformers raises, --trace reports it
        PinnedPath("always")(broken)


def test_replays_share_one_step_traces_and_interpolate_micro_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole-run replays of one answer (``step_traces.one_step_traces``, in the path's trace cache): a step
    asked again is not traced again, a third micro-batch of 2 or more is interpolated from two (its events against a
    third trace: ``_assert_events_interpolate``), a micro-batch of 1 and a TRL step are traced."""
    from fitcheck.torch_adapters import tracer
    from fitcheck.torch_adapters.step_traces import one_step_traces

    calls: list[int] = []
    real = tracer.trace_step

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["micro_batch"])
        return real(*args, **kwargs)

    monkeypatch.setattr(tracer, "trace_step", counted)
    kw = {"seq_len": SEQ, "optimizer": None, "steps": 1, "lora": LoraSpec(r=8)}
    cache: dict[str, Any] = {}
    for b in (2, 3, 2, 7, 1):
        one_step_traces(cache, LLAMA, (1, 2), {**kw, "micro_batch": b})
    assert calls == [2, 2, 3, 3, 1, 1]  # 2 asked again and 7 interpolated: no trace
    # a TRL step (its fused head's token tiles are not affine in the micro-batch) is kept, never interpolated: here
    # its "traces" are the plain step's, which would interpolate
    plain = {b: one_step_traces(cache, LLAMA, (1,), {**kw, "micro_batch": b})[0] for b in (2, 3, 7)}
    monkeypatch.setattr(tracer, "trace_step", lambda *a, **k: calls.append(k["micro_batch"]) or plain[k["micro_batch"]])
    for b in (2, 3, 7, 3):
        one_step_traces(cache, LLAMA, (1,), {**kw, "micro_batch": b, "trl_head": ("logits",)})
    assert calls[6:] == [2, 3, 7]
