"""What a scaled input embedding keeps beyond the Llama recipe (pure).

With gradient checkpointing, ``activation_checkpointing_enable`` calls ``enable_input_require_grads``
(transformers 5.23 modeling_utils.py, for every ``input_ids`` model): a forward hook makes the output of
``get_input_embeddings()`` require a gradient. A frozen embedding's output then becomes a leaf. Where the model
feeds that output straight to its first layer (Llama, and Gemma, which scales inside ``GemmaScaledWordEmbedding``)
the leaf is the first checkpointed input, already counted. Granite scales it afterwards (``GraniteModel.forward``:
``inputs_embeds = inputs_embeds * self.embedding_multiplier``), so the leaf and the scaled copy both exist: the
leaf's ``AccumulateGrad`` node holds it until backward ends, and at the end of backward its gradient meets the
scaled copy's (fake-tensor traces of granite-3.3-8b-instruct at 2 layers: one ``b x s x h`` tensor in the
embedding output's dtype more than Llama at the same widths from the end of forward on, two at the end of
backward; LoRA, QLoRA and LLM.int8 bases, tests/test_family_granite.py).
"""

from __future__ import annotations

from fitcheck.spec import TrainingSpec


def scaled_embedding_leaf(spec: TrainingSpec, residual_bytes: int) -> int:
    """Bytes of the frozen embedding's output kept as a leaf beside its scaled copy (0 unless it applies).

    Args:
        spec: The training spec.
        residual_bytes: Element bytes of the residual stream (the embedding output's dtype).
    """
    from fitcheck.core.activations.freeze import frozen_layers

    sh = spec.model.shape
    if not sh.traits.embedding_scaled_outside or not spec.activations.checkpointing:
        return 0
    frozen = frozen_layers(spec)
    trained = frozen.embedding_trained if frozen is not None else spec.lora is None and spec.quant is None
    if trained:  # a trained embedding's output is no leaf: the product saves nothing and it is freed
        return 0
    return residual_bytes * sh.hidden_size * spec.batch.micro_batch * spec.batch.seq_len
