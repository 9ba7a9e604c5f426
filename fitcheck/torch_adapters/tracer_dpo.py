"""TRL 1.16's DPO step in the tracer: what ``DPOTrainer.__init__`` does to the model, and its ``_compute_loss``.

The whole-run allocator replay (``allocator_whole_run.replay_whole_run``) replays a traced step's own allocations and
frees. ``trl/trainer/dpo_trainer.py`` (TRL 1.16.0) runs a step unlike the plain Trainer's and SFT's:

- ``__init__``: peft's ``get_peft_model`` (``tracer_build``), ``model.enable_input_require_grads()`` for PEFT with
  ``gradient_checkpointing``, a quantized base's trainable parameters cast to bf16 (``tracer_trl.trainable_to_bf16``:
  the same lines as SFT's), the reference (``ref_model is None``: under PEFT or ``precompute_ref_log_probs`` none,
  else a second copy loaded by ``create_model_from_path`` in the policy's dtype and attention, quantized like it),
  ``disable_dropout_in_model`` on both (``DPOConfig.disable_dropout`` defaults to True), and
  ``add_fused_lm_head(policy, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))`` /
  ``add_fused_lm_head(ref_model)`` (log-probs only).
- ``_compute_loss``: ``DataCollatorForPreference`` concatenates chosen and rejected rows (``[2B, L]``:
  ``core.trainers.step_spec``); ``labels = input_ids.masked_fill(completion_mask == 0, -100)``; the policy forward
  with the fused head; its per-token log-probs summed per row and chunked into chosen / rejected; the reference
  pass under ``torch.no_grad()`` and ``disable_gradient_checkpointing(self.model)``: PEFT without a reference model
  runs the policy itself with its adapters disabled (``use_adapter(model, None)``: ``model.disable_adapter()``),
  a full fine-tune its ``ref_model``, ``precompute_ref_log_probs`` reads the batch's ``ref_chosen_logps`` /
  ``ref_rejected_logps`` (computed before training by ``_precompute_ref_logps``: :meth:`DpoStep.precompute`, in the
  trace's setup); the ``sigmoid`` loss (``-logsigmoid(beta * delta)``; ``rpo_alpha`` adds the ``sft`` term:
  the chosen rows' mean negative log-prob); the metrics it keeps for logging. Both forwards' outputs stay alive to
  the function's return, through the reference pass and the loss.

What is not the real code, and why (all ``[rows, seq]`` or smaller, next to the ``[rows, seq, hidden]`` step):
the metrics' boolean indexing (``chosen_mean_logits[chosen_mask.bool()]``, ``-x[mask.bool()].mean()`` of the sft
term: data-dependent shapes, which fake tensors cannot run) is a masked ``where`` / product of the full
``[B, seq - 1]`` shape instead of the ``[N]`` labelled positions; the ``.item()`` reads and the
``gather_for_metrics`` of one process (the tensor itself) are left out; ``attention_mask`` (all ones: the
collator pads nothing in a batch of one length) is not passed, as in the plain and SFT traces; the precompute
pass runs the policy in train mode (``from_pretrained`` leaves it in eval mode; with dropout disabled the same
ops), on the step's input ids (the real pass's own batch tensors, ``[2B, L]`` int64 x 3, are not traced).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fitcheck.torch_adapters.tracer_trl_plans import DpoPlan

DPO_SOURCE = "trl 1.16.0 trl/trainer/dpo_trainer.py DPOTrainer.__init__ / _compute_loss"
DPO_BETA = 0.1  # DPOConfig.beta default; no allocation depends on it
MODEL_REF, ADAPTERS_OFF, PRECOMPUTED = "model", "adapters", "precomputed"  # where the reference log-probs come from


def dpo_reference(lora: bool, precompute: bool) -> str:
    """Where ``DPOTrainer`` takes the reference log-probs from (``__init__``'s ``ref_model is None`` branch, without
    FSDP): the batch (``precompute_ref_log_probs``), the policy with its adapters disabled (PEFT), else a second
    copy of the model.

    Args:
        lora: The run trains a peft adapter.
        precompute: ``precompute_ref_log_probs``.

    Returns:
        :data:`PRECOMPUTED`, :data:`ADAPTERS_OFF` or :data:`MODEL_REF`.
    """
    if precompute:
        return PRECOMPUTED
    return ADAPTERS_OFF if lora else MODEL_REF


@dataclass
class DpoStep:
    """The DPO step of a built model.

    Attributes:
        model: The policy (the PeftModel under PEFT).
        backbone: The module whose output is the policy's last hidden state.
        completion_mask: ``[2B, L]`` int64, 0 over the prompt, 1 over the completion (a batch input).
        reference: :data:`MODEL_REF`, :data:`ADAPTERS_OFF` or :data:`PRECOMPUTED`.
        ref_model: The reference copy (:data:`MODEL_REF`), else None.
        checkpointing_kwargs: What ``disable_gradient_checkpointing`` re-enables checkpointing with.
        sft_weight: ``rpo_alpha`` (the ``sft`` loss term's weight), None without it.
        ref_logps: The batch's precomputed ``ref_chosen_logps`` / ``ref_rejected_logps`` (:data:`PRECOMPUTED`).
        warmup: Bytes of the copy's ``caching_allocator_warmup`` block (0: none, as on CPU).
    """

    model: Any
    backbone: Any
    completion_mask: Any
    reference: str
    ref_model: Any = None
    checkpointing_kwargs: dict[str, Any] = field(default_factory=dict)
    sft_weight: float | None = None
    ref_logps: tuple[Any, ...] = ()
    warmup: int = 0

    def inputs(self) -> list[Any]:
        """The batch's tensors besides ``input_ids`` (tracked as inputs)."""
        return [self.completion_mask, *self.ref_logps]

    def track_reference(self, rec: Any) -> list[Any]:
        """Record the reference copy's loading with the recorder ``rec``: ``from_pretrained``'s warm-up block
        (:attr:`warmup`, allocated and freed) and its parameters and buffers (model state, returned)."""
        import torch

        if self.ref_model is None:
            return []
        if self.warmup:
            block = [torch.empty(self.warmup, dtype=torch.uint8)]
            rec.track(block)
            block.clear()  # freed: the copy's weights are carved out of the cached block
        state = [*self.ref_model.parameters(), *self.ref_model.buffers()]
        rec.track(state)
        return state

    def loss(self, ids: Any, _labels: Any) -> Any:
        """``DPOTrainer._compute_loss`` (``sigmoid``, ``rpo_alpha`` as the ``sft`` term; module docstring)."""
        import torch
        import torch.nn.functional as F

        completion_mask = self.completion_mask
        shift_completion_mask = completion_mask[..., 1:]
        labels = ids.masked_fill(completion_mask == 0, -100)
        outputs = self.model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True)
        seq_len = shift_completion_mask.size(1)
        per_token_logps = outputs.log_probs[:, -seq_len:]
        logps = per_token_logps.sum(dim=1)
        chosen_logps, rejected_logps = logps.chunk(2, dim=0)
        if self.reference == PRECOMPUTED:
            ref_chosen_logps, ref_rejected_logps = self.ref_logps
        else:
            ref_outputs = self._reference(ids, labels)
            ref_logps = ref_outputs.log_probs[:, -seq_len:].sum(dim=1)
            ref_chosen_logps, ref_rejected_logps = ref_logps.chunk(2, dim=0)
        chosen_logratios = chosen_logps - ref_chosen_logps
        rejected_logratios = rejected_logps - ref_rejected_logps
        delta_score = chosen_logratios - rejected_logratios
        loss = -F.logsigmoid(DPO_BETA * delta_score).mean() * 1.0
        chosen_mask, rejected_mask = shift_completion_mask.chunk(2, dim=0)
        if self.sft_weight is not None:
            chosen_per_token_logps, _ = per_token_logps.chunk(2, dim=0)
            kept = chosen_mask.bool()  # x[mask].mean(): the masked sum over the count
            batch_loss = -(chosen_per_token_logps * kept).sum() / kept.sum()
            loss = loss + batch_loss.expand(chosen_per_token_logps.size(0)).mean() * self.sft_weight
        with torch.no_grad():  # the metrics (.detach()): entropy, mean logits, top-1 accuracy, rewards
            entropy_sum = (outputs.entropy[:, -seq_len:].detach() * shift_completion_mask).sum()
            total_tokens = shift_completion_mask.sum()
            chosen_mean_logits, rejected_mean_logits = outputs.mean_logits[:, -seq_len:].chunk(2, dim=0)
            chosen_sum = torch.where(chosen_mask.bool(), chosen_mean_logits, 0).sum()
            rejected_sum = torch.where(rejected_mask.bool(), rejected_mean_logits, 0).sum()
            chosen_is_top1, _ = outputs.is_top1[:, -seq_len:].chunk(2, dim=0)
            correct = (chosen_is_top1 & chosen_mask.bool()).sum()
            chosen_rewards = DPO_BETA * chosen_logratios.detach()
            rejected_rewards = DPO_BETA * rejected_logratios.detach()
            accuracies = (chosen_rewards > rejected_rewards).float()
            margins = chosen_rewards - rejected_rewards
            del entropy_sum, total_tokens, chosen_sum, rejected_sum, correct, accuracies, margins
        return loss

    def precompute(self, ids: Any, autocast: Any) -> None:
        """``precompute_ref_log_probs``: ``_precompute_ref_logps``'s pass over one batch, before step 1 and before
        the optimizer exists (``compute_ref_log_probs``: ``torch.no_grad()``, the policy's checkpointing disabled,
        its adapters disabled under PEFT, ``accelerator.autocast()``; without FSDP the policy is the reference:
        ``ref_model`` is None). Every batch has the step's shape (``precompute_ref_batch_size`` defaults to
        ``per_device_train_batch_size``), so one pass stands for all; the log-probs go to the CPU."""
        if self.reference != PRECOMPUTED:
            return
        labels = ids.masked_fill(self.completion_mask == 0, -100)
        with self.no_grad_pass(adapters_off=True), autocast:
            log_probs = self.model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True).log_probs
        seq_len = self.completion_mask.size(1) - 1
        chosen, rejected = log_probs[:, -seq_len:].sum(dim=1).chunk(2, dim=0)
        del log_probs, chosen, rejected, labels

    @contextlib.contextmanager
    def no_grad_pass(self, adapters_off: bool) -> Iterator[None]:
        """The context of TRL's passes that take no gradient: ``torch.no_grad()``, the policy's checkpointing
        disabled (``trl/models/utils.py`` ``disable_gradient_checkpointing(self.model, kwargs)``) and, with
        ``adapters_off``, a PEFT policy's adapters disabled (``trl/trainer/utils.py`` ``use_adapter(model, None)``:
        ``model.disable_adapter()``). DPO's and KTO's reference pass and precompute pass, GRPO's old-policy and
        reference log-prob passes.

        Args:
            adapters_off: Disable the policy's adapters where it is a ``PeftModel``.
        """
        import torch
        from peft import PeftModel
        from trl.models.utils import disable_gradient_checkpointing
        from trl.trainer.utils import use_adapter

        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.checkpointing_kwargs):
            if adapters_off and isinstance(self.model, PeftModel):
                with use_adapter(self.model, adapter_name=None):
                    yield
            else:
                yield

    @contextlib.contextmanager
    def reference_model(self) -> Iterator[Any]:
        """The reference pass's model, inside :meth:`no_grad_pass`: the policy with its adapters disabled
        (:data:`ADAPTERS_OFF`) or the reference copy (DPO's and KTO's ``_compute_loss``, GRPO's log-prob
        pre-pass)."""
        with self.no_grad_pass(adapters_off=self.reference == ADAPTERS_OFF):
            yield self.model if self.reference == ADAPTERS_OFF else self.ref_model

    def _reference(self, ids: Any, labels: Any) -> Any:
        """The reference pass (:meth:`reference_model`)."""
        with self.reference_model() as model:
            return model(input_ids=ids, labels=labels, use_cache=False, fused_lm_head=True)

    def region_hooks(self, opened: Callable[[str], None], suffix: str) -> list[Any]:
        """``tracer_trl.SftStep.region_hooks`` on the policy's backbone, for its gradient-taking forward only (the
        adapters-off reference pass runs the same backbone under ``no_grad``: no region opens there)."""
        import torch

        def hook(_module: Any, _inputs: Any, out: Any) -> None:
            if not torch.is_grad_enabled():
                return
            opened("forward_head" + suffix)
            hidden = getattr(out, "last_hidden_state", None)
            if hidden is not None and hidden.requires_grad:
                hidden.register_hook(lambda _grad: opened("backward" + suffix))

        return [self.backbone.register_forward_hook(hook)]


