"""Adapters that need torch: around the pure core, never inside it. Imported lazily (PEP 562).

- :mod:`.meta_inventory`: any transformers architecture built on the meta device -> ``ModelInventory``;
- :mod:`.tracer` (+ ``tracer_build``, ``tracer_patches``, ``tracer_quant``, ``tracer_recorder``): one
  training step under ``FakeTensorMode`` (its arguments from a spec: ``trace_arguments``), read as activation
  components (``trace_result``);
- :mod:`.allocator_replay`: the traced step's own allocations and frees replayed through the caching allocator
  (the step's trace arguments and the load's warm-up block: ``replay_step_args``; the whole run:
  ``allocator_whole_run``, where ``allocator_compose`` composes the steps and the optimizer,
  ``allocator_deepen`` deepens them, ``deepspeed_run_events`` rewrites it into one DeepSpeed rank's run,
  ``fsdp2_run_events`` into one FSDP2 rank's, ``fsdp1_run_events`` into one FSDP1 rank's);
- :mod:`.differential`: the formula-vs-trace grid (cells, specs, comparison) the benchmarks and tests run;
- :mod:`.live_model`: facts of a loaded model (dtypes, adapters, quantized layers, device map);
- :mod:`.live_tracker`: live-tensor peak of a real step (a dispatch mode);
- :mod:`.device_map`, :mod:`.device_map_check`: accelerate's ``infer_auto_device_map`` and its findings;
  :mod:`.device_map_split`: one estimate per GPU of a multi-GPU map (naive model parallelism);
- :mod:`.peft_build`, :mod:`.peft_adapters`: a PEFT method other than LoRA built by peft itself (config, wrapped
  model; its tensors);
- :mod:`.trl_config_check`: TRL's own config classes validate a run's TRL settings;
- :mod:`.trace_cache`: fitcheck's on-disk cache of traces and allocator replays across processes.
- :mod:`.verdict_replay`: near the budget, the whole run replayed instead of the published reserved gap;
  :mod:`.run_scope`: which runs the tracer and that replay describe (the plain Trainer's, TRL's SFTTrainer's:
  :mod:`.tracer_trl`; DPOTrainer's: :mod:`.tracer_dpo`; KTOTrainer's: :mod:`.tracer_kto`; GRPOTrainer's:
  :mod:`.tracer_grpo`).

Importing this package imports no torch; each name imports its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fitcheck.torch_adapters.allocator_compose import replayed_micro_batches
    from fitcheck.torch_adapters.allocator_replay import (
        StepReplay,
        replay_deepened,
        replay_events,
        replay_lengths,
        replay_steady_state,
        replay_step,
    )
    from fitcheck.torch_adapters.allocator_whole_run import replay_whole_lengths, replay_whole_run, whole_run_events
    from fitcheck.torch_adapters.deepspeed_run_backward import EMPTY_CACHE, RESET_PEAKS, SIDE
    from fitcheck.torch_adapters.deepspeed_run_events import deepspeed_run, live_bytes
    from fitcheck.torch_adapters.deepspeed_run_plan import deepspeed_plan
    from fitcheck.torch_adapters.device_map_check import device_map_findings
    from fitcheck.torch_adapters.device_map_split import multi_gpu_shares
    from fitcheck.torch_adapters.differential import (
        FAMILY_MODELS,
        METHODS,
        PHASES,
        Cell,
        Outcome,
        cell_spec,
        compare,
        grid,
        model_config,
        phase_errors,
    )
    from fitcheck.torch_adapters.fsdp1_run_events import fsdp1_run
    from fitcheck.torch_adapters.fsdp2_run_events import fsdp2_run
    from fitcheck.torch_adapters.fsdp2_run_plan import fsdp1_plan, fsdp2_plan
    from fitcheck.torch_adapters.live_model import (
        config_mapping,
        inspect_model,
        live_device_map_findings,
        unwrap_model,
    )
    from fitcheck.torch_adapters.live_tracker import LiveTensorTracker, model_state_tensors
    from fitcheck.torch_adapters.meta_device import build_meta_model, meta_inventory
    from fitcheck.torch_adapters.peft_adapters import with_adapter_inventory
    from fitcheck.torch_adapters.peft_build import wrap_adapter
    from fitcheck.torch_adapters.pinned_path import PinnedPath
    from fitcheck.torch_adapters.replay_step_args import run_trace_kwargs
    from fitcheck.torch_adapters.run_scope import (
        not_replayed,
        plain_replay_is_rank_run,
        plain_trainer_run,
        replayed_run,
    )
    from fitcheck.torch_adapters.trace_arguments import activation_trace_kwargs, trace_kwargs
    from fitcheck.torch_adapters.trace_batch import BatchTraces, at_micro_batch
    from fitcheck.torch_adapters.trace_cache import TraceCache, cache_directory, cache_from_environment
    from fitcheck.torch_adapters.trace_result import OPTSTATE, PARAMS, components_from_trace
    from fitcheck.torch_adapters.tracer import trace_step
    from fitcheck.torch_adapters.tracer_build import build_model, hf_config, model_class, reduced_config
    from fitcheck.torch_adapters.tracer_depth import trace_components, trace_extrapolated
    from fitcheck.torch_adapters.tracer_generate import GenerationTraces, trace_generate, traced_generation
    from fitcheck.torch_adapters.tracer_patches import bitsandbytes_uncompiled
    from fitcheck.torch_adapters.tracer_recorder import LiveTensorRecorder, RegionStats
    from fitcheck.torch_adapters.trl_config_check import check_trl_config
    from fitcheck.torch_adapters.verdict_replay import NearBudget, band_low_micro_batch, search_and_boundary

_WHERE = {
    "check_trl_config": "trl_config_check",
    "Cell": "differential",
    "FAMILY_MODELS": "differential",
    "METHODS": "differential",
    "Outcome": "differential",
    "cell_spec": "differential",
    "compare": "differential",
    "grid": "differential",
    "model_config": "differential",
    "PHASES": "differential",
    "phase_errors": "differential",
    "BatchTraces": "trace_batch",
    "TraceCache": "trace_cache",
    "cache_directory": "trace_cache",
    "cache_from_environment": "trace_cache",
    "at_micro_batch": "trace_batch",
    "activation_trace_kwargs": "trace_arguments",
    "OPTSTATE": "trace_result",
    "PARAMS": "trace_result",
    "components_from_trace": "trace_result",
    "trace_extrapolated": "tracer_depth",
    "trace_kwargs": "trace_arguments",
    "trace_step": "tracer",
    "bitsandbytes_uncompiled": "tracer_patches",
    "LiveTensorRecorder": "tracer_recorder",
    "GenerationTraces": "tracer_generate",
    "trace_generate": "tracer_generate",
    "traced_generation": "tracer_generate",
    "StepReplay": "allocator_replay",
    "replay_events": "allocator_replay",
    "run_trace_kwargs": "replay_step_args",
    "replay_lengths": "allocator_replay",
    "replay_step": "allocator_replay",
    "replay_whole_lengths": "allocator_whole_run",
    "replay_deepened": "allocator_replay",
    "replay_steady_state": "allocator_replay",
    "replay_whole_run": "allocator_whole_run",
    "replayed_micro_batches": "allocator_compose",
    "whole_run_events": "allocator_whole_run",
    "EMPTY_CACHE": "deepspeed_run_backward",
    "RESET_PEAKS": "deepspeed_run_backward",
    "SIDE": "deepspeed_run_backward",
    "deepspeed_plan": "deepspeed_run_plan",
    "deepspeed_run": "deepspeed_run_events",
    "live_bytes": "deepspeed_run_events",
    "fsdp1_plan": "fsdp2_run_plan",
    "fsdp1_run": "fsdp1_run_events",
    "fsdp2_plan": "fsdp2_run_plan",
    "fsdp2_run": "fsdp2_run_events",
    "RegionStats": "tracer_recorder",
    "hf_config": "tracer_build",
    "build_model": "tracer_build",
    "with_adapter_inventory": "peft_adapters",
    "wrap_adapter": "peft_build",
    "model_class": "tracer_build",
    "reduced_config": "tracer_build",
    "build_meta_model": "meta_device",
    "device_map_findings": "device_map_check",
    "multi_gpu_shares": "device_map_split",
    "config_mapping": "live_model",
    "inspect_model": "live_model",
    "live_device_map_findings": "live_model",
    "unwrap_model": "live_model",
    "LiveTensorTracker": "live_tracker",
    "model_state_tensors": "live_tracker",
    "meta_inventory": "meta_device",
    "PinnedPath": "pinned_path",
    "plain_trainer_run": "run_scope",
    "replayed_run": "run_scope",
    "not_replayed": "run_scope",
    "plain_replay_is_rank_run": "run_scope",
    "trace_components": "tracer_depth",
    "NearBudget": "verdict_replay",
    "band_low_micro_batch": "verdict_replay",
    "search_and_boundary": "verdict_replay",
}

__all__ = [
    "EMPTY_CACHE",
    "FAMILY_MODELS",
    "METHODS",
    "OPTSTATE",
    "PARAMS",
    "PHASES",
    "RESET_PEAKS",
    "SIDE",
    "BatchTraces",
    "Cell",
    "GenerationTraces",
    "LiveTensorRecorder",
    "LiveTensorTracker",
    "NearBudget",
    "Outcome",
    "PinnedPath",
    "RegionStats",
    "StepReplay",
    "TraceCache",
    "activation_trace_kwargs",
    "at_micro_batch",
    "band_low_micro_batch",
    "bitsandbytes_uncompiled",
    "build_meta_model",
    "build_model",
    "cache_directory",
    "cache_from_environment",
    "cell_spec",
    "check_trl_config",
    "compare",
    "components_from_trace",
    "config_mapping",
    "deepspeed_plan",
    "deepspeed_run",
    "device_map_findings",
    "fsdp1_plan",
    "fsdp1_run",
    "fsdp2_plan",
    "fsdp2_run",
    "grid",
    "hf_config",
    "inspect_model",
    "live_bytes",
    "live_device_map_findings",
    "meta_inventory",
    "model_class",
    "model_config",
    "model_state_tensors",
    "multi_gpu_shares",
    "not_replayed",
    "phase_errors",
    "plain_replay_is_rank_run",
    "plain_trainer_run",
    "reduced_config",
    "replay_deepened",
    "replay_events",
    "replay_lengths",
    "replay_steady_state",
    "replay_step",
    "replay_whole_lengths",
    "replay_whole_run",
    "replayed_micro_batches",
    "replayed_run",
    "run_trace_kwargs",
    "search_and_boundary",
    "trace_components",
    "trace_extrapolated",
    "trace_generate",
    "trace_kwargs",
    "trace_step",
    "traced_generation",
    "unwrap_model",
    "whole_run_events",
    "with_adapter_inventory",
    "wrap_adapter",
]


def __getattr__(name: str) -> Any:
    """Import the adapter module that defines ``name`` on first use."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"fitcheck.torch_adapters.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'fitcheck.torch_adapters' has no attribute {name!r}")
