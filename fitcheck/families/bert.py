"""BERT and the encoders that share its layer (``model_type`` bert, roberta, xlm-roberta, camembert,
deberta, deberta-v2, distilbert, electra): inventory (BERT) and traits.

transformers 5.23 modeling_roberta.py / modeling_xlm_roberta.py / modeling_camembert.py: "Copied from
transformers.models.bert.modeling_bert.BertLayer" -- the same encoder layer as BERT (embeddings differ by the
padding-aware position ids only), so as classifiers they run BERT's layer recipe (``classifier_layer``).
"""

from __future__ import annotations

from dataclasses import replace

from fitcheck.families.base import ConfigView, Family, Inventory, InventoryBuilder, NotPureFamilyError
from fitcheck.families.layernorm_blocks import dropout_prob, layernorm_shape
from fitcheck.spec import Dropout, FamilyTraits, Kind, LayerRecipe, NormKind, Role


def bert(cfg: ConfigView) -> Inventory:
    """BertForMaskedLM, the class BERT checkpoints name in ``architectures`` and the MLM fine-tuning class.

    No pooler (``BertModel(config, add_pooling_layer=False)``); the MLM decoder weight is tied to the word
    embeddings and its bias to ``cls.predictions.bias`` unless ``tie_word_embeddings`` is false, in which case
    transformers 5 unties both (modeling_bert.py ``_tied_weights_keys``). Sequence-classification fine-tunes
    (BertForSequenceClassification) have a pooler and classifier instead of the MLM head: about the same size.
    """
    if cfg.get_bool("add_cross_attention", default=False):
        raise NotPureFamilyError("bert with add_cross_attention")
    vocab = cfg.get_int("vocab_size", default=30522)
    hidden = cfg.get_int("hidden_size", default=768)
    layers = cfg.get_int("num_hidden_layers", default=12)
    heads = cfg.get_int("num_attention_heads", default=12)
    inter = cfg.get_int("intermediate_size", default=3072)
    positions = cfg.get_int("max_position_embeddings", default=512)
    tied = cfg.get_bool("tie_word_embeddings", default=True)
    emb, lay, head = "bert.embeddings", "bert.encoder.layer.*", "cls.predictions"
    b = InventoryBuilder()
    b.embedding(f"{emb}.word_embeddings", vocab, hidden)
    b.embedding(f"{emb}.position_embeddings", positions, hidden, Role.POSITION)
    b.embedding(f"{emb}.token_type_embeddings", cfg.get_int("type_vocab_size", default=2), hidden)
    b.norm(f"{emb}.LayerNorm", hidden, bias=True)
    for proj in ("query", "key", "value"):
        b.linear(f"{lay}.attention.self.{proj}", hidden, hidden, Role.ATTENTION, bias=True, repeat=layers)
    b.linear(f"{lay}.attention.output.dense", hidden, hidden, Role.ATTENTION, bias=True, repeat=layers)
    b.norm(f"{lay}.attention.output.LayerNorm", hidden, bias=True, repeat=layers)
    b.linear(f"{lay}.intermediate.dense", hidden, inter, Role.MLP, bias=True, repeat=layers)
    b.linear(f"{lay}.output.dense", inter, hidden, Role.MLP, bias=True, repeat=layers)
    b.norm(f"{lay}.output.LayerNorm", hidden, bias=True, repeat=layers)
    b.add(f"{head}.bias", (vocab,), Role.BIAS, Kind.BIAS)
    b.linear(f"{head}.transform.dense", hidden, hidden, Role.LM_HEAD, bias=True)
    b.norm(f"{head}.transform.LayerNorm", hidden, bias=True)
    if not tied:
        b.linear(f"{head}.decoder", hidden, vocab, Role.LM_HEAD, bias=True)
    shape = layernorm_shape(
        cfg,
        architecture="BertForMaskedLM",
        no_split="BertLayer",
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv=heads,
        inter=inter,
        vocab=vocab,
        tied=tied,
        max_pos=positions,
        activation=cfg.get_str("hidden_act", default="gelu"),
        causal_lm=False,
    )
    return b.params, shape


def traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """BERT's traits: post-LN encoder recipe (BertConfig dropout defaults 0.1; embeddings use the hidden one)."""
    hidden = dropout_prob(cfg, "hidden_dropout_prob", 0.1)
    dropout = Dropout(attention=dropout_prob(cfg, "attention_probs_dropout_prob", 0.1), hidden=hidden,
                      embedding=hidden)
    return replace(base, recipe=LayerRecipe.BERT_BLOCK, norm_kind=NormKind.LAYERNORM, encoder=True,
                   dropout=dropout, activations_pinned=True)


def bert_layer_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """A RoBERTa-like encoder: its own traits, BERT's as a classifier."""
    return replace(base, encoder=True, classifier_layer=traits(cfg, base))


def camembert_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """CamemBERT: BERT's layer as a classifier; not declared an encoder outside it (as before the traits)."""
    return replace(base, classifier_layer=traits(cfg, base))


def encoder_traits(cfg: ConfigView, base: FamilyTraits) -> FamilyTraits:
    """An encoder with its own layer (DeBERTa, DistilBERT, ELECTRA): the classifier pools the first token."""
    return replace(base, encoder=True)


FAMILIES = (
    Family("bert", traits, bert),
    Family("roberta", bert_layer_traits),
    Family("xlm-roberta", bert_layer_traits),
    Family("camembert", camembert_traits),
    *(Family(t, encoder_traits) for t in ("deberta", "deberta-v2", "distilbert", "electra")),
)
