"""What grouped_mm MoE experts with a clamped SwiGLU keep (gpt-oss; pure).

Read off fake-tensor traces of transformers 5.23 gpt-oss (``fitcheck.torch_adapters.tracer``, gpt-oss-20b at real
width) and pinned by ``tests/test_activations_recent.py``. Notation as in the decoder module: e element bytes of
the activations, h hidden, I intermediate, k top-k, E experts; bytes per token per layer.

- gpt-oss experts run ``grouped_mm_experts_forward`` (transformers 5.23 integrations/moe.py l.424-537; the
  default ``grouped_mm``, modeling_utils.py l.1884) with ``GptOssExperts._apply_gate`` (modeling_gpt_oss.py
  l.81-87): per routed copy the gathered input (h, trained experts only), the biased gate_up output (2I,
  ``clamp`` keeps its input), the clamped gate (I), sigmoid (I), ``up + 1`` (I), the glu (I), the gated product
  (I, down_proj's input: trained experts only) and the biased down output (h, the routing-weight mul keeps it).
  The router (``GptOssTopKRouter.forward`` l.125-129) keeps the top-k ids (int64) and the softmax over the top-k
  values (e); the dispatch keeps the sort permutation (int64; the sorted expert ids too when the expert biases
  are trained: ``gate_up_proj_bias[expert_ids_g]``), ``perm // k`` and the inverse permutation (int64), and the
  gathered routing weights (e). No softmax over all E experts is kept, unlike Mixtral.
"""

from __future__ import annotations

from fitcheck.spec import ModelShape


def gpt_oss_moe_saved(shape: ModelShape, e: int, full: bool) -> int:
    """Bytes per token per layer gpt-oss's router and experts keep (``grouped_mm`` experts; module docstring).

    Args:
        shape: The model's shape (hidden, intermediate, top-k).
        e: Element bytes of the activations (the router and experts run in the model / autocast dtype).
        full: The router and experts are trained (full fine-tune); otherwise they are frozen (LoRA on the
            attention linears: the router's input still needs a gradient, so its ids and scores are kept).
    """
    h, inter, k = shape.hidden_size, shape.intermediate_size, shape.experts_per_token
    router_in = e * h if full else 0  # F.linear(hidden_states, weight, bias) keeps its input for the weight
    # top-k ids, sort permutation, perm // k, inverse permutation (int64); sorted ids for the trained biases
    ids = 8 * k * (5 if full else 4)
    scores = 2 * e * k  # softmax over the top-k logits, and its gather sample_weights[perm]
    routed = 2 * h + 7 * inter if full else h + 6 * inter
    return router_in + ids + scores + e * k * routed
