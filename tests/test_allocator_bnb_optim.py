"""The whole-run allocator replay of a run with a bitsandbytes optimizer, and of a QLoRA model with biases.

Before session 9 the tracer stepped every bitsandbytes name (``adamw_bnb_8bit``, ``paged_adamw_8bit``, ...) as
``torch.optim.AdamW``: fp32 states and a ``denom`` per parameter, whose LoRA run does not deepen (``DeepenError``:
the default answer fell back to the two-group gap, ``reserved-two-groups``). ``tracer_bnb_optim`` builds the
Trainer's bitsandbytes optimizer itself. Checked here against the real libraries: the Trainer's own optimizer
stepped on real CPU tensors holds the states the trace allocates; the composed run equals the real three-step
trace; the deepened run equals the real deeper trace; paged states of at least 1e5 elements are left out.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("bitsandbytes")

from tiny_models import LLAMA_8_LAYERS, REPLAY_LORA, REPLAY_NF4, REPLAY_STEP, family_config

from fitcheck.torch_adapters.allocator_compose import whole_run
from fitcheck.torch_adapters.allocator_deepen import canonical, deepen, frees_in_allocation_order
from fitcheck.torch_adapters.allocator_replay import replay_events
from fitcheck.torch_adapters.tracer import trace_step
from fitcheck.torch_adapters.tracer_optimizer import trace_optimizer

CONFIG = LLAMA_8_LAYERS
STEP, LORA, NF4 = REPLAY_STEP, REPLAY_LORA, REPLAY_NF4
LORA_RUN = {"lora": LORA, "mixed_precision": "bf16"}
QLORA_RUN = {"lora": LORA, "quant": NF4, "mixed_precision": "bf16", "checkpointing": True}


def _normal(events: object) -> object:
    return frees_in_allocation_order(canonical(events))  # type: ignore[arg-type]


def _composed(config: dict[str, object], extra: dict[str, object], optim: str,
              depth: int) -> tuple[list[tuple[int, int, str]], tuple[int, ...]]:
    step = trace_step(config, num_layers=depth, **{**STEP, **extra, "optimizer": None, "steps": 1})
    opt, starts = trace_optimizer(config, num_layers=depth, **{**STEP, **extra, "optimizer": optim, "steps": 3})
    return whole_run(step.alloc_events, step.region_starts, opt, starts, 3)


@pytest.fixture(autouse=True)
def _fresh_bnb_manager() -> Iterator[None]:
    """bitsandbytes' ``GlobalOptimManager`` is a process-wide singleton: a real Trainer with a bnb optimizer
    registers its embeddings' 32-bit overrides there (transformers ``Trainer.create_optimizer``), keyed by the
    module and by ``id(param)``, and a later bnb optimizer in the same process (another test) could match them.
    Each test here leaves it as a fresh process has it."""
    yield
    import bitsandbytes as bnb

    bnb.optim.GlobalOptimManager.get_instance().initialize()  # type: ignore[no-untyped-call]


def test_bnb_8bit_lora_run_composes_and_deepens_to_the_real_traces() -> None:
    """The reported failure (``adamw_bnb_8bit``, all-linear LoRA): composed at one and two layers, deepened to
    three, the real three-layer three-step trace. Fails on the old code (``DeepenError``: AdamW's states and
    ``denom`` loops align ambiguously)."""
    one, two = (_composed(CONFIG, LORA_RUN, "adamw_bnb_8bit", d) for d in (1, 2))
    built = deepen(one[0], two[0], 3, (one[1], two[1]))
    real3 = trace_step(CONFIG, num_layers=3, **{**STEP, **LORA_RUN, "optimizer": "adamw_bnb_8bit", "steps": 3})
    assert _normal(built) == _normal(real3.alloc_events)
    a, b = replay_events([built]), replay_events([real3.alloc_events])
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)


def _real_trainer_state_bytes(optim: str) -> int:
    """Bytes of the optimizer states the real Trainer's optimizer holds after one real CPU step (tiny Llama,
    two layers, every parameter trained, gradients of ones); the quantisation maps are left out (shared by all
    parameters, made on the CPU in ``__init__``: the trace does not see them either)."""
    import tempfile

    import torch
    import transformers

    from fitcheck.torch_adapters.tracer_build import build_model, reduced_config

    model = build_model(reduced_config(CONFIG, 2), dtype=torch.bfloat16, attn_implementation="sdpa",
                        checkpointing=False, fake=False)
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(output_dir=out, optim=optim, use_cpu=True, report_to=[],
                                              learning_rate=1e-3)
        trainer = transformers.Trainer(model=model, args=args)
        opt = trainer.create_optimizer()
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    seen: set[int] = set()
    total = 0
    for state in opt.state.values():
        for key, t in state.items():
            if isinstance(t, torch.Tensor) and not key.startswith("qmap") and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.untyped_storage().nbytes()
    return total


def test_bnb_8bit_states_are_the_real_trainers() -> None:
    """The first optimizer step of the trace allocates the bytes of states the real Trainer's ``adamw_bnb_8bit``
    holds after a real step: uint8 ``state1``/``state2`` with fp32 ``absmax`` per 256 elements, fp32 states for
    parameters under 4096 elements and for the embedding (the Trainer's 32-bit override). Fails on the old code
    (torch AdamW's fp32 states: 3.5x the bytes here)."""
    events, starts = trace_optimizer(CONFIG, num_layers=2, optimizer="adamw_bnb_8bit", steps=1)
    traced = sum(n for s, n, tag in events[starts[0]:starts[1]] if n > 0)
    assert traced == _real_trainer_state_bytes("adamw_bnb_8bit")


def test_paged_states_stay_outside_the_allocator() -> None:
    """``paged_adamw_8bit``: states of at least 1e5 elements are ``cudaMallocManaged`` (``F.get_paged``), never in
    torch's allocator: the trace counts every other state of ``adamw_bnb_8bit`` and none of those. The embedding
    and head (2048 x 64 = 131072 elements, fp32 states under the Trainer's override for the embedding) are paged
    here. Fails on the old code (both traced as torch AdamW, equal)."""
    wide = {**CONFIG, "vocab_size": 2048}
    plain, paged = (trace_optimizer(wide, num_layers=1, optimizer=o, steps=1)[0]
                    for o in ("adamw_bnb_8bit", "paged_adamw_8bit"))
    numel = 2048 * 64
    blocks = numel // 256
    # embedding: fp32 state1 + state2; lm_head: uint8 state1 + state2 and two fp32 absmax (allocated by torch)
    left_out = 2 * 4 * numel + 2 * numel
    assert sum(n for _, n, _ in plain if n > 0) - sum(n for _, n, _ in paged if n > 0) == left_out
    assert sorted(n for _, n, _ in paged if n > 0).count(4 * blocks) >= 2  # lm_head's absmax stay


def test_qwen2_qlora_bias_recast_happens_once() -> None:
    """Qwen2's q/k/v biases are fp32 after ``prepare_model_for_kbit_training``; bitsandbytes' ``Linear4bit.forward``
    replaces each with a bf16 copy in the first forward only. The composed run equals the real three-step trace.
    Fails on the old code (``ComposeError``: the step's bias frees repeated every step)."""
    qwen2 = family_config("qwen2", {k: v for k, v in CONFIG.items() if k not in ("model_type", "architectures")})
    events, starts = _composed(qwen2, QLORA_RUN, "adamw_torch_fused", 2)
    real = trace_step(qwen2, num_layers=2, **{**STEP, **QLORA_RUN, "optimizer": "adamw_torch_fused", "steps": 3})
    assert _normal(events) == _normal(real.alloc_events)
    assert starts == real.region_starts
    frees = [s for s, n, tag in real.alloc_events if n < 0 and tag == "setup" and s > 0]
    assert frees  # the re-cast is in the real trace
