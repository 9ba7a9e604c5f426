"""Published GPU memory measurements as fitcheck inputs: each row becomes a :class:`Plan` or a :class:`Skip`.

A row of ``published_measurements.json`` describes its run in words (model, optimizer, LoRA targets, precision,
distribution, memory metric); :func:`plan_row` turns it into everything a :class:`fitcheck.spec.TrainingSpec`
needs but the parameter inventory (:func:`inventory_for`), or says why it cannot be expressed. A row whose own
numbers or source show it cannot be compared (its stated setting cannot have produced its figure, the shape of its
peak is not stated, its peak is set outside the training run) carries the reason as ``not_comparable`` in the data
file, with the source lines it rests on. The comparison itself is ``published.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from published_fields import (
    GIB,
    ModelRef,
    read_checkpointing,
    read_gpu,
    read_metric,
    read_model_ref,
    read_optimizer,
    read_precision,
    read_quant,
    read_sharding,
    read_targets,
)
from published_fields import HF_GROUPS as HF_GROUPS

from fitcheck.spec import (
    ActivationSpec,
    AttnImpl,
    BatchSpec,
    LoraSpec,
    ModelInventory,
    OptimizerSpec,
    PeftAdapterSpec,
    StackSpec,
    TrainerKind,
    TrainerSpec,
    TrainingSpec,
)

DEFAULT_DATA = Path(__file__).resolve().parent / "calibration" / "published_measurements.json"

@dataclass(frozen=True)
class Plan:
    """A row expressed as fitcheck inputs (everything but the inventory) plus what to compare."""

    row_id: str
    group: str
    model: ModelRef
    build: Callable[[ModelInventory], TrainingSpec]
    metric: str  # "allocated" | "reserved" | "used" | "resident" | "reserved-p99"
    metric_sure: bool
    measured_bytes: int | None
    outcome: str
    notes: tuple[str, ...] = ()
    stack: str = "other"  # the row's "stack": "hf" (transformers' model code + peft/TRL/Trainer) or "other"
    stated_trainable: int | None = None  # the source's own trainable-parameter count, when it gives one


@dataclass(frozen=True)
class Skip:
    """A row that cannot be expressed, with the reason."""

    row_id: str
    group: str
    reason: str
    stack: str = "other"


def load_rows(path: Path = DEFAULT_DATA) -> list[dict[str, Any]]:
    """The published rows, as a list of dicts.

    A row with ``extra_metrics`` (a source that reports several figures for one run, e.g. peft's MetaMathQA
    results: the whole-run reserved maximum, the 99th percentile of the per-step reserved, the allocated bytes
    after the step) becomes one row per figure; the extra rows' ids are ``<id>@<suffix>``.
    """
    rows = json.loads(path.read_text())
    if not isinstance(rows, list):
        raise ValueError(f"{path}: expected a JSON list of rows")
    out: list[dict[str, Any]] = []
    for row in rows:
        out.append(row)
        for extra in row.get("extra_metrics") or ():
            out.append({**row, **{k: v for k, v in extra.items() if k != "suffix"},
                        "id": f"{row['id']}@{extra['suffix']}", "extra_metrics": None})
    return out




def plan_row(row: Mapping[str, Any]) -> Plan | Skip:
    """Express one published row as fitcheck inputs, or say why it cannot be.

    Args:
        row: One entry of published_measurements.json.

    Returns:
        A :class:`Plan` (everything but the parameter inventory) or a :class:`Skip` with the reason.
    """
    rid, group, stack = str(row["id"]), str(row["source_group"]), str(row.get("stack") or "other")

    def skip(reason: str) -> Skip:
        return Skip(rid, group, reason, stack)

    if row.get("no_result"):
        return skip("no result file at the source's commit (the experiment is defined but was not run)")
    if row.get("not_comparable"):
        return skip(str(row["not_comparable"]))  # the row's own numbers or source show why (data file)
    if row.get("compile"):
        return skip("torch.compile is not modelled")

    notes: list[str] = []
    text = " ".join(str(row.get(k) or "") for k in ("location", "cpu_offload", "distributed")).lower()
    inferred = " ".join(str(x) for x in row.get("inferred") or ()).lower()
    if "activation offloading" in text:
        return skip("activation offloading to CPU is not modelled")
    if "compile flag: true" in inferred or "+ compile" in text:
        return skip("torch.compile is not modelled")
    if row.get("micro_batch_size") is None or row.get("seq_len") is None:
        return skip("micro-batch or sequence length not stated")
    method = str(row["method"]).lower()
    metric = read_metric(row)
    if isinstance(metric, str):
        return skip(metric)
    measured = row.get("memory_gib")
    if row.get("outcome") == "fits" and measured is None:
        return skip(f"reported {row.get('memory_reported')!r} has an ambiguous unit (memory_gib is null)")
    optim = read_optimizer(row)
    if optim.startswith("!"):
        return skip(optim[1:])
    ckpt = read_checkpointing(row)
    if isinstance(ckpt, str):
        return skip(ckpt)
    sharding = read_sharding(row)
    if isinstance(sharding, str):
        return skip(sharding)
    quant = read_quant(row)
    if isinstance(quant, str):
        return skip(quant)
    model = read_model_ref(row)
    if isinstance(model, str):
        return skip(model)
    lora: LoraSpec | None = None
    adapter: PeftAdapterSpec | None = None
    if row.get("peft_config"):
        read = _lora_by_fitcheck_reader(row["peft_config"])
        if isinstance(read, str):
            return skip(read)
        if isinstance(read, LoraSpec):
            lora = read
        else:  # another PEFT method: estimated from the real peft model on the default path only
            adapter = read
    elif row.get("lora"):
        lr = row["lora"]
        targets = read_targets(lr)
        if isinstance(targets, str):
            return skip(targets)
        lora = LoraSpec(
            r=int(lr["rank"]),
            alpha=float(lr.get("alpha") or lr["rank"]),
            dropout=float(lr.get("dropout") or 0.0),
            target_modules=targets,
            use_dora="dora" in method or bool(lr.get("use_dora")),
        )
        if "c_attn" in str(lr.get("targets")):
            notes.append("c_attn LoRA as q/k/v")
        if "query" in str(lr.get("targets")).lower():
            notes.append("litgpt fused qkv LoRA as q/v")
    attn_text = str(row["attention_impl"]).lower()
    attn = (
        AttnImpl.EAGER
        if "eager" in attn_text
        else (AttnImpl.FLASH_ATTENTION_2 if "flash-attention" in attn_text else AttnImpl.SDPA)
    )
    chunked = "chunked" in inferred and "standard ce" not in inferred
    # "standard"/"chunked" are not LossKind values: since issue 18 the LOSSES table refuses them (before, they fell
    # through to Cut Cross-Entropy's bytes). Both are estimated as torch cross-entropy; torchtune's chunked CE
    # upcasts one chunk of logits at a time, so for those rows the estimate is an upper bound.
    # ``use_reentrant``: the row's checkpointing is reentrant (transformers 4.35-4.x ``gradient_checkpointing_enable``
    # default ``{"use_reentrant": True}``), stated in the row with its source
    acts = ActivationSpec(checkpointing=ckpt, attn_implementation=attn, loss="torch",
                          use_reentrant=bool(row.get("use_reentrant")))
    if chunked:
        notes.append("chunked CE as torch CE (upper bound)")
    kind = str(row.get("seq_len_kind") or "").lower()
    if "unpacked" in kind or not any(w in kind for w in ("packed", "fixed", "forced")):
        notes.append("seq is a max")  # dynamic padding: the run's longest batch may be shorter
    if model.note:
        notes.append(model.note)
    if "lorafa" in str(row["optimizer"]).lower():
        notes.append("LoRA-FA freezes lora_A: fitcheck counts its gradients and moments")
    hardware = read_gpu(row)
    batch = BatchSpec(
        micro_batch=int(row["micro_batch_size"]),
        seq_len=int(row["seq_len"]),
        grad_accum=int(row.get("grad_accum") or 1),
    )
    precision = read_precision(row)
    # the library versions the run used, where the row gives them (``versions``: package -> version, with its source)
    versions = row.get("versions") or {}
    libs = StackSpec(tuple(sorted((str(k), str(v)) for k, v in versions.items())), "row") if versions else StackSpec()
    trainer = read_trainer(row, libs)
    if isinstance(trainer, str):
        return skip(trainer)

    def build(inventory: ModelInventory) -> TrainingSpec:
        from published_deepspeed import read_deepspeed_sharding

        from fitcheck.readers import inventory_for_stack

        run_sharding = sharding
        if sharding.deepspeed is not None:  # "auto" bucket sizes from the model's own hidden_size
            read = read_deepspeed_sharding(row, inventory.shape.hidden_size)
            assert not isinstance(read, str), read  # the same config was read at plan time
            run_sharding = read

        return TrainingSpec(
            # the layout the row's transformers builds, as the CLI reads it (run_args.py: families_legacy.py,
            # e.g. Mixtral's per-expert nn.Linear on transformers 4.x)
            model=inventory_for_stack(inventory, libs),
            precision=precision,
            optimizer=OptimizerSpec(name=optim),
            batch=batch,
            activations=acts,
            sharding=run_sharding,
            hardware=hardware,
            lora=lora,
            quant=quant,
            stack=libs,
            peft=adapter,
            trainer=trainer,
        )

    return Plan(
        rid,
        group,
        model,
        build,
        metric[0],
        metric[1],
        None if measured is None else int(float(measured) * GIB),
        str(row.get("outcome")),
        tuple(notes),
        stack,
        None if row.get("trainable_params") is None else int(row["trainable_params"]),
    )


def read_trainer(row: Mapping[str, Any], libs: StackSpec) -> TrainerSpec | str:
    """The row's ``trainer`` (the harness's trainer class, default the plain Trainer): ``sft`` is TRL's SFTTrainer of
    the row's trl. Before TRL 0.15 its step is the plain Trainer's and only its model preparation differs
    (``TrainerSpec.prepared_by_sft_trainer``); a later one is TRL's own SFT kind, whose step follows the release
    (``core/states/trl_adapters.py`` ``sft_loss``: the rule the CLI's ``--trainer sft`` reader applies too)."""
    from fitcheck.core.states import sft_runs_trainer_step

    name = str(row.get("trainer") or "trainer").lower()
    if name == "trainer":
        return TrainerSpec()
    if name != "sft":
        return f"trainer {name!r} is not read (rows name 'trainer' or 'sft')"
    if sft_runs_trainer_step(libs.release("trl")):
        return TrainerSpec(prepared_by_sft_trainer=True)
    return TrainerSpec(kind=TrainerKind.SFT)


def _lora_by_fitcheck_reader(peft_config: Mapping[str, Any]) -> LoraSpec | PeftAdapterSpec | str:
    """The row's ``adapter_config.json`` read by fitcheck's own reader, as ``fitcheck estimate --adapter_config``
    reads it; the reader's refusal (a PEFT method not modelled) is the skip reason."""
    import tempfile

    from fitcheck.errors import FitcheckError
    from fitcheck.readers import read_adapter_config

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adapter_config.json"
        path.write_text(json.dumps(peft_config))
        try:
            read = read_adapter_config(str(path))
            if isinstance(read, PeftAdapterSpec):  # the temporary file's name would outlive it in messages
                read = PeftAdapterSpec(read.peft_type, read.config_json, "adapter_config.json")
            return read
        except FitcheckError as exc:
            return "fitcheck's PEFT reader refuses it: " + str(exc).replace(str(path), "adapter_config.json")


def inventory_for(ref: ModelRef) -> ModelInventory:
    """The row's parameter inventory: from the built-in catalog, or from the config built from its ``arch``."""
    from fitcheck.readers import classifier_inventory, inventory_from_config, load_inventory
    from fitcheck.torch_adapters import meta_inventory

    if ref.catalog_id is not None:
        inv = load_inventory(ref.catalog_id, env={}, meta_fallback=meta_inventory)
        return inv if ref.task == "causal-lm" else classifier_inventory(inv, ref.task, ref.num_labels)
    assert ref.config is not None
    return inventory_from_config(ref.config, "published-row", "row arch (calibration data)")
