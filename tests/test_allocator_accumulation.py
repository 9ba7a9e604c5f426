"""Gradient accumulation in the whole-run replay: ``gradient_accumulation_steps`` forward and backward passes per
optimizer step, the later ones allocating each gradient, adding it into ``.grad`` in place and freeing it (torch
2.13 ``accumulate_grad.h``), checked against a real accumulating trace and a real Trainer.

Before session 11 ``allocator_compose.whole_run`` composed one pass per step whatever the accumulation (issue 19):
the composed run's peak allocated missed the first pass's gradients alive during the later passes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dataclasses import replace
from pathlib import Path

from tiny_models import LLAMA_8_LAYERS, REPLAY_STEP

from benchmarks.cpu_truth import Row, spec_for
from fitcheck.spec import DeviceType, TrainingSpec
from fitcheck.torch_adapters.allocator_compose import whole_run
from fitcheck.torch_adapters.allocator_deepen import canonical, frees_in_allocation_order
from fitcheck.torch_adapters.allocator_replay import replay_events, replay_steady_state
from fitcheck.torch_adapters.allocator_whole_run import replay_whole_run
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_optimizer import trace_optimizer

CASES = {"bf16-tied": {}}
TIED = {**LLAMA_8_LAYERS, "tie_word_embeddings": True}  # the lm_head's gradient waits for the embedding's


@pytest.mark.parametrize("kind", list(CASES))
def test_composed_accumulation_is_the_accumulating_trace(kind: str) -> None:
    """Two passes per step, two steps: the composed run is the real trace, event for event up to storage renaming
    and the order inside a run of frees, and replays to its peaks; one pass per step (the old composition) misses
    the first pass's gradients."""
    extra = {**REPLAY_STEP, **CASES[kind]}
    real = trace_step(TIED, num_layers=2, **{**extra, "optimizer": "adamw_torch_fused", "steps": 2,
                                                        "grad_accum": 2})
    step = trace_step(TIED, num_layers=2, **{**extra, "optimizer": None, "steps": 1})
    opt, opt_starts = trace_optimizer(TIED, num_layers=2, **{**extra, "optimizer": "adamw_torch_fused",
                                                                       "steps": 2})
    events, starts = whole_run(step.alloc_events, step.region_starts, opt, opt_starts, 2, 2, step.accumulated_after)
    assert _normal(events) == _normal(real.alloc_events) and starts == real.region_starts
    a, b = replay_events([events]), replay_events([real.alloc_events])
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)
    old = replay_events([whole_run(step.alloc_events, step.region_starts, opt, opt_starts, 2)[0]])
    assert old.peak_allocated < b.peak_allocated


def _normal(events: object) -> object:
    return frees_in_allocation_order(canonical(events))  # type: ignore[arg-type]


def _spec(**kw: object) -> TrainingSpec:
    spec = spec_for(Row("accum", LLAMA_8_LAYERS, seq=32, batch=2, dtype="bfloat16", optim="adamw_torch_fused",
                        **kw))
    return replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))


def test_fast_accumulating_run_equals_the_full_depth_trace() -> None:
    """Eight layers, two passes per step: composed at one and two layers and deepened, the peaks of the real
    eight-layer accumulating trace."""
    spec = _spec(ckpt=True)
    spec = replace(spec, batch=replace(spec.batch, grad_accum=2))
    fast, slow = replay_whole_run(spec), replay_steady_state(spec)
    assert (fast.peak_allocated, fast.peak_reserved) == (slow.peak_allocated, slow.peak_reserved)


def test_passes_past_the_cap_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replays compose at most ``MAX_REPLAYED_MICRO_BATCHES`` passes per step: every pass after the first
    allocates, adds and frees the same gradients from the same live set, so five passes replay to the peaks of
    four (and a 64-step accumulation no longer takes the difflib alignment minutes). Five, not eight: one pass past
    the cap is what could differ, and the uncapped replay's alignment is quadratic in its passes (11 s at eight)."""
    from fitcheck.torch_adapters import allocator_compose

    spec = _spec(ckpt=True)
    spec = replace(spec, batch=replace(spec.batch, grad_accum=5))
    assert allocator_compose.replayed_micro_batches(5) == allocator_compose.MAX_REPLAYED_MICRO_BATCHES == 4
    capped = replay_whole_run(spec)
    monkeypatch.setattr(allocator_compose, "MAX_REPLAYED_MICRO_BATCHES", 5)
    every = replay_whole_run(spec)
    assert (capped.peak_allocated, capped.peak_reserved) == (every.peak_allocated, every.peak_reserved)


def test_seq_lengths_replay_their_accumulation_passes() -> None:
    """``--seq_lengths`` replays each step with its accumulation window's passes, as the run without lengths does
    (``replay_whole_lengths`` composed one pass per step before session 21): two steps at the run's length replay
    to the peak allocated of ``replay_whole_run``, above the one-pass run's by the first pass's gradients alive
    during the second."""
    from fitcheck.torch_adapters.allocator_replay import replay_lengths
    from fitcheck.torch_adapters.allocator_whole_run import replay_whole_lengths

    spec = spec_for(Row("accum", {**LLAMA_8_LAYERS, "num_hidden_layers": 2}, seq=32, batch=2, dtype="bfloat16",
                        optim="adamw_torch_fused"))
    spec = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))
    accum = replace(spec, batch=replace(spec.batch, grad_accum=2))
    lengths = (spec.batch.seq_len, spec.batch.seq_len)
    whole = replay_whole_run(accum)
    replayed = replay_whole_lengths(accum, lengths)[0]
    assert replayed.peak_allocated == whole.peak_allocated > replay_whole_lengths(spec, lengths)[0].peak_allocated
    # the two-group fallback (a run the whole-run replay does not describe) runs the passes too
    assert replay_lengths(accum, lengths[:1])[0].peak_allocated > replay_lengths(spec, lengths[:1])[0].peak_allocated


def test_the_real_trainer_accumulates_in_place_and_sets_to_none_after_the_step(tmp_path: Path) -> None:
    """What the composition assumes of transformers 5.23 ``Trainer`` and torch 2.13 ``AccumulateGrad``, on a real
    Trainer with ``gradient_accumulation_steps=2``: every pass but the first of a step starts with every gradient
    alive, and the gradient it adds lands in the same storage (in place: ``variable_grad += new_grad``); the
    first pass of each step starts with none (``model.zero_grad()`` after ``optimizer.step()``, set to None), and
    its gradient is the tensor backward made (stolen: no copy, ``_accumulated``)."""
    import torch
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(Path(__file__).resolve().parents[1] / "examples" / "tiny-llama")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    alive: list[int] = []  # gradients alive when each pass's forward starts
    where: list[dict[int, int]] = []  # each pass: parameter -> its .grad's storage after AccumulateGrad

    def pass_starts(*_args: object) -> None:
        alive.append(sum(p.grad is not None for p in params))
        where.append({})

    def accumulated(p: torch.Tensor) -> None:
        assert p.grad is not None
        where[-1][id(p)] = p.grad.untyped_storage().data_ptr()

    model.register_forward_pre_hook(pass_starts)
    for p in params:
        p.register_post_accumulate_grad_hook(accumulated)
    data = torch.randint(0, cfg.vocab_size, (8, 16), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": r, "labels": r} for r in data]
    args = transformers.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                          gradient_accumulation_steps=2, use_cpu=True, report_to="none",
                                          save_strategy="no", logging_strategy="no", disable_tqdm=True)
    transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    assert alive == [0, len(params)] * 2
    assert all(len(w) == len(params) for w in where)
    assert where[1] == where[0] and where[3] == where[2]