def prepare_dpo(model: Any, outputs: tuple[str, ...], rows: int, seq_len: int, plan: DpoPlan, *,
                build_reference: Callable[[], Any], quantized: bool, checkpointing: bool,
                use_reentrant: bool) -> DpoStep:
    """Apply what ``DPOTrainer.__init__`` does to the built model before step 1 (module docstring).

    Args:
        model: ``tracer_build.build_model``'s model (PEFT-wrapped where the run trains adapters).
        outputs: The policy's fused-head outputs (``core.trainers.trainer_row(kind).fused_head``).
        rows: Rows of the step (``2B``: chosen rows, then rejected rows).
        seq_len: Tokens per row.
        plan: ``tracer.trace_step``'s ``trl_dpo`` (:func:`dpo_reference`, prompt tokens, ``rpo_alpha``, bytes of
            the copy's loading warm-up block).
        build_reference: Builds the reference copy (:data:`MODEL_REF`): the model as ``create_model_from_path``
            loads it, without adapters or checkpointing.
        quantized: The base is bitsandbytes-quantized.
        checkpointing: ``gradient_checkpointing``.
        use_reentrant: ``gradient_checkpointing_kwargs["use_reentrant"]``.

    Returns:
        The step.
    """
    import torch
    from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

    from fitcheck.torch_adapters.tracer_trl import prepare_sft

    reference = plan.reference
    # what SFTTrainer.__init__ does too (the input-grad hook under PEFT + checkpointing, a quantized base's
    # adapters in bf16, the policy's fused head); neither the head nor the dropout switch allocates, so the
    # reference copy below is still loaded after the policy's casts
    policy = prepare_sft(model, outputs, quantized=quantized, checkpointing=checkpointing)
    ref_model = reference_copy(reference, build_reference)
    if ref_model is not None:
        disable_dropout_in_model(ref_model)
    disable_dropout_in_model(model)
    if ref_model is not None:
        add_fused_lm_head(ref_model)
    completion_mask = torch.zeros(rows, seq_len, dtype=torch.int64)
    completion_mask[:, plan.prompt:] = 1
    pairs = rows // 2  # DataCollatorForPreference: torch.tensor of the rows' floats (fp32)
    ref_logps = (torch.zeros(pairs), torch.zeros(pairs)) if reference == PRECOMPUTED else ()
    kwargs = {"use_reentrant": use_reentrant} if checkpointing else {}
    return DpoStep(model, policy.backbone, completion_mask, reference, ref_model, kwargs, plan.rpo_alpha, ref_logps,
                   plan.warmup)


