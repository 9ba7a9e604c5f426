"""``fitcheck estimate``: per-GPU peak memory of one training step, from config.json, offline.

Flag names are those of ``transformers.TrainingArguments`` and TRL's ``ModelConfig``/``SFTConfig`` so users can
paste what they already pass to their training script (``-`` and ``_`` spellings both work, as in
HfArgumentParser). Booleans take an optional value: ``--bf16``, ``--bf16 true``, ``--gradient_checkpointing
false``. Only flags the user passed reach the readers, so files (``--training_args``, ``--deepspeed``,
``--config_file``) fill the rest and explicit flags win.

Semantics: ``--max_seq_length`` is the length of every sequence in the micro-batch (padded or packed to it:
the worst case a dataloader can produce). ``fits`` means ``device_used_bytes <= budget_bytes``, where the
budget is the GPU's memory (or ``--gpu_memory``) and ``device_used_bytes`` = peak reserved by the caching
allocator + CUDA context and library workspaces (what nvidia-smi would show).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from fitcheck.cli.trl_flags import TRL_FLAG_NAMES, add_trl_arguments, apply_trainer, split_trl_values
from fitcheck.errors import ConfigError
from fitcheck.findings import Finding
from fitcheck.report import Report
from fitcheck.spec import TrainingSpec
from fitcheck.torch_adapters import meta_inventory

_BOOL = "bool"
_LIST = "list"

# (flag, kind, help). kind: "bool" (optional true/false), "list" (one or more), or a type/None (one string).
_FLAGS: list[tuple[str, str | None, str]] = [
    # model
    (
        "model_name_or_path",
        None,
        "Hub id (built-in catalog or local HF cache), a directory with config.json, or a config.json path",
    ),
    (
        "dtype",
        None,
        "dtype the model is loaded in: auto (config.json's, transformers 5 default), bfloat16, "
        "float16, float32; alias --torch_dtype",
    ),
    ("attn_implementation", None, "eager, sdpa (default) or flash_attention_2"),
    ("task", None, "causal-lm, seq-cls, token-cls or image-text-to-text (default: from config.json architectures)"),
    ("num_labels", None, "classifier width for --task seq-cls/token-cls (default: the config's id2label, else 2)"),
    ("image_tokens", None, "vision patches per sample for image-text-to-text (before the merger; default 0)"),
    # batch
    ("per_device_train_batch_size", None, "micro-batch per GPU (default 8, as TrainingArguments)"),
    ("gradient_accumulation_steps", None, "gradient accumulation steps (default 1)"),
    (
        "max_seq_length",
        None,
        "length of EVERY sequence in the micro-batch (padded/packed to it; default 1024); alias --max_length",
    ),
    # precision / optimizer
    ("bf16", _BOOL, "bf16 mixed precision (autocast)"),
    ("fp16", _BOOL, "fp16 mixed precision (autocast)"),
    ("optim", None, "TrainingArguments.optim name (default adamw_torch_fused)"),
    ("optim_args", None, "optimizer arguments as key=value,key=value (e.g. rank=128 for GaLore)"),
    ("optim_target_modules", _LIST, "modules GaLore/APOLLO project"),
    # activations
    (
        "gradient_checkpointing",
        _BOOL,
        "activation (gradient) checkpointing; alias --activation_checkpointing",
    ),
    ("checkpoint_every_n_layers", None, "checkpoint one decoder layer in n (transformers 5 every_n_layers)"),
    (
        "loss",
        None,
        "LM loss implementation: torch (default; transformers' cross-entropy on full b x s x V logits, alias "
        "standard), liger-flce (Liger fused linear cross-entropy: no logits, a chunk buffer), cce (Apple's Cut "
        "Cross-Entropy, cce_patch: no logits)",
    ),
    ("gradient_checkpointing_kwargs", None, "JSON, e.g. '{\"use_reentrant\": false}' (every_n_layers read too)"),
    (
        "use_liger_kernel",
        _BOOL,
        "Liger-Kernel (TrainingArguments): RMSNorm, SwiGLU/GEGLU, RoPE and fused linear cross-entropy",
    ),
    (
        "liger_kernel_config",
        None,
        "JSON of Liger switches: rope, rms_norm, swiglu (geglu), fused_linear_cross_entropy, cross_entropy",
    ),
    ("activation_offloading", _BOOL, "TRL SFTConfig activation offloading: saved tensors to pinned host memory"),
    ("torch_compile", _BOOL, "TrainingArguments torch_compile (not modelled: the estimate is eager mode)"),
    # peft
    ("use_peft", _BOOL, "train LoRA adapters (TRL)"),
    ("lora_r", None, "LoRA rank (TRL default 16)"),
    ("lora_alpha", None, "LoRA alpha (TRL default 32)"),
    ("lora_dropout", None, "LoRA dropout (TRL default 0.05)"),
    ("lora_target_modules", _LIST, "module names, or all-linear (default: peft's table for the model type)"),
    (
        "lora_modules_to_save",
        _LIST,
        "modules trained in full next to the adapters (e.g. lm_head embed_tokens)",
    ),
    ("lora_target_parameters", _LIST, "parameter names for peft's ParamWrapper (fused MoE experts)"),
    ("lora_layers_to_transform", _LIST, "only these layer indices get adapters"),
    ("use_dora", _BOOL, "DoRA"),
    ("use_rslora", _BOOL, "rsLoRA"),
    ("adapter_config", None, "a PEFT adapter_config.json (LoRA settings read from it)"),
    # quantization
    ("load_in_4bit", _BOOL, "bitsandbytes 4-bit base (QLoRA)"),
    ("load_in_8bit", _BOOL, "bitsandbytes LLM.int8 base"),
    ("bnb_4bit_quant_type", None, "nf4 or fp4"),
    ("use_bnb_nested_quant", _BOOL, "double quantization (bnb_4bit_use_double_quant)"),
    (
        "bnb_4bit_quant_storage",
        None,
        "packing dtype of 4-bit weights (uint8 default; bfloat16 for FSDP-QLoRA)",
    ),
    ("bnb_4bit_compute_dtype", None, "compute dtype of 4-bit layers (default: --dtype)"),
    ("llm_int8_skip_modules", _LIST, "modules kept unquantized"),
    # partial training
    (
        "trainable_parameters",
        _LIST,
        "train only parameters matching these patterns (e.g. '*.mlp.gate.*'); layer index written as *",
    ),
    ("trainable_layers", _LIST, "train only these layer indices"),
    # distributed
    ("num_processes", None, "total processes (GPUs) over all machines, as accelerate counts them"),
    ("num_machines", None, "number of machines (nodes)"),
    ("training_args", None, "a TrainingArguments JSON or YAML file"),
    ("deepspeed", None, "a DeepSpeed JSON ('auto' values resolved as transformers does)"),
    ("config_file", None, "an accelerate config YAML (default: accelerate's default location if it exists)"),
    ("fsdp", None, "TrainingArguments fsdp string, e.g. 'full_shard auto_wrap offload'"),
    ("fsdp_config", None, "an FSDP config file (JSON/YAML)"),
    ("zero_stage", None, "DeepSpeed ZeRO stage 0-3"),
    ("offload_optimizer", None, "DeepSpeed offload_optimizer device: none, cpu, nvme"),
    ("offload_param", None, "DeepSpeed offload_param device (ZeRO-3): none, cpu, nvme"),
    # parallelism (accelerate ParallelismConfig; their product must equal --num_processes)
    ("dp_replicate_size", None, "HSDP replicas (accelerate ParallelismConfig dp_replicate_size)"),
    ("dp_shard_size", None, "FSDP2 shard group size (dp_shard_size)"),
    ("tp_size", None, "tensor parallel size: transformers tp_plan, FSDP2 (tp_size)"),
    ("cp_size", None, "context parallel size: torch ring attention over the sequence, FSDP2 (cp_size)"),
    ("sp_size", None, "sequence parallel size: DeepSpeed Ulysses/ALST (sp_size)"),
    ("sp_backend", None, "sequence parallel backend (accelerate accepts only deepspeed)"),
    ("cp_comm_strategy", None, "context parallel rotation: allgather (default) or alltoall"),
    # hardware
    (
        "gpu",
        None,
        "GPU name, e.g. H100-80GB, B200, RTX5090, or as nvidia-smi --query-gpu=name prints it (default H100-80GB)",
    ),
    ("gpu_memory", None, "memory per GPU instead of --gpu, e.g. 80GiB or 24GB"),
    ("device_type", None, "cuda (default) or cpu (live tensors only: for validation against CPU runs)"),
    ("host_memory", None, "RAM per node, to check CPU offload, e.g. 512GiB"),
    ("expandable_segments", _BOOL, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is set"),
    (
        "stack",
        None,
        "library versions to estimate for, e.g. transformers=4.46,peft=0.13 (default: the installed ones)",
    ),
    # checks
    (
        "device_map",
        None,
        "check a device_map (auto, balanced, sequential) for trainable parameters on cpu/disk",
    ),
    ("max_memory", None, "max_memory for the device_map check, e.g. 0=24GiB,cpu=200GiB"),
]

FILE_FLAGS = ("training_args", "deepspeed", "config_file", "fsdp", "fsdp_config")
TASK_FLAGS = ("task", "num_labels", "image_tokens")  # read by readers/task_heads.py, not by the merge
SHARDING_FLAGS = ("zero_stage", "offload_optimizer", "offload_param")


def add_estimate_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every estimate flag to a parser (used by ``estimate`` and ``plot``).

    Unpassed flags are absent from the namespace (``argparse.SUPPRESS``), so readers can tell explicit values
    from defaults.
    """
    aliases = {
        "dtype": ["--torch_dtype"],
        "max_seq_length": ["--max_length"],
        "gradient_checkpointing": ["--activation_checkpointing"],
        **{  # accelerate launch spells them --parallelism_config_<name>
            k: [f"--parallelism_config_{k}"]
            for k in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "sp_backend",
                      "cp_comm_strategy")
        },
    }
    for name, kind, help_text in _FLAGS:
        spellings = [f"--{name}"]
        if "_" in name:
            spellings.append(f"--{name.replace('_', '-')}")
        spellings += aliases.get(name, [])
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if kind == _BOOL:
            kwargs.update(nargs="?", const=True, metavar="true|false")
        elif kind == _LIST:
            kwargs.update(nargs="+")
        parser.add_argument(*spellings, **kwargs)
    add_trl_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="trace one training step of the real model on fake tensors for activations (needs torch); "
        "by default runs outside the formulas' checked envelope are traced when torch is installed",
    )
    parser.add_argument(
        "--no_trace",
        "--no-trace",
        dest="no_trace",
        action="store_true",
        help="never trace: answer from the formulas (a not-pinned warning outside the checked envelope)",
    )
    parser.add_argument("--mfu", type=float, default=None, help="assumed model FLOPs utilisation for timing")
    parser.add_argument("--plot", default=None, metavar="FILE", help="also draw the memory plot (PNG or SVG)")


