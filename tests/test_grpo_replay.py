"""Issue 19: the whole-run allocator replay describes TRL 1.16's GRPOTrainer run (its training part).

Before, ``run_scope.not_replayed`` answered every GRPO run with "the grpo trainer's step (generation's KV cache, the
reference / old-policy log-prob passes)" and the replay, where forced, composed the plain Trainer's step: no
reference copy, no log-prob pre-pass, full-vocabulary logits. Now the GRPO micro-step is traced as the trainer runs
it (``torch_adapters/tracer_grpo.py``: the pre-pass after each generation, tagged and kept by
``allocator_compose.whole_run`` in the generating passes only, then the policy's fused forward and the dapo loss);
``generate`` itself stays the formula's generation phase. The real GRPOTrainer vs the replay on CPU is
``benchmarks/trl_replay.py`` (its ``grpo_rows`` in ``benchmarks/data/trl_replay_cpu.json``). Each test failed on main.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("trl")

from tiny_models import LLAMA_8_LAYERS
from trl_replay_rows import recorded_rows, setup_bytes

from fitcheck.spec import TrainerKind, TrainerSpec, TrainingSpec

TINY = {**LLAMA_8_LAYERS, "num_hidden_layers": 2}
OUTPUTS = ("log_probs", "entropy")  # GRPOTrainer's policy head (core.trainers registry)


def test_recorded_replay_matches_the_real_grpo_trainer() -> None:
    """The recorded three-step runs of the real GRPOTrainer (full fine-tune with beta 0 and with the reference copy,
    LoRA with the adapters-off pass, without checkpointing, accumulation 2, steps_per_generation 2): the replay's
    allocated peak within 0.5 % of the real run's live tensors outside generation, over the run and in the last
    step; generation stays below that peak (the formula's phase, not replayed); the plain Trainer's step replayed
    instead (what main composed) is off by more than 10 %."""
    rows = recorded_rows("grpo_rows")
    assert len(rows) >= 6, sorted(rows)
    for case, row in rows.items():
        real, replay = row["real"], row["replay"]
        assert replay["peak"] == pytest.approx(real["training"], rel=0.005), case
        assert replay["last_step"] == pytest.approx(real["training_last"], rel=0.005), case
        assert real["generation"] < real["training"] and real["peak"] == real["training"], case
        assert abs(row["plain_replay"]["peak"] / real["peak"] - 1) > 0.10, case


def _case(name: str = "grpo", **kwargs: Any) -> Any:
    from benchmark_module import load_benchmark

    truth = load_benchmark("trl_truth")
    extra = {"num_generations": 4, **kwargs.pop("extra", {})}
    return truth.Case(name, TrainerKind.GRPO, batch=4, length=32, prompt=16, extra=extra, **kwargs)


def _spec(case: Any) -> TrainingSpec:
    from benchmark_module import load_benchmark

    spec: TrainingSpec = load_benchmark("trl_truth").spec_for(case)
    return spec


def test_grpo_run_scope() -> None:
    """beta 0 and 0.04, full and LoRA, accumulation and steps_per_generation are replayed; vLLM stays out, named."""
    from benchmark_module import load_benchmark

    from fitcheck.torch_adapters import not_replayed, replayed_run

    lora = load_benchmark("trl_truth").TRL_LORA
    for case in (_case(), _case(extra={"beta": 0.04}), _case(lora=lora, extra={"beta": 0.04}), _case(ckpt=False),
                 _case(extra={"gradient_accumulation_steps": 2}), _case(extra={"steps_per_generation": 2})):
        spec = _spec(case)
        assert replayed_run(spec) and not_replayed(spec) == "", case
    full = _spec(_case())
    vllm = dataclasses.replace(full, trainer=dataclasses.replace(full.trainer, use_vllm=True))
    assert not replayed_run(vllm) and "vLLM" in not_replayed(vllm)


def test_grpo_step_plan() -> None:
    """``run_trace_kwargs``: the policy step at 4 x (16 + 32) with GRPO's head, and the plan of ``tracer_grpo``:
    no reference at beta 0, the copy / the adapters-off pass at beta 0.04, one pre-pass chunk per micro-batch of
    the generation batch (steps_per_generation defaults to the accumulation), the old-policy pass where the
    accumulation is not a multiple of steps_per_generation (``grpo_trainer.py _generate_and_score_completions``)."""
    from benchmark_module import load_benchmark

    from fitcheck.torch_adapters import run_trace_kwargs

    lora = load_benchmark("trl_truth").TRL_LORA
    kwargs = run_trace_kwargs(_spec(_case()))
    assert (kwargs["micro_batch"], kwargs["seq_len"], kwargs["trl_head"]) == (4, 48, OUTPUTS)
    assert kwargs["trl_grpo"] == ("none", 16, 0.0, 1, False, 0, 1)
    assert run_trace_kwargs(_spec(_case(extra={"beta": 0.04})))["trl_grpo"].reference == "model"
    assert run_trace_kwargs(_spec(_case(lora=lora, extra={"beta": 0.04})))["trl_grpo"].reference == "adapters"
    accum = run_trace_kwargs(_spec(_case(extra={"gradient_accumulation_steps": 2})))["trl_grpo"]
    assert (accum.steps_per_generation, accum.old_pass, accum.grad_accum) == (2, False, 2)
    per_generation = run_trace_kwargs(_spec(_case(extra={"steps_per_generation": 2})))["trl_grpo"]
    assert (per_generation.steps_per_generation, per_generation.old_pass) == (2, True)
    plain = run_trace_kwargs(dataclasses.replace(_spec(_case()), trainer=TrainerSpec()))
    assert "trl_grpo" not in plain and "trl_head" not in plain


def test_pre_pass_runs_in_the_generating_passes_only() -> None:
    """``whole_run`` keeps the step's ``prepass`` storages in the passes that generate: every
    ``steps_per_generation`` micro-batches of the trainer's counter (``_prepare_inputs``), the replay's passes per
    step standing for the first ones of the accumulation."""
    from fitcheck.torch_adapters.allocator_compose import PREPASS, whole_run
    from fitcheck.torch_adapters.tracer_grpo import generating_passes

    step = [(0, 8, "setup"), (1, 4, PREPASS), (1, -4, PREPASS), (2, 16, "forward"), (3, 2, "forward_head"),
            (4, 1, "backward_start"), (5, 32, "backward"), (2, -16, "backward"), (3, -2, "backward"),
            (4, -1, "backward"), (5, -32, "zero_grad")]
    starts = (1, 4, 5, 6, 10, 10, 11)  # forward, forward_head, backward_start, backward, optimizer, zero_grad, done
    accumulated = [(5, 5, 1)]  # the gradient (5) is added into .grad right after it is made

    def prepasses(accum: int, per_generation: int) -> int:
        passes = min(accum, 4)  # allocator_compose.replayed_micro_batches
        events, _ = whole_run(step, starts, [], (0,) * 7, 3, passes, accumulated,
                              generating_passes(accum, per_generation))
        return sum(1 for _, n, tag in events if tag.removesuffix("_warmup") == PREPASS and n > 0)

    assert prepasses(1, 1) == 3  # every step generates
    assert prepasses(2, 1) == 6  # every micro-batch generates (steps_per_generation 1)
    assert prepasses(2, 2) == 3  # the first of each step's two micro-batches
    assert prepasses(1, 2) == 2  # steps 1 and 3 of three (steps_per_generation 2, no accumulation)
    assert prepasses(8, 8) == 3  # accumulation 8 replayed as 4 passes: still once per step


def test_traced_grpo_step_keeps_its_reference_and_pre_pass() -> None:
    """The traced micro-step, beta 0.04 full fine-tune: the setup holds the reference copy (the policy's bytes twice,
    with the buffered batch's few KiB), the pre-pass's storages carry the ``prepass`` tag and open no region (six
    per step and ``done``); the fake trace and the same step on real CPU tensors replay to the same peak (the
    attention mask left out as transformers skips it for a batch of one length: a fake tensor never skips it)."""
    from fitcheck.torch_adapters.allocator_compose import PREPASS
    from fitcheck.torch_adapters.allocator_replay import replay_events
    from fitcheck.torch_adapters.tracer import trace_step
    from fitcheck.torch_adapters.tracer_trl_plans import GrpoPlan

    step: dict[str, Any] = {"seq_len": 24, "micro_batch": 2, "dtype": "bfloat16", "mixed_precision": "bf16",
                            "checkpointing": False, "optimizer": None, "steps": 1, "trl_head": OUTPUTS,
                            "trl_grpo": GrpoPlan("model", 8, 0.04, 1, False, 0, 1)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fake = trace_step(TINY, **step)
        real = trace_step(TINY, fake=False, **step)
    from fitcheck.readers import inventory_from_config

    params = 2 * inventory_from_config(TINY, "tiny", "tests").total_params  # bf16
    setup = setup_bytes(fake)
    assert setup == pytest.approx(2 * params, abs=8192)  # + rotary buffers, ids, the buffered batch
    assert any(tag == PREPASS for _, _, tag in fake.alloc_events) and len(fake.region_starts) == 7
    a, b = replay_events([fake.alloc_events]), replay_events([real.alloc_events])
    assert a.peak_allocated == pytest.approx(b.peak_allocated, rel=0.005)
