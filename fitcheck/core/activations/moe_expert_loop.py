"""What transformers 4.x's per-expert Mixtral MoE loop keeps for backward (pure, no torch).

transformers before 5.0 builds Mixtral's experts as ``nn.Linear`` modules and loops over them
(``MixtralSparseMoeBlock.forward``, 4.48.1 ``models/mixtral/modeling_mixtral.py`` L112-150); 5.0 fused them into
3-D parameters run by the shared experts kernel (transformers PR #41580, first released in v5.0.0; the 5.23 recipe
is ``layer_saved._mlp_saved``'s, read off 5.23 traces). The loop, per layer and token (k top-k, E experts, h hidden,
I intermediate):

- router: ``F.softmax(router_logits, dim=1, dtype=torch.float)`` keeps its fp32 result (4E); ``torch.topk`` its
  int64 ids (8k); ``routing_weights /= routing_weights.sum(...)`` the fp32 top-k weights and their sum (4k + 4);
  each expert's ``torch.where(expert_mask[expert_idx])`` returns ``idx`` and ``top_x`` as views of one
  ``nonzero`` result, kept by the gathers and ``index_add_`` (2 x int64 per routed copy: 16k).
- per routed copy (the token's k experts): ``w1`` output (silu keeps it), silu output and ``w3`` output (the
  product keeps both): 3I; ``w2`` output (the routing-weight mul keeps it): h; the gathered routing weight
  ``routing_weights[top_x, idx, None]`` (1) and the product ``* routing_weights`` (h), which ``index_add_`` keeps as
  its ``source`` (its backward ``grad.index_select(dim, index).expand_as(source)``). The routing weights are cast to
  the block input's dtype (``routing_weights.to(hidden_states.dtype)``), so the last two are in that dtype; the
  linears' outputs too when the experts are bitsandbytes 4-bit (``Linear4bit.forward`` returns
  ``out.to(inp_dtype)``: fp32 behind peft's k-bit preparation), otherwise in the activation dtype.
- trained experts (full fine-tune) also keep the gathered input ``hidden_states[None, top_x]`` (h, read by w1 and
  w3's weight gradients; under autocast one 16-bit cast per reader), the silu x w3 product (I, w2's input) and the
  router's input (h).

Backward runs the experts one at a time (``index_add_`` in reverse): beyond the saved tensors and the block's output
gradient, the worst moment is one expert's MLP backward, the two gradients of its silu x w3 product (2I per routed
token, in the linears' output dtype) for that expert's tokens, bs·k/E of them with balanced routing, where the
fused/dense MLP's backward holds them for all bs tokens (``backward.backward_moments``: 2·e·I·bs). Live-tensor
tracker on one block, 2,048 tokens, top-2: 1,026 / 503 / 252.5 B per token at 2 / 4 / 8 experts (bf16, I 256:
2·2·256·k/E = 1,024 / 512 / 256), 2,052 / 496 with 4-bit experts behind the k-bit preparation (fp32 outputs).

Measured with saved-tensor hooks and fitcheck's tracer on real tensors in transformers 4.48.1 / peft 0.13.2 /
bitsandbytes 0.50.2 CPU (``benchmarks/mixtral_old_moe.py``; ``tests/test_mixtral_expert_loop.py`` pins the recorded
numbers): 16-bit model 76 + k·2·(2h + 3I + 1) bytes per token at E = 4, k = 2 (4,176 B at h 128, I 256); QLoRA
behind the k-bit preparation under bf16 autocast 76 + k·4·(2h + 3I + 1) (8,276 B).
"""

from __future__ import annotations

from fitcheck.spec import ModelShape, TrainingSpec

FUSED_EXPERTS_RELEASE = (5, 0)  # transformers PR #41580: MoE experts as one module of 3-D parameters


def expert_loop_applies(spec: TrainingSpec) -> bool:
    """Whether the run's Mixtral MoE is transformers 4.x's per-expert ``nn.Linear`` loop (module docstring)."""
    release = spec.stack.release("transformers")
    return (spec.model.shape.traits.v4_linear_experts and release is not None
            and release[:2] < FUSED_EXPERTS_RELEASE)


def expert_linears_bytes(spec: TrainingSpec, e: int, r: int) -> int:
    """Element bytes of the experts' linear outputs: the block input's (``r``) for bitsandbytes 4-bit experts
    (``Linear4bit.forward`` returns ``out.to(inp_dtype)``), else the activations' (``e``)."""
    from fitcheck.core.states import is_quantized
    from fitcheck.spec import Role

    quant = spec.quant
    four_bit = (quant is not None and quant.method == "bitsandbytes" and quant.bits == 4
                and any(p.role is Role.EXPERTS and is_quantized(spec, p) for p in spec.model.params))
    return r if four_bit else e


def expert_loop_backward_work(spec: TrainingSpec, e: int, r: int) -> int | None:
    """Bytes of the MoE MLP's backward working set in the loop (module docstring): one expert's product
    gradients for its share of the micro-batch's tokens; None where the loop does not run."""
    if not expert_loop_applies(spec):
        return None
    sh = spec.model.shape
    tokens = spec.batch.micro_batch * spec.batch.seq_len
    per_expert = -(-tokens * sh.experts_per_token // max(1, sh.num_experts))  # balanced routing, rounded up
    return 2 * expert_linears_bytes(spec, e, r) * sh.intermediate_size * per_expert


def expert_loop_saved(shape: ModelShape, *, e: int, r: int, linears_out: int, full: bool, autocast: bool) -> int:
    """Bytes per token per layer the 4.x loop keeps (module docstring).

    Args:
        shape: The model's shape (hidden, intermediate, experts, top-k).
        e: Element bytes of the activations (matmul outputs; autocast's 16-bit casts).
        r: Element bytes of the block's input (the residual stream's norm output): the routing weights' dtype.
        linears_out: Element bytes of the experts' linear outputs (``r`` for bitsandbytes 4-bit experts, else ``e``).
        full: The experts and router are trained.
        autocast: Autocast is on (a trained expert's input is saved as one 16-bit cast per reading linear).
    """
    h, inter, k, n_exp = shape.hidden_size, shape.intermediate_size, shape.experts_per_token, shape.num_experts
    routing = 4 * n_exp + 4 + 4 * k + 8 * k + 16 * k
    routed = linears_out * (3 * inter + h) + r * (h + 1)
    if not full:
        return routing + k * routed
    gathered = 2 * e * h if autocast else r * h  # w1 / w3 read the gathered input
    router_in = e * h if autocast else r * h
    return router_in + routing + k * (routed + gathered + linears_out * inter)
