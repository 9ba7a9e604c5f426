"""GRPO's generation phase without vLLM: what ``model.generate`` holds above the persistent state. Pure, no torch.

TRL 1.16 ``grpo_trainer.py`` ``_generate_single_turn`` (regular path) calls ``unwrapped_model.generate`` under
``torch.no_grad()`` inside ``unwrap_model_for_generation`` (``trl/models/utils.py``), which disables gradient
checkpointing but never calls ``eval()``: the policy generates **in train mode**, so a LoRA adapter's
``nn.Dropout`` is active (peft 0.21.2 ``tuners/lora/layer.py`` ``Linear.forward``: ``lora_B(lora_A(dropout(x)))``
after ``x = self._cast_input_dtype(x, lora_A.weight.dtype)``). Under PEFT, ``PeftModelForCausalLM.generate``
(``peft_model.py``) calls ``self.base_model.generate``: the inner model's forward, not the one accelerate wrapped in
autocast (``Accelerator.prepare_model``), so the fp32 adapters run in fp32.

transformers 5.23 ``generation/utils.py`` ``_sample``: one prefill forward over the prompt (``logits_to_keep=1``,
``_prepare_generation_config`` L2950-2954), then one decode forward per new token; ``DynamicLayer.update``
(``cache_utils.py`` L136-137) grows each layer's K and V with ``torch.cat``, so the old and the new block of one
layer are alive together for a moment. The phase's peak is the larger of two moments:

- **prefill**, at the last layer's MLP: the prompt's K/V of every layer; four ``[rows, prompt, hidden]`` tensors
  (``LlamaModel.forward`` keeps ``inputs_embeds`` and the layer's input, ``LlamaDecoderLayer.forward`` the
  post-attention ``residual`` and the ``post_attention_layernorm`` output the MLP reads); the rotary ``cos``/``sin``
  (``[rows, prompt, head_dim]`` in the activations' dtype); the ids, masks and positions (int64); and the MLP's
  working set: ``act(gate) * up`` with its two operands, or, where LoRA wraps the MLP, the adapter's moment (the
  larger of ``up_proj``'s and ``down_proj``'s, :func:`_lora_mlp_moment`);
- **the last decode step**: the whole cache (``prompt + completion - 1`` tokens: the last sampled token is never fed
  back) plus one layer's old block beside its ``torch.cat`` result, or the sampling tensors on ``[rows, vocab]``.

Measured against the real ``GRPOTrainer._generate`` on CPU (live tensors): ``benchmarks/grpo_generation.py``.
"""

from __future__ import annotations

from fitcheck.core.states import trl_bf16_trainables
from fitcheck.spec import TrainingSpec

# int64 tensors alive at the prefill peak (measured, benchmarks/grpo_generation.py): four [rows, prompt] (the
# prompt ids, the attention mask, the position ids and generate's working copy of the ids) and four [prompt]
# (cache_position and its derivatives)
_PREFILL_ROW_INTS = 4
_PREFILL_INTS = 4


def _adapter_bytes(spec: TrainingSpec) -> int:
    """Element bytes of the LoRA weights: peft's fp32 (``get_peft_model(autocast_adapter_dtype=True)``), or TRL's
    bf16 cast over a bitsandbytes base (``core/states/trl_adapters.py``); an fp32 model's adapters are fp32."""
    return 2 if trl_bf16_trainables(spec) else max(4, spec.precision.load_dtype.nbytes)


def _lora_mlp_moment(spec: TrainingSpec, training: bool) -> int:
    """Bytes per prompt token of the MLP's largest moment when LoRA wraps ``up_proj`` or ``down_proj`` (0 if not).

    peft 0.21.2 ``Linear.forward``: ``result = base_layer(x)``, ``x = _cast_input_dtype(x, adapter dtype)`` (a copy
    unless the dtypes match: ``tuners_utils.py``), ``result = result + lora_B(lora_A(dropout(x))) * scaling``, then
    ``result.to(result dtype)``. Without autocast ``lora_B``'s output, its scaled copy and the sum are in the
    adapter dtype. ``LlamaMLP.forward`` is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``:

    - ``up_proj``: ``act(gate)`` and the base result (activations' dtype), the scaled ``lora_B`` output and the sum
      (adapter dtype), all intermediate-wide, and the adapter-dtype copy of the hidden-wide input;
    - ``down_proj``: the product (activations' dtype), its adapter-dtype copy, the dropout's noise / mask
      (``lora_dropout_mask_bytes``: CPU noise in the input's dtype, CUDA a bool mask) and its output, all
      intermediate-wide, and the base result (hidden-wide).
    """
    # imported here: core.activations.decoder imports core.trainers (the fused-head column)
    from fitcheck.core.activations import lora_dropout_mask_bytes, wrapped_linears

    lora = spec.lora
    if lora is None:
        return 0
    sh = spec.model.shape
    h, inter = sh.hidden_size, sh.intermediate_size
    e, a = spec.precision.load_dtype.nbytes, _adapter_bytes(spec)
    cast = a if a != e else 0
    # nn.Dropout in eval mode (evaluation_loop's model.eval()) returns its input: no noise, no copy
    drop = min(lora_dropout_mask_bytes(spec), a) + a if lora.dropout > 0 and training else 0
    wrapped = wrapped_linears(lora, ("up_proj", "down_proj"))
    up = (2 * e + 2 * a) * inter + cast * h if "up_proj" in wrapped else 0
    down = (e + cast + drop) * inter + e * h if "down_proj" in wrapped else 0
    return max(up, down)