def reference_copy(reference: str, build_reference: Callable[[], Any]) -> Any:
    """The trainer's reference copy (:data:`MODEL_REF`: ``create_model_from_path``), in eval mode as
    ``from_pretrained`` leaves it (``accelerator.prepare_model(evaluation_mode=True)`` keeps it); None otherwise."""
    if reference != MODEL_REF:
        return None
    ref_model = build_reference()
    ref_model.eval()
    return ref_model


def labelled_positions(rows: int, seq_len: int, prompt: int) -> int:
    """Positions the fused head scores on CUDA in a DPO batch: after the shift (``labels[:, 1:]``) every position
    whose next token is a completion token, ``seq_len - max(prompt, 1)`` per row (no padding: one length)."""
    return rows * (seq_len - max(prompt, 1))


@contextlib.contextmanager
def compact_gather(count: int) -> Iterator[None]:
    """``add_fused_lm_head``'s CUDA path on fake tensors: only the labelled positions are scored.

    ``trl/trainer/utils.py`` ``_fused_forward``: where ``_use_triton`` (CUDA, XPU) the head runs on
    ``hidden_states[mask]`` / ``labels[mask]`` (``[N, h]`` / ``[N]`` copies) and scatters each per-token output back
    into ``new_zeros(mask.shape).masked_scatter(mask, x)``. A boolean index has a data-dependent shape, which fake
    tensors cannot run; here ``count`` (:func:`labelled_positions`) stands for ``N``: the gather is the first
    ``count`` rows copied (its backward allocates the full zero gradient and copies in, as ``index_put_`` does), the
    scatter the ``[N]`` output followed by the zero tail, viewed as the mask's shape (one full-size output; its
    backward hands ``x`` a view, where ``masked_select`` copies ``N`` elements). The index tensors of the gather
    (``nonzero``: ``N`` x 8 bytes per dimension) are not traced. Active only around a CUDA DPO trace."""
    import torch
    import trl.trainer.utils as trl_utils
    from torch.overrides import TorchFunctionMode

    getitem, scatter, use_triton = torch.Tensor.__getitem__, torch.Tensor.masked_scatter, vars(trl_utils)["_use_triton"]

    # A torch-function mode, not an assignment to torch.Tensor.__getitem__: Tensor inherits it from
    # torch._C.TensorBase, and a __getitem__ once set in Tensor's own dict leaves every tensor with the sequence
    # protocol even after it is deleted again (torch.tensor([tensor(3)]) then raises "len() of a 0-d tensor").
    class _Compact(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is getitem and len(args) == 2:
                x, index = args
                if (isinstance(index, torch.Tensor) and index.dtype == torch.bool
                        and index.shape == x.shape[:index.dim()]):
                    return x.reshape(-1, *x.shape[index.dim():]).narrow(0, 0, count).clone()
            if func is scatter and len(args) == 3:
                x, mask, source = args
                if source.dim() == 1 and source.numel() == count and x.shape == mask.shape:
                    return torch.cat([source, x.reshape(-1)[count:]]).view(mask.shape)
            return func(*args, **kwargs)

    setattr(trl_utils, "_use_triton", lambda _device: True)  # noqa: B010  # a private name of trl's
    try:
        with _Compact():
            yield
    finally:
        setattr(trl_utils, "_use_triton", use_triton)  # noqa: B010
