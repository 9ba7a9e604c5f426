"""Saved activations of partial training without PEFT (``--trainable_layers``): which layers save what; pure.

Autograd saves a tensor for backward only where a gradient will flow through it. torch's generated
``VariableType`` code saves each input of a differentiable op under ``should_compute_output`` of the gradient
that reads it (tools/autograd/gen_variable_type.py, torch 2.13), so for a decoder layer there are three cases
(differential check ``llama freeze``, Llama-3-8B widths, 4 layers, fake-tensor trace; and
``benchmarks/cpu_truth.py`` rows ``llama bf16 freeze ...``):

* nothing before the layer needs a gradient (embeddings frozen, no trainable layer below): the layer saves
  nothing at all;
* a frozen layer whose input needs a gradient: it saves what its input gradient needs (norm statistics, the
  attention tensors, the MLP's gate/up outputs) but not the inputs of its frozen linears nor the normalised
  input its frozen norm weight would need: the LoRA-recipe layer without adapters
  (``fitcheck.core.activations.decoder.layer_saved_per_token(spec, trainable=False)``);
* a trainable layer: the full fine-tune layer.

Only layer-granular freezing is modelled this way (every per-layer name trainable, ``trainable_layers`` set);
other patterns (router-only, attention-only) fall outside the checked envelope (``fitcheck.core.activations.envelope``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.spec import Dtype, MixedPrecision, Role, TrainingSpec


@dataclass(frozen=True)
class FrozenLayers:
    """How many decoder layers of each kind a partially frozen model has.

    Attributes:
        trained: Layers whose parameters train (save as a full fine-tune).
        frozen_grad: Frozen layers whose input needs a gradient (save for the input gradient only).
        no_grad: Frozen layers below every gradient (save nothing).
        embedding_trained: Whether the input embedding trains.
        head_trained: Whether the LM head trains.
    """

    trained: int
    frozen_grad: int
    no_grad: int
    embedding_trained: bool
    head_trained: bool


def layer_granular(spec: TrainingSpec) -> bool:
    """A FreezeSpec that trains whole layers: ``trainable_layers`` set and every per-layer parameter name
    matching a trainable pattern (embeddings, final norm and head train as their own names match)."""
    fz = spec.freeze
    if fz is None or spec.lora is not None or spec.quant is not None or fz.trainable_layers is None:
        return False
    return all(any(p.matches(t) for t in fz.trainable) for p in spec.model.params if p.per_layer)


def frozen_layers(spec: TrainingSpec) -> FrozenLayers | None:
    """The layer kinds of a layer-granular partial fine-tune (None otherwise)."""
    fz = spec.freeze
    if fz is None or fz.trainable_layers is None or not layer_granular(spec):
        return None
    depth = spec.model.shape.num_layers
    trained = sorted({i for i in fz.trainable_layers if 0 <= i < depth})

    def trains(role: Role) -> bool:
        return any(p.role is role and any(p.matches(t) for t in fz.trainable) for p in spec.model.params)

    emb = trains(Role.EMBEDDING)
    head = trains(Role.LM_HEAD) or (spec.model.shape.tied_embeddings and emb)
    first_grad = 0 if emb else (trained[0] if trained else depth)
    no_grad = first_grad
    return FrozenLayers(len(trained), depth - no_grad - len(trained), no_grad, emb, head)


def autocast_head_numel(spec: TrainingSpec) -> int:
    """Elements of the LM head weight a layer-granular partial fine-tune trains under autocast over fp32
    weights (the embedding's when tied), 0 otherwise: where the head's backward makes a 16-bit weight gradient
    and then its fp32 copy.

    Under autocast the head's ``mm`` runs on the 16-bit cast of the fp32 weight, so its backward makes the weight
    gradient in 16 bits (``MmBackward0``), then ``ToCopyBackward0`` casts it to the fp32 parameter's dtype
    (torch 2.13 ``tools/autograd/derivatives.yaml``: ``_to_copy``'s gradient is ``_to_copy_backward``, a cast back
    to the input's dtype) after the node released the logits gradient and the weight/input casts
    (``torch/csrc/autograd/engine.cpp`` ``evaluate_function``). The two moments are in
    ``backward.backward_moments`` (``head``, ``head gradient cast``). Trace (fake tensors, Llama-3-8B widths,
    4 layers, top one trained, 1 x 1024, fp32 + bf16 autocast): the peak during backward is the fp32 copy's
    allocation, 523.5 MiB beyond the model states; the formula that counted the logits gradient there too and
    not the 16-bit weight gradient gave 774.0 MiB (+47.9 %).
    """
    frozen = frozen_layers(spec)
    if frozen is None or not frozen.head_trained:
        return 0
    if spec.precision.mixed_precision is MixedPrecision.NO or spec.precision.load_dtype is not Dtype.FLOAT32:
        return 0
    role = Role.EMBEDDING if spec.model.shape.tied_embeddings else Role.LM_HEAD
    return sum(p.numel for p in spec.model.params if p.role is role)


def layer_trained(spec: TrainingSpec, i: int) -> bool:
    """Whether layer ``i`` trains in a partial fine-tune by layers."""
    fz = spec.freeze
    return fz is not None and fz.trainable_layers is not None and i in fz.trainable_layers


def frozen_missing(spec: TrainingSpec, top: bool, all_grads: int, own: int, down: int) -> int:
    """Gradients of a partial fine-tune not produced yet at the top (or bottom) layer's MLP backward.

    Top: every gradient but the head's and the top layer's down_proj weight gradient (the first one the layer
    produces), when the top layer trains. Bottom: the embedding's, and when the bottom layer trains its own
    but down_proj's. (Until session 9 both counted the layer's other gradients as made: -1 layer of gradients,
    +15.2 % on the during-backward activations of Llama-3.1-70B, 4 layers, top one trained, 8 x 512, bf16,
    +121 % with the bottom one trained and checkpointing at Llama-3.1-8B; now exact at every shape of
    ``benchmarks/envelope_ranges.py``'s llama/freeze rows and with layer 0 trained.)

    Args:
        spec: The run.
        top: The top layer (else the bottom one).
        all_grads: Gradient bytes the layers and the embedding make (``backward_grads.all_grads``).
        own: Gradient bytes of one trained layer.
        down: Its down_proj weight gradient bytes.
    """
    frozen = frozen_layers(spec)
    if frozen is None:
        return 0
    trained = layer_trained(spec, spec.model.shape.num_layers - 1 if top else 0)
    if not top:
        nbytes = spec.precision.load_dtype.nbytes
        emb = sum(p.numel for p in spec.model.params if p.role is Role.EMBEDDING) * nbytes
        emb = emb if frozen.embedding_trained and not spec.model.shape.tied_embeddings else 0
        return emb + (own - down if trained else 0)
    return max(all_grads - (down if trained else 0), 0)


def autocast_layer_cast(spec: TrainingSpec, live: int, r: int, missing: int, mlp_saved: int) -> int:
    """Bytes beyond every gradient when the top trained layer's last MLP weight gradient is cast to fp32 (the
    conditions of ``autocast_head_numel``, no checkpointing; ``backward.backward_moments``).

    As at the head (``autocast_head_numel``), each trained linear's weight gradient is made in 16 bits and then cast to
    the fp32 parameter's dtype. At the last MLP linear's cast, the layer's MLP saved tensors and its three weight
    casts are released, its down/gate/up fp32 gradients exist, the 16-bit one is alive, and so are two fp32 h-wide
    input gradients (the residual one and the sum of gate's and up's). Trace (fake tensors, Mistral-7B widths,
    4 layers, top one trained, fp32 + bf16 autocast, 1 x 512): the phase's peak, ``_to_copy (14336, 4096) float32``;
    the MLP moment gave -11.95 %.

    Args:
        spec: The run.
        live: Bytes the layer's MLP backward moment holds besides its working set (every layer's saved tensors and
            weight casts).
        r: Residual-stream element bytes.
        missing: Gradients not made at the layer's MLP backward (all but the head's and down_proj's).
        mlp_saved: Bytes per token a full fine-tune's MLP saves (``layer_saved.full_mlp_saved``; passed in:
            ``layer_saved`` imports ``embedding``, which imports this module).
    """
    sh = spec.model.shape
    bs = spec.batch.micro_batch * spec.batch.seq_len
    hi = sh.hidden_size * sh.intermediate_size
    mlp_casts = 3 * 2 * hi
    made = 2 * 4 * hi  # gate and up (down's is out of ``missing`` already)
    return live - mlp_casts - mlp_saved * bs + 2 * hi + 2 * r * sh.hidden_size * bs - max(missing - made, 0)