def kv_bytes_per_token(spec: TrainingSpec, rows: int) -> int:
    """K and V of every layer for one token of ``rows`` sequences (DynamicCache, the model's dtype)."""
    sh = spec.model.shape
    return 2 * sh.num_layers * rows * sh.num_kv_heads * sh.head_dim * spec.precision.load_dtype.nbytes


def prefill_bytes(spec: TrainingSpec, rows: int, training: bool = True) -> int:
    """Bytes above the persistent state at the prefill's peak (the last layer's MLP): see the module docstring.

    Args:
        spec: The run (``spec.trainer``'s prompt length).
        rows: Sequences generated together.
        training: The model generates in train mode (GRPO's training batches; False: evaluation, ``model.eval()``).
    """
    t, sh = spec.trainer, spec.model.shape
    e = spec.precision.load_dtype.nbytes
    p = t.prompt_length
    per_token = (4 * sh.hidden_size * e + 2 * sh.head_dim * e + 8 * _PREFILL_ROW_INTS
                 + max(3 * sh.intermediate_size * e, _lora_mlp_moment(spec, training)))
    return kv_bytes_per_token(spec, rows) * p + rows * p * per_token + 8 * _PREFILL_INTS * p


def generation_bytes(spec: TrainingSpec, rows: int, training: bool = True) -> tuple[int, int]:
    """(KV cache, working set) of ``model.generate`` for ``rows`` sequences of prompt + completion (no vLLM).

    The cache is the whole one at the last decode step; the working set is what comes on top of it at the phase's
    peak: the larger of the last step's moments (:func:`decode_bytes`) and the prefill's excess over the whole
    cache (:func:`prefill_bytes`: the prefill holds only the prompt's K/V).

    Args:
        spec: The run (``spec.trainer``'s prompt and completion lengths).
        rows: Sequences generated together.
        training: The model generates in train mode (GRPO's training batches; False: evaluation, ``model.eval()``).

    Returns:
        ``(kv_cache, working_set)`` bytes.
    """
    t = spec.trainer
    tokens = t.prompt_length + t.completion_length - 1  # the last sampled token is never fed back
    kv = kv_bytes_per_token(spec, rows) * tokens
    return kv, max(decode_bytes(spec, rows), prefill_bytes(spec, rows, training) - kv)


def decode_bytes(spec: TrainingSpec, rows: int) -> int:
    """Bytes above the whole cache at the last decode step (transformers 5.23 ``_sample``, GRPOConfig's sampling).

    - the ``torch.cat`` in the last layer's ``DynamicLayer.update``: the old V block (``tokens - 1``) beside the new
      one; the new token's ``inputs_embeds``, layer input, ``input_layernorm`` output, rotated query, key and value
      and the rotary ``cos``/``sin`` (``[rows, 1, ...]``, ``LlamaModel.forward`` / ``LlamaAttention.forward``); and
      the previous step's ``next_token_logits`` (an fp32 copy, ``.to(copy=True, dtype=torch.float32)``)
      and ``probs`` (``softmax``) are still bound: two fp32 ``[rows, vocab]``. GRPOConfig's defaults
      (temperature 1.0, top_p 1.0, top_k 0, min_p None, repetition_penalty 1.0) make ``_get_logits_processor`` add no
      processor, so ``next_token_scores`` is ``next_token_logits``; each processor that returns a new tensor
      (``min_new_tokens``, temperature, top-k/p) keeps one more.
    - the ``softmax``: the step's ``outputs.logits`` ``[rows, 1, vocab]`` (fp32 for a full model: accelerate 1.15
      ``Accelerator.prepare_model`` wraps its forward in ``convert_outputs_to_fp32``; under PEFT, generate runs the
      inner model's forward: the model's dtype), the new ``next_token_logits``, the previous ``probs`` and the new
      ones.
    - both with ``input_ids`` and ``attention_mask`` (int64 ``[rows, tokens]``).
    """
    t, sh = spec.trainer, spec.model.shape
    e = spec.precision.load_dtype.nbytes
    tokens = t.prompt_length + t.completion_length - 1
    vocab = 4 * rows * sh.vocab_size  # one fp32 [rows, vocab]
    kv_width = sh.num_kv_heads * sh.head_dim
    step = rows * e * (3 * sh.hidden_size + sh.num_heads * sh.head_dim + 2 * kv_width + 2 * sh.head_dim)
    cat = rows * kv_width * e * (tokens - 1) + step + 2 * vocab
    logits = rows * sh.vocab_size * (4 if spec.lora is None else spec.precision.load_dtype.nbytes)
    sampling = logits + 3 * vocab
    return max(cat, sampling) + 2 * 8 * rows * tokens
