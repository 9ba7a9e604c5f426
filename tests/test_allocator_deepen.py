"""The full-depth allocation sequence built from one and two layer groups equals a real deeper fake trace.

The caching-allocator replay needs every layer's events (the gap does not extrapolate linearly in depth:
``fitcheck/torch_adapters/allocator_replay.py``); ``allocator_deepen.deepen`` builds them from the two traces the
tracer runs anyway. Checked against ``trace_step`` of the real deeper model (tiny Llama, three steps with fused
AdamW as ``benchmarks/gpu_truth_step.py`` runs them), event for event up to storage renaming, and the replay of
both through ``fitcheck.core.caching`` gives the same peaks.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiny_models import LLAMA_8_LAYERS

from fitcheck.core.caching import AllocatorConf
from fitcheck.spec import Dtype, LoraSpec, QuantSpec
from fitcheck.torch_adapters.allocator_deepen import (
    DeepenError,
    canonical,
    deepen,
    frees_in_allocation_order,
    live_at_end,
)
from fitcheck.torch_adapters.allocator_replay import replay_events
from fitcheck.torch_adapters.tracer import trace_step

CONFIG = LLAMA_8_LAYERS
STEP = {"seq_len": 32, "micro_batch": 2, "optimizer": "adamw_torch_fused", "steps": 3, "cuda_kernels": True}


@pytest.mark.parametrize("extra", [{}, {"checkpointing": True}, {"dtype": "float32", "mixed_precision": "bf16"}],
                         ids=["bf16", "checkpointing", "fp32-autocast"])
def test_deepened_sequence_is_the_deeper_trace(extra: dict[str, object]) -> None:
    runs = {d: trace_step(CONFIG, num_layers=d, **{**STEP, **extra}) for d in (1, 2, 3)}
    events = {d: r.alloc_events for d, r in runs.items()}
    for starts in (((), ()), (runs[1].region_starts, runs[2].region_starts)):
        built = deepen(events[1], events[2], 3, starts)
        assert len(built) == len(events[3])
        assert canonical(built) == canonical(events[3])
    conf = AllocatorConf()
    real, synth = replay_events([events[3]], conf), replay_events([built], conf)
    assert (synth.peak_allocated, synth.peak_reserved) == (real.peak_allocated, real.peak_reserved)


LORA = LoraSpec(r=8, alpha=16, target_modules=("all-linear",))
NF4 = QuantSpec(bits=4, quant_type="nf4", double_quant=True, compute_dtype=Dtype.BFLOAT16)


@pytest.mark.parametrize("extra", [
    {"lora": LORA, "mixed_precision": "bf16"},
    {"lora": LORA, "quant": NF4, "mixed_precision": "bf16", "checkpointing": True},
], ids=["lora", "qlora-checkpointing"])
def test_adapter_runs_deepen_to_the_deeper_trace(extra: dict[str, object]) -> None:
    """LoRA and QLoRA: the built sequence equals the real depth-3 trace up to the order of frees inside each run
    of consecutive frees, an order the allocator's state does not depend on (``frees_in_allocation_order``), and
    replays to the same peaks. Fails on the code before session 8: LoRA's last layer's optimizer states and
    ``zero_grad``'s first frees were one inserted block (DeepenError at Llama-3.2-1B width, a wrong sequence here),
    and QLoRA's end-of-forward frees come in an order that differs with the depth."""
    runs = {d: trace_step(CONFIG, num_layers=d, **{**STEP, **extra}) for d in (1, 2, 3)}
    built = deepen(runs[1].alloc_events, runs[2].alloc_events, 3, (runs[1].region_starts, runs[2].region_starts))
    three = runs[3].alloc_events
    assert frees_in_allocation_order(canonical(built)) == frees_in_allocation_order(canonical(three))
    conf = AllocatorConf()
    real, synth = replay_events([three], conf), replay_events([built], conf)
    assert (synth.peak_allocated, synth.peak_reserved) == (real.peak_allocated, real.peak_reserved)


def test_free_runs_reordered_replay_the_same() -> None:
    """The caching allocator ends a run of frees in the same state whatever their order: the normal form the
    adapter test compares in loses nothing the replay sees (here: frees reversed in every run of a real trace)."""
    events = list(trace_step(CONFIG, num_layers=2, **{**STEP, "checkpointing": True}).alloc_events)
    reversed_runs: list[tuple[int, int, str]] = []
    run: list[tuple[int, int, str]] = []
    for ev in [*events, (-1, 1, "end")]:
        if ev[1] > 0:
            reversed_runs += run[::-1]
            run = []
            reversed_runs.append(ev)
        else:
            run.append(ev)
    reversed_runs.pop()
    assert reversed_runs != events
    conf = AllocatorConf()
    a = replay_events([events], conf)
    b = replay_events([reversed_runs], conf)
    assert (a.peak_allocated, a.peak_reserved) == (b.peak_allocated, b.peak_reserved)


