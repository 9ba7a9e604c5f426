"""The task head a model carries: read from ``architectures`` or ``--task``, and the inventory that goes with it.

transformers builds a different class per task from the same config.json, with a different head:

* ``causal-lm`` (``*ForCausalLM``): the vocabulary-sized ``lm_head`` (or the tied embeddings).
* ``seq-cls`` (``*ForSequenceClassification``): decoders get ``score = nn.Linear(hidden, num_labels,
  bias=False)`` and pool the last non-pad token (transformers 5.23 ``modeling_layers.py
  GenericForSequenceClassification``); BERT adds a pooler and ``classifier`` (``modeling_bert.py
  BertForSequenceClassification``); RoBERTa a ``classifier.dense`` + ``classifier.out_proj`` head; DeBERTa-v2
  a ``pooler`` + ``classifier``. No vocabulary-sized tensor exists in the step.
* ``token-cls`` (``*ForTokenClassification``): ``score``/``classifier`` ``nn.Linear(hidden, num_labels)``
  with a bias on every token (``GenericForTokenClassification``, ``BertForTokenClassification``).
* ``image-text-to-text`` (``*ForConditionalGeneration`` with a ``vision_config``): the language model, the
  vision tower and its projector (:mod:`fitcheck.readers.vision`).

``num_labels``: ``--num_labels``, else ``len(id2label)`` of config.json, else ``num_labels``, else 2 (transformers
5.23 ``configuration_utils.py PreTrainedConfig.__init__``: "Keep the default value of num_labels=2").

The decoder families and BERT are rewritten in pure Python (the tests compare each with ``from_config`` of
``AutoModelForSequenceClassification`` / ``AutoModelForTokenClassification`` on the meta device); every other
architecture is built on the meta device with the task's class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fitcheck.errors import ConfigError
from fitcheck.findings import Finding, Severity
from fitcheck.spec import Kind, ModelInventory, ModelShape, ParamEntry, Role, TrainingSpec

TASKS = ("causal-lm", "seq-cls", "token-cls", "image-text-to-text")
CLASSIFIER_TASKS = frozenset({"seq-cls", "token-cls"})
# peft 0.21.2 peft_model.py PeftModelForSequenceClassification / PeftModelForTokenClassification.__init__:
# ``classifier_module_names = ["classifier", "score"]`` are appended to modules_to_save (task_type SEQ_CLS/TOKEN_CLS)
PEFT_CLASSIFIER_MODULES = ("classifier", "score")
_SUFFIX_TASK = (
    ("ForSequenceClassification", "seq-cls"),
    ("ForTokenClassification", "token-cls"),
    ("ForImageTextToText", "image-text-to-text"),
    ("ForMaskedLM", "masked-lm"),
)
# Families whose *ForSequenceClassification / *ForTokenClassification are transformers' Generic classes:
# ``model.`` base + ``score`` (modeling_llama.py ``class LlamaForSequenceClassification(
# GenericForSequenceClassification, LlamaPreTrainedModel)``, same for the others).
_GENERIC_DECODERS = frozenset({"llama", "mistral", "mixtral", "qwen2", "gemma", "gemma2", "phi3"})


def task_from_config(config: Mapping[str, object]) -> str:
    """The task ``architectures[0]`` names (``causal-lm`` when it names none of the others)."""
    archs = config.get("architectures")
    first = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else ""
    for suffix, task in _SUFFIX_TASK:
        if first.endswith(suffix):
            return task
    if first.endswith("ForConditionalGeneration") and isinstance(config.get("vision_config"), Mapping):
        return "image-text-to-text"
    return "causal-lm"


def resolve_task(config: Mapping[str, object], flag: object | None) -> str:
    """``--task`` if given (validated), else what ``architectures`` names.

    Raises:
        ConfigError: An unknown ``--task``, or ``image-text-to-text`` on a config without ``vision_config``.
    """
    if flag is None:
        return task_from_config(config)
    task = str(flag).strip().lower()
    if task not in TASKS:
        raise ConfigError(f"--task {flag!r}: must be one of {', '.join(TASKS)}")
    if task == "image-text-to-text" and not isinstance(config.get("vision_config"), Mapping):
        raise ConfigError(
            "--task image-text-to-text: this config.json has no vision_config (not a vision-language model); "
            "pass the VLM's own config.json or drop --task"
        )
    return task


def resolve_num_labels(config: Mapping[str, object], flag: object | None) -> int:
    """``--num_labels``, else ``len(id2label)``, else config ``num_labels``, else 2 (transformers' default).

    Raises:
        ConfigError: A non-positive or non-integer value.
    """
    if flag is not None:
        try:
            value = int(str(flag))
        except ValueError:
            raise ConfigError(f"--num_labels {flag!r}: expected a positive integer") from None
        if value <= 0:
            raise ConfigError(f"--num_labels {flag!r}: expected a positive integer")
        return value
    id2label = config.get("id2label")
    if isinstance(id2label, Mapping) and id2label:
        return len(id2label)
    raw = config.get("num_labels")
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 2


def task_config(config: Mapping[str, object], task: str, num_labels: int) -> dict[str, object]:
    """The config as ``from_pretrained(..., num_labels=N)`` would see it (id2label of N labels)."""
    out = dict(config)
    if task in CLASSIFIER_TASKS:
        out.pop("label2id", None)
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
        out["num_labels"] = num_labels
    return out


def pure_task_supported(model_type: str, task: str) -> bool:
    """Whether :func:`classifier_inventory` rewrites this family's causal/MLM inventory for ``task``."""
    return task in CLASSIFIER_TASKS and (model_type in _GENERIC_DECODERS or model_type == "bert")


def _linear(name: str, in_f: int, out_f: int, role: Role = Role.LM_HEAD) -> ParamEntry:
    module = name.rsplit(".", 1)[-1]
    return ParamEntry(f"{name}.weight", (out_f, in_f), role, Kind.LINEAR, 1, module, in_f, out_f)


def _bias(name: str, n: int) -> ParamEntry:
    return ParamEntry(f"{name}.bias", (n,), Role.BIAS, Kind.BIAS, 1, name.rsplit(".", 1)[-1])


def classifier_inventory(inv: ModelInventory, task: str, num_labels: int) -> ModelInventory:
    """A pure-Python causal-LM (or BERT MLM) inventory turned into the ``task``'s classifier.

    Args:
        inv: The family inventory (``*ForCausalLM`` / ``BertForMaskedLM``).
        task: ``seq-cls`` or ``token-cls``.
        num_labels: Classifier width.

    Returns:
        The inventory of ``*ForSequenceClassification`` / ``*ForTokenClassification``: the LM head removed, the
        classifier (and BERT's pooler for seq-cls) added; the shape says the task and has no tied head.
    """
    sh = inv.shape
    h = sh.hidden_size
    family = sh.family
    token = task == "token-cls"
    if family == "bert":
        body = [p for p in inv.params if not p.name.startswith("cls.")]
        head: list[ParamEntry] = []
        if not token:  # BertForSequenceClassification: BertModel(config) keeps its pooler (dense + tanh)
            head += [_linear("bert.pooler.dense", h, h, Role.OTHER), _bias("bert.pooler.dense", h)]
        head += [_linear("classifier", h, num_labels), _bias("classifier", num_labels)]
        arch = "BertForTokenClassification" if token else "BertForSequenceClassification"
    else:
        body = [p for p in inv.params if p.role is not Role.LM_HEAD]
        head = [_linear("score", h, num_labels)] + ([_bias("score", num_labels)] if token else [])
        base = sh.architecture.removesuffix("ForCausalLM")
        arch = base + ("ForTokenClassification" if token else "ForSequenceClassification")
    shape: ModelShape = dataclasses.replace(
        sh, architecture=arch, tied_embeddings=False, causal_lm=False, task=task, num_labels=num_labels
    )
    return dataclasses.replace(inv, shape=shape, params=(*body, *head))


def with_task(inv: ModelInventory, task: str, num_labels: int) -> ModelInventory:
    """A meta-device inventory of the task's class with the task recorded in its shape."""
    if task in ("causal-lm", "masked-lm"):
        return inv
    shape = dataclasses.replace(
        inv.shape, task=task, num_labels=num_labels, causal_lm=task == "image-text-to-text"
    )
    return dataclasses.replace(inv, shape=shape)


def resolve_image_tokens(inv: ModelInventory, flag: object | None) -> ModelInventory:
    """``--image_tokens N`` recorded in the shape (vision-language models only).

    Raises:
        ConfigError: A negative or non-integer value, or the flag on a model without a vision tower.
    """
    if flag is None:
        return inv
    try:
        value = int(str(flag))
    except ValueError:
        raise ConfigError(f"--image_tokens {flag!r}: expected a non-negative integer") from None
    if value < 0:
        raise ConfigError(f"--image_tokens {flag!r}: expected a non-negative integer")
    if value and inv.shape.task != "image-text-to-text":
        raise ConfigError(
            f"--image_tokens {value}: {inv.model_id} is not loaded as a vision-language model "
            "(pass --task image-text-to-text with a config.json that has a vision_config)"
        )
    return dataclasses.replace(inv, shape=dataclasses.replace(inv.shape, image_tokens=value))


def spec_for_task(spec: TrainingSpec) -> TrainingSpec:
    """What the task changes outside the inventory: peft's classifier ``modules_to_save``.

    peft 0.21.2 ``peft_model.py`` (``PeftModelForSequenceClassification`` / ``...TokenClassification``): with
    ``task_type="SEQ_CLS"``/``"TOKEN_CLS"`` (what every classifier fine-tune passes, or the new head would stay
    at its random initialisation) ``["classifier", "score"]`` are appended to ``modules_to_save``: the head is
    trained in full and kept out of the adapter targets.
    """
    lora = spec.lora
    if lora is None or spec.model.shape.task not in CLASSIFIER_TASKS:
        return spec
    missing = tuple(m for m in PEFT_CLASSIFIER_MODULES if m not in lora.modules_to_save)
    if not missing:
        return spec
    note = Finding(
        "classifier-head-trained",
        Severity.INFO,
        f"{spec.model.shape.task}: peft (task_type {'SEQ_CLS' if spec.model.shape.task == 'seq-cls' else 'TOKEN_CLS'}) "
        "adds classifier/score to modules_to_save: the head is trained in full next to the adapters",
    )
    return dataclasses.replace(
        spec,
        lora=dataclasses.replace(lora, modules_to_save=(*lora.modules_to_save, *missing)),
        findings=(*spec.findings, note),
    )