def register(subparsers: Any) -> None:
    """Register ``fitcheck estimate``."""
    parser = subparsers.add_parser(
        "estimate",
        help="estimate per-GPU peak memory of one training step",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_estimate_arguments(parser)
    parser.set_defaults(func=run)


def explicit_values(args: argparse.Namespace) -> dict[str, object]:
    """The flags the user passed, by canonical name."""
    names = {name for name, _, _ in _FLAGS} | set(TRL_FLAG_NAMES)
    return {k: v for k, v in vars(args).items() if k in names}


def spec_from_values(
    values: Mapping[str, object], env: Mapping[str, str]
) -> tuple[TrainingSpec, tuple[str, ...]]:
    """Build the spec from explicit flag values (plus the files they name).

    Args:
        values: Explicit flags, canonical names.
        env: Environment (for the HF cache and accelerate's default config location).

    Returns:
        The spec and the assumptions made.

    Raises:
        FitcheckError: Bad input (exit 2).
    """
    from fitcheck.readers import load_inventory, merge_sources
    from fitcheck.readers import spec_from_values as build

    values, trl = split_trl_values(values)
    model = values.get("model_name_or_path")
    if not model:
        raise ConfigError(
            "--model_name_or_path is required: a Hub id such as meta-llama/Meta-Llama-3-8B, a directory with "
            "config.json, or a config.json path"
        )
    from fitcheck.readers import resolve_image_tokens, spec_for_task

    inventory = load_inventory(
        str(model), env=env, meta_fallback=meta_inventory, task=_opt_str(values.get("task")),
        num_labels=_opt_int(values.get("num_labels")),
    )
    inventory = resolve_image_tokens(inventory, values.get("image_tokens"))
    cli = {k: v for k, v in values.items() if (k not in FILE_FLAGS or k == "fsdp_config") and k not in TASK_FLAGS}
    merged = merge_sources(
        cli,
        training_args_file=_opt_str(values.get("training_args")),
        deepspeed_file=_opt_str(values.get("deepspeed")),
        accelerate_config_file=_opt_str(values.get("config_file")),
        fsdp=_opt_str(values.get("fsdp")),
        env=env,
        hidden_size=inventory.shape.hidden_size,
    )
    spec, assumptions = build(
        merged.values,
        inventory=inventory,
        sharding=merged.sharding,
        provenance=merged.provenance,
        findings=merged.findings,
    )
    if "adapter_config" in values:
        from fitcheck.readers import read_adapter_config

        spec = dataclasses.replace(spec, lora=read_adapter_config(str(values["adapter_config"])))
    try:
        spec, notes = apply_trainer(spec_for_task(spec), trl)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return spec, (*assumptions, *notes)


def _opt_str(v: object) -> str | None:
    return None if v is None else str(v)


def _opt_int(v: object) -> int | None:
    if v is None:
        return None
    try:
        return int(str(v))
    except ValueError:
        raise ConfigError(f"expected an integer, got {v!r}") from None


def spec_from_args(args: argparse.Namespace) -> tuple[TrainingSpec, tuple[str, ...]]:
    """Build the spec from a parsed namespace (reads the process environment: CLI boundary)."""
    return spec_from_values(explicit_values(args), dict(os.environ))


def build_report(
    args: argparse.Namespace,
) -> tuple[Report, dict[str, object]]:
    """Estimate for parsed flags: the report (with device-map findings) and the advisor/compute extras."""
    spec, assumptions = spec_from_args(args)
    from fitcheck.torch_adapters import PinnedPath

    if args.trace and getattr(args, "no_trace", False):
        raise ConfigError("--trace and --no_trace contradict each other; pass one of them")
    path = PinnedPath("always" if args.trace else "never" if getattr(args, "no_trace", False) else "auto")
    extra_findings: tuple[Finding, ...] = ()
    if getattr(args, "device_map", None):
        from fitcheck.torch_adapters import device_map_findings

        extra_findings = device_map_findings(spec, str(args.device_map), getattr(args, "max_memory", None))
    if extra_findings:
        spec = dataclasses.replace(spec, findings=(*spec.findings, *extra_findings))
    report = path(spec)
    gpus: tuple[Any, ...] = ()
    if getattr(args, "device_map", None):
        from fitcheck.advice import weights_only_finding
        from fitcheck.torch_adapters import multi_gpu_shares

        gpus = multi_gpu_shares(spec, str(args.device_map), getattr(args, "max_memory", None))
        if gpus:
            report = _busiest_gpu_report(report, gpus)
        note = weights_only_finding(report, str(args.device_map)) if not gpus else None
        if note is not None:
            report = dataclasses.replace(report, findings=(*report.findings, note))
    report = dataclasses.replace(report, assumptions=(*report.assumptions, *assumptions))
    extras = advice_extras(report, mfu=args.mfu, estimate_fn=path.following(report))
    if gpus:
        extras["device_map_gpus"] = [g.to_dict() for g in gpus]
    return report, extras


def _busiest_gpu_report(whole: Report, gpus: tuple[Any, ...]) -> Report:
    """The headline report of a multi-GPU device map: the busiest GPU's, with the whole model's counts and
    findings, and a verdict that needs every GPU to fit (advice/device_map_gpus.py)."""
    from fitcheck.advice import busiest
    from fitcheck.findings import Severity
    from fitcheck.units import format_bytes

    top = busiest(gpus)
    lines = ", ".join(
        f"GPU {g.device} (layers {min(g.layers)}-{max(g.layers)}{', head' if g.holds_head else ''}): "
        f"{format_bytes(g.report.device_used_bytes)} of {format_bytes(g.report.budget_bytes)}"
        if g.layers else f"GPU {g.device}: {format_bytes(g.report.device_used_bytes)}"
        for g in gpus
    )
    note = Finding(
        "device-map-per-gpu",
        Severity.INFO,
        f"naive model parallelism over {len(gpus)} GPUs: {lines}; the headline numbers are GPU {top.device}'s",
    )
    keep = [f for f in whole.findings if f.code not in ("fits", "does-not-fit")]
    verdict = [f for f in top.report.findings if f.code in ("fits", "does-not-fit")]
    return dataclasses.replace(
        top.report,
        findings=(*keep, note, *verdict),
        fits=all(g.report.fits for g in gpus),
        total_params=whole.total_params,
        trainable_params=whole.trainable_params,
    )


def advice_extras(
    report: Report, *, mfu: float | None, estimate_fn: Callable[[TrainingSpec], Report] | None = None
) -> dict[str, object]:
    """``max_micro_batch``, ``suggestions`` and ``compute`` for the JSON and the table.

    ``estimate_fn`` is the path the headline number took (``fitcheck.torch_adapters.pinned_path``): the
    largest micro-batch and every suggestion are estimated the same way.
    """
    from fitcheck.advice import advise, max_micro_batch
    from fitcheck.core import compute_estimate

    compute = compute_estimate(report.spec, mfu=mfu)
    return {
        "max_micro_batch": max_micro_batch(report.spec, estimate_fn),
        "suggestions": advise(report.spec, report, estimate_fn=estimate_fn),
        "compute": compute,
    }


def run(args: argparse.Namespace) -> int:
    """Run ``fitcheck estimate``; exit 0 fits, 1 does not fit (2 is raised as FitcheckError)."""
    from fitcheck.render import report_to_dict

    report, extras = build_report(args)
    if args.plot:
        from fitcheck.render import plot_report

        plot_report(report, args.plot)
    if args.json:
        out = report_to_dict(report)
        out.update(extras_to_json(extras))
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from fitcheck.render import make_console, print_report

        print_report(report, make_console(), extra=extras_renderables(extras))
    return 0 if report.fits else 1


def extras_to_json(extras: Mapping[str, object]) -> dict[str, object]:
    """The advisor/compute extras as JSON fields (``max_micro_batch``, ``suggestions``, ``compute``)."""
    from fitcheck.render import advice_to_dict

    out = advice_to_dict(
        extras["max_micro_batch"],  # type: ignore[arg-type]
        extras["suggestions"],  # type: ignore[arg-type]
        extras["compute"],  # type: ignore[arg-type]
    )
    if "device_map_gpus" in extras:  # multi-GPU device_map: one entry per GPU (advice/device_map_gpus.py)
        out["device_map_gpus"] = extras["device_map_gpus"]
    return out


def extras_renderables(extras: Mapping[str, object]) -> list[Any]:
    """The advisor/compute extras as rich renderables for the table output."""
    from fitcheck.render import compute_line, suggestions_table

    return [
        f"largest micro-batch that fits at this sequence length: {extras['max_micro_batch']}",
        compute_line(extras["compute"]),  # type: ignore[arg-type]
        suggestions_table(extras["suggestions"]),  # type: ignore[arg-type]
    ]
