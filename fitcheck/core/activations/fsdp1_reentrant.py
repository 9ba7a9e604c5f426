"""FSDP1, reentrant checkpointing around the FSDP unit, frozen unit parameters: every layer's checkpointed input
and its gradient stay alive until the end of backward (pure: no torch).

The mechanism, from the sources:

- torch ``distributed/fsdp/_runtime_utils.py`` (2.13; the same since 2.1) ``_register_post_backward_reshard_only_hook``:
  an FSDP1 unit whose flat parameter does not require gradients (a decoder layer's frozen base weights, with each
  LoRA module its own unit under peft's ``fsdp_auto_wrap_policy``, which transformers' Trainer installs for a PEFT
  model: 4.48 ``Trainer._fsdp_qlora_plugin_updates``, 5.23 ``distributed/fsdp.py``) registers, in every forward
  run with gradients enabled, ``register_multi_grad_hook`` on the unit's input tensors, and keeps the handle in
  ``flat_param._post_backward_hook_state`` until ``_finalize_params`` removes it at the end of backward.
- torch ``autograd/graph.py`` ``register_multi_grad_hook``: the hook's closure holds ``grad_fns``, the inputs'
  ``grad_fn`` or, for a leaf, its ``AccumulateGrad`` node, which holds the leaf itself.
- Before transformers 4.52 the model's forward calls ``self._gradient_checkpointing_func(decoder_layer.__call__,
  hidden_states, ...)`` (4.51.3 ``modeling_llama.py`` l. 559): the checkpoint wraps the FSDP unit. Under reentrant
  checkpointing (``CheckpointFunction``, the 4.35-4.x default) the forward runs the unit without gradients (no
  hook), and the backward's recompute runs it on ``detach_variable(inputs)``: leaves that share the saved input's
  storage, whose ``.grad`` becomes the layer's input gradient. The hook is registered on that leaf, the leaf is
  held by the hook's own closure (a reference cycle through the tensor's hooks), so the checkpointed input and
  its gradient live until ``_finalize_params`` removes the hook. transformers 4.52 ``modeling_layers.
  GradientCheckpointingLayer`` moved the checkpoint inside the layer (inside the unit): the hook then sits on the
  outer graph's hidden state (no ``AccumulateGrad``), and nothing is held.

Measured on one H200 (``benchmarks/fsdp1_lora_gpu.py``, ``benchmarks/data/fsdp1_lora_gpu_nvidia_h200.json``): on
transformers 4.48.1 / accelerate 1.0.1, Mistral-7B LoRA 4 x 4096 under FSDP1 frees the 31 checkpointed inputs and
31 input gradients (128 MiB each) in one burst at the end of backward; on 5.23 with FSDP1 they are freed layer by
layer. The memory trace's peak moved from the loss to the bottom layer's recompute.
"""

from __future__ import annotations

from fitcheck.spec import Strategy, TrainingSpec

# transformers 4.52.0: modeling_layers.GradientCheckpointingLayer (checkpoint inside the decoder layer)
_CHECKPOINT_INSIDE_LAYER = (4, 52)


def held_checkpoint_inputs(spec: TrainingSpec) -> bool:
    """Whether every checkpointed layer input and its gradient stay alive until the end of backward (module
    docstring): FSDP1, reentrant checkpointing, transformers < 4.52 named by the stack, adapters in their own units
    (frozen decoder-layer units). Not where the units hold frozen and trainable parameters together
    (``FsdpSpec.frozen_shares_units``: the flat parameter requires gradients, no reshard-only hook)."""
    fs = spec.sharding.fsdp
    if spec.sharding.strategy is not Strategy.FSDP or fs is None or fs.version != 1 or fs.frozen_shares_units:
        return False
    if not (spec.activations.checkpointing and spec.activations.use_reentrant):
        return False
    if spec.lora is None and spec.peft is None:
        return False
    release = spec.stack.release("transformers")
    return release is not None and release[:2] < _CHECKPOINT_INSIDE_LAYER


def held_input_grads(spec: TrainingSpec, i: int, ckpt_input: int) -> int:
    """Bytes of the input gradients the layers above layer ``i`` made and still hold at its backward
    (:func:`held_checkpoint_inputs`; each the size and dtype of one checkpointed layer input).

    Args:
        spec: The training spec.
        i: The layer in backward (0 = bottom).
        ckpt_input: Bytes of one checkpointed layer input.

    Returns:
        ``(L-1-i)·ckpt_input`` where :func:`held_checkpoint_inputs`, else 0.
    """
    if not held_checkpoint_inputs(spec):
        return 0
    return (spec.model.shape.num_layers - 1 - i) * ckpt_input


def held_at_layer(spec: TrainingSpec, i: int, ckpt_input: int) -> int:
    """Bytes held at layer ``i``'s backward beyond the layers ``0..i`` checkpoints the formula keeps: the
    checkpointed inputs of the layers above (already through backward) and their input gradients.

    Args:
        spec: The training spec.
        i: The layer in backward (0 = bottom).
        ckpt_input: Bytes of one checkpointed layer input (its gradient has the same size and dtype).

    Returns:
        ``2·(L-1-i)·ckpt_input`` where :func:`held_checkpoint_inputs`, else 0.
    """
    return 2 * held_input_grads(spec, i, ckpt_input)


__all__ = ["held_at_layer", "held_checkpoint_inputs", "held_input_grads"]