def test_deepen_refuses_what_is_not_an_insertion() -> None:
    one = [(0, 1024, "setup"), (1, 2048, "forward"), (1, -2048, "forward")]
    two = [(0, 1024, "setup"), (1, 4096, "forward"), (1, -4096, "forward")]  # a changed size, not a new block
    with pytest.raises(DeepenError):
        deepen(one, two, 4)
    with pytest.raises(DeepenError):
        deepen(one, one, 1)



def test_a_hash_ordered_free_run_deepens_to_frees_that_pair() -> None:
    """fp32 LoRA weights under bf16 autocast: their bf16 casts (all one size where q, k and v are) stay in the
    autocast cache until autocast exits and are then freed in the hash order of ``cached_casts`` (keyed by
    ``TensorImpl*``: pytorch ``aten/src/ATen/autocast_mode.cpp``), one run of frees that mixes the layers in an
    order that differs per trace and per process. The depth-8 sequence built from one and two layers frees only
    what it holds and leaves live what each added layer adds (the second layer's growth over the first: equal to
    the real deeper traces, the tests above). Fails before session 15: ``difflib`` paired the run's frees by
    position, so added layers freed another layer's cast twice and kept one of their own (here 13 of the 1 KiB
    casts; SWIFT-1's 32-layer Qwen-7B LoRA step: 5.6 MiB a step that ``replay_whole_lengths`` never freed)."""
    config = {**CONFIG, "num_key_value_heads": CONFIG["num_attention_heads"]}  # q, k, v casts of one size, as 7B's
    step = {**STEP, "steps": 1, "optimizer": "adamw_torch", "checkpointing": True, "mixed_precision": "bf16",
            "lora": LoraSpec(r=8, alpha=32, dropout=0.05, target_modules=("q_proj", "k_proj", "v_proj"))}
    one, two = (trace_step(config, num_layers=d, **step) for d in (1, 2))
    built = deepen(one.alloc_events, two.alloc_events, 8, (one.region_starts, two.region_starts))
    (n1, b1, _), (n2, b2, _) = live_at_end(one.alloc_events), live_at_end(two.alloc_events)
    assert live_at_end(built) == (n2 + 6 * (n2 - n1), b2 + 6 * (b2 - b1), 0)  # (live storages, bytes, unpaired)


def test_mlp_only_lora_deepens_past_the_first_layer() -> None:
    """LoRA on the MLP only (peft MetaMathQA's ``lora-rank10-target-mlp``): layer 0's attention input needs no
    gradient, so its rotary ``q * cos`` saves nothing and the one-layer trace frees ``cos``/``sin`` at the end of the
    forward, where deeper traces keep them to layer 1's backward. The one- and two-layer traces do not deepen
    (``DeepenError``: the default path fell back to the two-group gap); ``deepen_past_first`` builds the four-layer
    sequence from two and three layers, equal to the real four-layer trace up to the order of each run of frees, with
    the same peaks. Fails before session 16 (no ``deepen_past_first``; the row's whole run was not replayed)."""
    from fitcheck.torch_adapters.allocator_deepen import deepen_past_first

    lora = LoraSpec(r=10, alpha=20, target_modules=("up_proj", "gate_proj", "down_proj"))
    step = {**STEP, "steps": 1, "optimizer": "adamw_torch", "dtype": "bfloat16", "lora": lora}
    runs = {d: trace_step(CONFIG, num_layers=d, **step) for d in (1, 2, 3, 4)}
    with pytest.raises(DeepenError):
        deepen(runs[1].alloc_events, runs[2].alloc_events, 4, (runs[1].region_starts, runs[2].region_starts))
    built = deepen_past_first(lambda groups: (runs[groups].alloc_events, runs[groups].region_starts), 4)
    four = runs[4].alloc_events
    assert frees_in_allocation_order(canonical(built)) == frees_in_allocation_order(canonical(four))
    conf = AllocatorConf()
    real, synth = replay_events([four], conf), replay_events([built], conf)
    assert (synth.peak_allocated, synth.peak_reserved) == (real.peak_allocated, real.peak_reserved)
