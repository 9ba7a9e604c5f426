"""Issue 19: FSDP1 + reentrant checkpointing around the unit (transformers < 4.52) holds every checkpointed input and
its gradient until the end of backward (``fitcheck.core.activations.fsdp1_reentrant``; measured on an H200:
``benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json``)."""

from __future__ import annotations

import inspect
import weakref
from dataclasses import replace
from typing import Any

import pytest

from fitcheck.cli.estimate import spec_from_values
from fitcheck.core.activations.fsdp1_reentrant import held_at_layer, held_checkpoint_inputs
from fitcheck.core.estimator import estimate
from fitcheck.report import Category, Phase
from fitcheck.spec import StackSpec

_OLD = StackSpec((("transformers", "4.48.1"), ("peft", "0.13.2"), ("accelerate", "1.0.1")), "--stack")


def _fsdp1_lora(tmp_path: Any, **extra: Any) -> Any:
    cfg = tmp_path / "fsdp.json"
    cfg.write_text('{"fsdp_version": 1, "use_orig_params": true}')
    values = {"model_name_or_path": "mistralai/Mistral-7B-v0.1", "use_peft": True, "lora_r": 16, "lora_alpha": 16,
              "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"], "gradient_checkpointing": True,
              "gradient_checkpointing_kwargs": '{"use_reentrant": true}', "per_device_train_batch_size": 2,
              "max_seq_length": 1024, "fsdp": "full_shard auto_wrap", "fsdp_config": str(cfg),
              "num_processes": 2, "dtype": "bfloat16", **extra}
    return spec_from_values(values, env={})[0]


def test_gate_reads_fsdp1_reentrant_adapters_and_the_transformers_release(tmp_path: Any) -> None:
    spec = _fsdp1_lora(tmp_path)
    assert spec.activations.use_reentrant and spec.sharding.fsdp is not None and spec.sharding.fsdp.version == 1
    old = replace(spec, stack=_OLD)
    assert held_checkpoint_inputs(old)
    assert not held_checkpoint_inputs(spec)  # no stack named: the modelled transformers 5.23
    assert not held_checkpoint_inputs(replace(spec, stack=StackSpec((("transformers", "4.52.0"),), "--stack")))
    assert not held_checkpoint_inputs(replace(old, activations=replace(old.activations, use_reentrant=False)))
    fs = old.sharding.fsdp
    assert fs is not None
    assert not held_checkpoint_inputs(replace(old, sharding=replace(old.sharding, fsdp=replace(fs, version=2))))
    assert not held_checkpoint_inputs(replace(old, sharding=replace(
        old.sharding, fsdp=replace(fs, frozen_shares_units=True))))
    assert not held_checkpoint_inputs(replace(old, lora=None))  # full fine-tune: the flat parameter needs grads
    layers = old.model.shape.num_layers
    assert held_at_layer(old, 0, 10) == 2 * (layers - 1) * 10 and held_at_layer(old, layers - 1, 10) == 0


def test_old_stack_fsdp1_lora_estimate_holds_the_inputs_and_their_gradients(tmp_path: Any) -> None:
    spec = replace(_fsdp1_lora(tmp_path), stack=_OLD)
    # the same run without the hook's hold (transformers 4.52: checkpoint inside the unit); the backward phase's
    # activations (the bottom layer's moment with every input and input gradient held)
    held, plain = (sum(c.at(Phase.BACKWARD) for c in estimate(s).components if c.category is Category.ACTIVATIONS)
                   for s in (spec, replace(spec, stack=StackSpec((("transformers", "4.52.0"),), "--stack"))))
    sh = spec.model.shape
    one_input = 2 * spec.batch.micro_batch * spec.batch.seq_len * sh.hidden_size  # bf16 residual stream
    gap = held - plain
    assert 0 < gap <= 2 * (sh.num_layers - 1) * one_input
    assert gap >= (sh.num_layers - 1) * one_input  # at least every layer's input gradient


def test_torch_multi_grad_hook_on_a_recomputed_leaf_holds_it_and_its_grad_until_removed() -> None:
    """The torch half of the mechanism, on the installed torch: FSDP1's reshard-only hook (``_runtime_utils.py``
    ``_register_post_backward_reshard_only_hook``: ``register_multi_grad_hook`` on the unit's inputs, the handle
    kept in ``flat_param._post_backward_hook_state`` until ``_finalize_params``) registered in a reentrant
    checkpoint's recompute, where the unit's input is ``detach_variable``'s leaf."""
    torch = pytest.importorskip("torch")
    from torch.autograd.graph import register_multi_grad_hook
    from torch.distributed.fsdp import _runtime_utils
    from torch.utils.checkpoint import checkpoint

    source = inspect.getsource(_runtime_utils._register_post_backward_reshard_only_hook)
    assert "register_multi_grad_hook" in source and "_post_backward_hook_state" in source
    assert "_post_backward_hook_state[-1].remove()" in inspect.getsource(_runtime_utils._finalize_params)

    handles: list[Any] = []
    seen: list[Any] = []

    class FrozenUnit(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(32, 32).requires_grad_(False)

        def forward(self, x: Any) -> Any:
            if torch.is_grad_enabled() and x.requires_grad:  # FSDP1: only with gradients enabled
                handles.append(register_multi_grad_hook([x], lambda grads: None))
                seen.append(weakref.ref(x))
            return torch.relu(self.lin(x))

    units = [FrozenUnit() for _ in range(4)]
    h = torch.randn(8, 32, requires_grad=True)
    for unit in units:  # transformers < 4.52: checkpoint(decoder_layer.__call__, hidden_states)
        h = checkpoint(unit, h, use_reentrant=True)
    h.sum().backward()
    leaves = [ref() for ref in seen]
    assert len(leaves) == 4 and all(t is not None and t.grad is not None for t in leaves)
    del leaves
    for handle in handles:
        handle.remove()
    assert all(ref() is None for ref in seen)


def test_default_path_does_not_trace_the_held_run(tmp_path: Any) -> None:
    """The installed transformers checkpoints inside the layer: its trace is not the < 4.52 run, so the default path
    answers from the formula (``run_scope.untraced_parts``)."""
    from fitcheck.torch_adapters.run_scope import untraced_parts

    spec = _fsdp1_lora(tmp_path)
    assert not any("FSDP1 unit" in p for p in untraced_parts(spec))
    assert any("FSDP1 unit" in p for p in untraced_parts(replace(spec, stack=_OLD)))
