"""The whole run's allocations composed from one optimizer-free step and the optimizer traced alone equal a real
multi-step trace, and the fast whole-run replay the default path runs gives the slow replay's reserved bytes.

``allocator_compose.whole_run`` repeats the activation trace's step (the one the headline already ran) and puts
the optimizer's own events (``tracer_optimizer.trace_optimizer``) between backward and ``zero_grad``. Checked
against ``trace_step(steps=3)`` with the optimizer (what ``benchmarks/gpu_truth_step.py`` runs on the GPU), event
for event up to storage renaming and the order of frees inside a run of consecutive frees (an order the caching
allocator's state does not depend on: ``tests/test_allocator_deepen.py``). None of these modules existed before
session 8.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from dataclasses import replace

from tiny_models import LLAMA_8_LAYERS, REPLAY_LORA, REPLAY_NF4, REPLAY_STEP

from benchmarks.cpu_truth import Row, spec_for
from fitcheck.core.caching import AllocatorConf
from fitcheck.spec import DeviceType, LoraSpec, TrainingSpec
from fitcheck.torch_adapters.allocator_compose import ComposeError, whole_run
from fitcheck.torch_adapters.allocator_deepen import DeepenError, canonical, deepen, frees_in_allocation_order
from fitcheck.torch_adapters.allocator_replay import replay_events, replay_steady_state
from fitcheck.torch_adapters.allocator_whole_run import replay_whole_run
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_optimizer import trace_optimizer
from fitcheck.torch_adapters.tracer_trainer_optim import trainer_param_groups

CONFIG = LLAMA_8_LAYERS
STEP, LORA, NF4 = REPLAY_STEP, REPLAY_LORA, REPLAY_NF4
KINDS = {
    "bf16": {},
    "checkpointing": {"checkpointing": True},
    "fp32-autocast": {"dtype": "float32", "mixed_precision": "bf16"},
    "lora": {"lora": LORA, "mixed_precision": "bf16"},
    "qlora-checkpointing": {"lora": LORA, "quant": NF4, "mixed_precision": "bf16", "checkpointing": True},
}
CASES = [(k, "adamw_torch_fused") for k in KINDS] + [("lora", "adamw_torch"), ("checkpointing", "sgd")]


def _normal(events: object) -> object:
    return frees_in_allocation_order(canonical(events))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind, optim", CASES, ids=[f"{k}-{o}" for k, o in CASES])
def test_composed_run_is_the_multi_step_trace(kind: str, optim: str) -> None:
    extra = KINDS[kind]
    real = trace_step(CONFIG, num_layers=2, **{**STEP, **extra, "optimizer": optim, "steps": 3})
    step = trace_step(CONFIG, num_layers=2, **{**STEP, **extra, "optimizer": None, "steps": 1})
    opt, opt_starts = trace_optimizer(CONFIG, num_layers=2, **{**STEP, **extra, "optimizer": optim, "steps": 3})
    events, starts = whole_run(step.alloc_events, step.region_starts, opt, opt_starts, 3)
    assert len(events) == len(real.alloc_events)
    assert _normal(events) == _normal(real.alloc_events)
    assert starts == real.region_starts
    conf = AllocatorConf()
    a, b = replay_events([events], conf), replay_events([real.alloc_events], conf)
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)


def test_compose_refuses_traces_without_the_regions() -> None:
    step = trace_step(CONFIG, num_layers=1, **{**STEP, "optimizer": None, "steps": 1})
    opt, opt_starts = trace_optimizer(CONFIG, num_layers=1, optimizer="adamw_torch_fused", steps=2)
    with pytest.raises(ComposeError):
        whole_run(step.alloc_events, step.region_starts, opt, opt_starts, 3)  # two optimizer steps, three asked
    with pytest.raises(ComposeError):
        whole_run(step.alloc_events, step.region_starts[:-1], opt, opt_starts, 2)


def _spec(**kw: object) -> TrainingSpec:
    spec = spec_for(Row("compose", CONFIG, seq=32, batch=2, dtype="bfloat16", optim="adamw_torch_fused", **kw))
    return replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))


@pytest.mark.parametrize("kw", [{"ckpt": True}, {"lora": LORA, "mp": "bf16"},
                                {"lora": LORA, "quant": NF4, "mp": "bf16", "ckpt": True}],
                         ids=["checkpointing", "lora", "qlora-checkpointing"])
def test_fast_whole_run_equals_the_full_depth_trace(kw: dict[str, object]) -> None:
    """Eight layers: one- and two-layer activation traces + the optimizer alone, composed and deepened, replay to
    the peaks of the real eight-layer three-step trace (the slow replay ``--reserved_replay`` ran in session 7)."""
    spec = _spec(**kw)
    fast, slow = replay_whole_run(spec), replay_steady_state(spec)
    assert (fast.peak_allocated, fast.peak_reserved, fast.persistent) == (
        slow.peak_allocated, slow.peak_reserved, slow.persistent)


def test_param_groups_are_the_trainers() -> None:
    """The optimizer's two groups, built without importing ``transformers.trainer``, are Trainer's."""
    import transformers

    from fitcheck.torch_adapters.tracer_build import build_model, reduced_config

    for lora in (None, LORA):
        import torch

        model = build_model(reduced_config(CONFIG, 2), dtype=torch.float32, attn_implementation="sdpa",
                            checkpointing=False, lora=lora, fake=False)
        decay = set(transformers.Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = trainer_param_groups(model)
        assert [id(p) for p in groups[0]["params"]] == [id(p) for n, p in named if n in decay]
        assert [id(p) for p in groups[1]["params"]] == [id(p) for n, p in named if n not in decay]


QV = LoraSpec(r=8)  # peft's default targets for Llama: q_proj, v_proj


def _composed(extra: dict[str, object], optim: str, depth: int) -> tuple[list[tuple[int, int, str]], tuple[int, ...]]:
    step = trace_step(CONFIG, num_layers=depth, **{**STEP, **extra, "optimizer": None, "steps": 1})
    opt, opt_starts = trace_optimizer(CONFIG, num_layers=depth, **{**STEP, **extra, "optimizer": optim, "steps": 3})
    return whole_run(step.alloc_events, step.region_starts, opt, opt_starts, 3)


@pytest.mark.parametrize("extra, optim", [({"lora": QV}, "adamw_torch"), ({"lora": LORA}, "adamw_torch_fused"),
                                          ({"lora": LORA}, "adamw_torch")],
                         ids=["lora-qv-adamw", "lora-fused", "lora-adamw-foreach"])
def test_composed_runs_deepen_to_the_deeper_trace(extra: dict[str, object], optim: str) -> None:
    """Composed at one and two layers, deepened to three: the real three-layer three-step trace. The non-fused
    AdamW frees a parameter's ``denom`` while stepping the next one; ``difflib`` cuts the layer's block around that
    free and ``allocator_deepen`` joins it again (``_merged``: fails without it). All-linear LoRA under AdamW on
    CUDA steps the foreach path (``make_trainer_optimizer``), as torch does there; the single-tensor path the old
    code traced did not deepen (``DeepenError``)."""
    one, two = _composed(extra, optim, 1), _composed(extra, optim, 2)
    built = deepen(one[0], two[0], 3, (one[1], two[1]))
    real = trace_step(CONFIG, num_layers=3, **{**STEP, **extra, "optimizer": optim, "steps": 3}).alloc_events
    assert _normal(built) == _normal(real)
    a, b = replay_events([built]), replay_events([real])
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)


def test_what_does_not_deepen_falls_back_with_the_reason() -> None:
    """All-linear LoRA under AdamW's single-tensor path (a CPU step) does not deepen (its optimizer's state and
    update loops align ambiguously): ``DeepenError``, never a wrong sequence. A CUDA run steps the foreach path,
    which deepens (``tests/test_allocator_bnb_optim.py``). A stack that is not whole repeating groups (Gemma-3-1B:
    26 layers, a 6-layer sliding/full period) does not deepen either; the default path then uses the two-group gap
    and says so (``reserved-two-groups``)."""
    from fitcheck.torch_adapters import PinnedPath

    extra = {"lora": LORA, "mixed_precision": "bf16", "cuda_kernels": False}
    one, two = _composed(extra, "adamw_torch", 1), _composed(extra, "adamw_torch", 2)
    with pytest.raises(DeepenError):
        deepen(one[0], two[0], 3, (one[1], two[1]))
    period = ["full_attention", "full_attention", "sliding_attention"]
    config = {**CONFIG, "num_hidden_layers": 7, "layer_types": (period * 3)[:7]}
    spec = spec_for(Row("compose", config, seq=32, batch=2, dtype="bfloat16", optim="adamw_torch_fused"))
    spec = replace(spec, hardware=replace(spec.hardware, device_type=DeviceType.CUDA))
    report = PinnedPath("always")(spec)
    said = [f.message for f in report.findings if f.code == "reserved-two-groups"]
    assert said and "DeepenError" in said[0]
