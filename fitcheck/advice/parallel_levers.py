"""Parallelism levers: context, sequence and tensor parallel sizes on the same GPUs (pure).

Each lever re-divides the run's processes (``--num_processes`` stays) between data parallelism and one
model-parallel axis, the way accelerate's ``ParallelismConfig`` does:

- ``cp_size k`` (torch ring attention, FSDP2): each rank holds ``seq / k`` tokens; FSDP shards over
  ``dp_shard x cp``, so the model states stay as sharded as before;
- ``sp_size k`` (DeepSpeed Ulysses, the DeepSpeed runs' counterpart);
- ``tp_size k`` (transformers ``tp_plan`` with FSDP2) for families that have a plan, within one node.

The data-parallel size drops by ``k``; gradient accumulation is raised by ``k`` so the global batch (and the
tokens per optimizer step) stay the same. Only layouts that pass accelerate's checks
(:func:`fitcheck.core.parallelism.layout_problems`) are offered. Their step time includes the layout's
collectives (``fitcheck.core.compute``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from fitcheck.advice.advisor_changes import GPUS_PER_NODE, Lever, Tier
from fitcheck.core.parallelism import layout_problems
from fitcheck.spec import FsdpSpec, ParallelismSpec, Strategy, TrainingSpec


def _argv(par: ParallelismSpec) -> tuple[str, ...]:
    out: list[str] = []
    for name, size in par.as_dict().items():
        out += [f"--{name}_size", str(size)]
    return tuple(out)


def _words(par: ParallelismSpec) -> str:
    sizes = ", ".join(f"{name}_size={size}" for name, size in par.as_dict().items() if size > 1)
    yaml = ", ".join(f"parallelism_config_{name}_size: {size}" for name, size in par.as_dict().items())
    return (
        f"TrainingArguments(parallelism_config=ParallelismConfig({sizes or 'dp_shard_size=1'})) or the accelerate "
        f"config's parallelism_config section ({yaml})"
    )


def _candidate(spec: TrainingSpec, par: ParallelismSpec, fsdp: bool, k: int) -> TrainingSpec:
    sh = spec.sharding
    if fsdp and sh.strategy is not Strategy.FSDP:
        sh = replace(sh, strategy=Strategy.FSDP, fsdp=FsdpSpec(), deepspeed=None)
    sh = replace(sh, parallelism=par)
    return replace(spec, sharding=sh, batch=replace(spec.batch, grad_accum=spec.batch.grad_accum * k))


def _apply(spec: TrainingSpec, *, par: ParallelismSpec, fsdp: bool, k: int) -> TrainingSpec:
    return _candidate(spec, par, fsdp, k)


def parallel_levers(spec: TrainingSpec) -> list[Lever]:
    """Context/sequence/tensor-parallel layouts of the same processes, each as a :class:`Lever`.

    Args:
        spec: The run.

    Returns:
        Levers whose layouts accelerate would accept (none for a single process).
    """
    n = spec.sharding.num_processes
    if n < 2:
        return []
    cur = spec.sharding.parallelism
    rep = cur.dp_replicate if cur is not None else 1
    strategy = spec.sharding.strategy
    fs = spec.sharding.fsdp
    fsdp2 = strategy is Strategy.FSDP and (fs is None or fs.version == 2)
    out: list[Lever] = []
    sizes = [k for k in (2, 4, 8, 16, 32, 64) if k <= n and n % (k * rep) == 0]
    for k in sizes:
        rest = n // (rep * k)
        options: list[tuple[str, ParallelismSpec, bool, str]] = []
        if strategy is Strategy.DEEPSPEED:
            options.append(("sp", ParallelismSpec(sp=k), False, "DeepSpeed Ulysses sequence parallel"))
        elif strategy in (Strategy.FSDP, Strategy.DDP) and (fsdp2 or strategy is Strategy.DDP):
            options.append(("cp", ParallelismSpec(dp_replicate=rep, dp_shard=rest, cp=k), True,
                            "context parallel (ring attention)"))
            if k <= GPUS_PER_NODE and rest > 1:
                options.append(("tp", ParallelismSpec(dp_replicate=rep, dp_shard=rest, tp=k), True,
                                "tensor parallel"))
        for axis, par, fsdp, what in options:
            if cur is not None and cur.as_dict() == par.as_dict():
                continue
            cand = _candidate(spec, par, fsdp, k)
            if layout_problems(cand):
                continue
            argv = [*_argv(par), "--gradient_accumulation_steps", str(cand.batch.grad_accum)]
            changes = [_words(par)]
            if fsdp and strategy is not Strategy.FSDP:
                argv = ["--fsdp", "full_shard auto_wrap", *argv]
                changes.insert(0, "FSDP2 full_shard (accelerate config distributed_type: FSDP, fsdp_version: 2)")
            out.append(
                Lever(
                    f"{axis}{k}",
                    f"{what} over {k} GPUs ({axis}_size {k})",
                    Tier.SAME_TRAINING,
                    partial(_apply, par=par, fsdp=fsdp, k=k),
                    tuple(argv),
                    tuple(changes),
                    "parallelism",
                    (
                        f"data-parallel size {n // (rep * (cur.non_data_parallel if cur else 1))} -> {n // (rep * k)}: "
                        f"gradient accumulation x{k} keeps the global batch",
                    ),
                )
            )
    return out
