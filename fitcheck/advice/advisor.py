"""Changes that make a run fit (or run faster when it fits with room), ranked by their cost (pure).

Each candidate is the user's frozen spec with one or two changes applied through ``dataclasses.replace``,
estimated again; when it still does not fit at the requested micro-batch, the micro-batch is lowered to the
largest that fits and gradient accumulation raised so that the global batch is kept
(:func:`fitcheck.advice.batch_search.plan_global_batch`). Every suggestion carries the ``fitcheck estimate``
flags that describe it (appended to the same command, a later flag overrides an earlier one), its own
estimate, and its time per token relative to the current run (``fitcheck.core.compute``).

Ranking (best first): fitting before not fitting; then by what the change costs besides time, in tiers —
(1) the same training, computed differently (micro-batch/accumulation, checkpointing, attention kernel,
chunked loss, ZeRO, offload); (2) different optimizer numerics (8-bit states); (3) a different method (LoRA,
QLoRA); (4) more hardware (more GPUs); (5) different data (a shorter sequence length: the last resort); then
by relative step time; then fewer changes; then the larger micro-batch (better GPU utilisation, which the
FLOPs model does not capture).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from fitcheck.advice.advisor_changes import CKPT_WORDS, GPUS_PER_NODE, TIER_ORDER, Lever, Tier, levers
from fitcheck.advice.batch_search import (
    EstimateFn,
    fits_with_margin,
    max_micro_batch,
    plan_global_batch,
    with_micro_batch,
)
from fitcheck.advice.parallel_levers import parallel_levers
from fitcheck.core import ComputeEstimate, compute_estimate, relative_time_per_token
from fitcheck.core.kernels import deepspeed_quant_storage_problem
from fitcheck.core.states import check_peft_adapter
from fitcheck.report import Report
from fitcheck.spec import DeepSpeedSpec, ShardingSpec, Strategy, TrainingSpec

__all__ = ["Suggestion", "Tier", "advise"]


@dataclass(frozen=True)
class Suggestion:
    """One change to the run, with its own estimate.

    Attributes:
        title: What the change is, in one line.
        argv: ``fitcheck estimate`` flags that, appended to the same command, describe the suggested run.
        changes: What to change, in the user's terms (TrainingArguments field, DeepSpeed key, accelerate
            flag).
        peak_allocated_bytes: Its estimated ``max_memory_allocated``.
        device_used_bytes: Its estimated device memory used (what must fit the budget).
        fits: Whether it fits.
        relative_step_time: Time to train on the same tokens, relative to the current run (1.0 = same).
        host_bytes: Host RAM it needs per node (offload).
        tier: What it costs besides time.
        micro_batch: Its micro-batch.
        grad_accum: Its gradient accumulation.
        notes: Caveats (global batch changed, effects not modelled).
        spec: The suggested spec (not serialised).
    """

    title: str
    argv: tuple[str, ...]
    changes: tuple[str, ...]
    peak_allocated_bytes: int
    device_used_bytes: int
    fits: bool
    relative_step_time: float
    host_bytes: int
    tier: Tier
    micro_batch: int
    grad_accum: int
    notes: tuple[str, ...] = ()
    spec: TrainingSpec | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (an entry of ``suggestions`` in ``fitcheck estimate --json``)."""
        return {
            "title": self.title,
            "argv": list(self.argv),
            "changes": list(self.changes),
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "device_used_bytes": self.device_used_bytes,
            "fits": self.fits,
            "relative_step_time": round(self.relative_step_time, 4),
            "host_bytes": self.host_bytes,
            "tier": self.tier.value,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "notes": list(self.notes),
        }


def _default_estimate() -> EstimateFn:
    from fitcheck.core import estimate

    return estimate


def _batch_changes(spec: TrainingSpec, micro: int, gas: int) -> tuple[str, ...]:
    words = [f"TrainingArguments per_device_train_batch_size={micro}, gradient_accumulation_steps={gas}"]
    if spec.sharding.strategy is Strategy.DEEPSPEED:
        n = spec.data_parallel_size
        words.append(
            f"DeepSpeed train_micro_batch_size_per_gpu={micro}, gradient_accumulation_steps={gas}, "
            f'train_batch_size={micro * gas * n} (or "auto" for all three)'
        )
    return tuple(words)


def merge_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """Each flag once: a flag given again (two levers, or a lever and the batch plan, both setting
    ``--gradient_accumulation_steps``) keeps its last value, as argparse would, at its first place.

    A flag is a token starting with ``--``; the tokens after it up to the next flag are its values.
    """
    order: list[str] = []
    values: dict[str, list[str]] = {}
    current: str | None = None
    for token in argv:
        if token.startswith("--"):
            current = token.split("=", 1)[0].replace("-", "_").lstrip("_")
            if current not in values:
                order.append(current)
            values[current] = [token]
        elif current is not None:
            values[current].append(token)
    return tuple(t for name in order for t in values[name])


class _Evaluator:
    def __init__(self, spec: TrainingSpec, est: EstimateFn, margin: float, mfu: float | None) -> None:
        self.spec = spec
        self.est = est
        self.margin = margin
        self.mfu = mfu
        self.base_compute = compute_estimate(spec, mfu=mfu)

    def compute(self, spec: TrainingSpec) -> ComputeEstimate:
        return compute_estimate(spec, mfu=self.mfu)

    def make(
        self,
        title: str,
        tier: Tier,
        spec: TrainingSpec,
        argv: Sequence[str],
        changes: Sequence[str],
        notes: Sequence[str],
        *,
        lower_micro: bool = True,
    ) -> Suggestion:
        report = self.est(spec)
        argv, changes, notes = list(argv), list(changes), list(notes)
        ok = fits_with_margin(report, self.margin)
        if not ok and lower_micro and spec.batch.micro_batch > 1:
            m = max_micro_batch(spec, self.est, self.margin)
            if m >= 1:
                plan = plan_global_batch(spec, m)
                spec = with_micro_batch(spec, plan.micro_batch, plan.grad_accum)
                report = self.est(spec)
                ok = fits_with_margin(report, self.margin)
                argv += [
                    "--per_device_train_batch_size",
                    str(plan.micro_batch),
                    "--gradient_accumulation_steps",
                    str(plan.grad_accum),
                ]
                changes += _batch_changes(spec, plan.micro_batch, plan.grad_accum)
                title += (
                    f"{', ' if title else ''}micro-batch {plan.micro_batch} × accumulation {plan.grad_accum}"
                    + (" (global batch kept)" if plan.exact else "")
                )
                if plan.note:
                    notes.append(plan.note)
        rel = relative_time_per_token(self.base_compute, self.compute(spec))
        return Suggestion(
            title=title[:1].upper() + title[1:],
            argv=merge_flags(argv),
            changes=tuple(changes),
            peak_allocated_bytes=report.peak_allocated_bytes,
            device_used_bytes=report.device_used_bytes,
            fits=ok,
            relative_step_time=rel,
            host_bytes=report.host_bytes,
            tier=tier,
            micro_batch=spec.batch.micro_batch,
            grad_accum=spec.batch.grad_accum,
            notes=tuple(notes),
            spec=spec,
        )

    def levers(self, levers: Sequence[Lever]) -> Suggestion:
        spec = self.spec
        for lever in levers:
            spec = lever.apply(spec)
        tier = max((lv.tier for lv in levers), key=TIER_ORDER.__getitem__)
        return self.make(
            " + ".join(lv.title for lv in levers),
            tier,
            spec,
            [a for lv in levers for a in lv.argv],
            [c for lv in levers for c in lv.changes],
            [x for lv in levers for x in lv.notes],
        )


def _plain_peft_run(spec: TrainingSpec) -> bool:
    """Whether a lever's spec is still a run a non-LoRA PEFT adapter is estimated for (``check_peft_adapter``)."""
    from fitcheck.errors import NotModelledError

    try:
        check_peft_adapter(spec)
    except NotModelledError:
        return False
    return True


def _more_gpus(ev: _Evaluator) -> Suggestion | None:
    spec = ev.spec
    n = spec.data_parallel_size
    stage = max(spec.sharding.zero_stage or 0, 3)
    if spec.sharding.strategy is Strategy.FSDP or spec.peft is not None:  # ZeRO-3: not with a non-LoRA adapter
        return None
    for factor in (2, 4, 8, 16, 32, 64):
        new_n = n * factor
        machines = max(spec.sharding.num_machines, -(-new_n // GPUS_PER_NODE))
        while new_n % machines:
            machines += 1
        gas = spec.batch.grad_accum
        notes: list[str] = []
        argv = ["--num_processes", str(new_n), "--zero_stage", str(stage)]
        if machines != spec.sharding.num_machines:
            argv += ["--num_machines", str(machines)]
        if gas % factor == 0:
            gas //= factor
        else:
            notes.append(f"global batch grows {factor}× (accumulation {gas} is not divisible by {factor})")
        sharding = ShardingSpec(
            strategy=Strategy.DEEPSPEED,
            num_processes=new_n,
            num_machines=machines,
            deepspeed=replace(spec.sharding.deepspeed or DeepSpeedSpec(), stage=stage),
        )
        cand = with_micro_batch(replace(spec, sharding=sharding), spec.batch.micro_batch, gas)
        if deepspeed_quant_storage_problem(cand):  # refused under DeepSpeed (core/kernels/module_cast.py)
            return None
        argv += ["--gradient_accumulation_steps", str(gas)]
        changes = [
            f"accelerate launch --num_processes {new_n}"
            + (f" --num_machines {machines}" if machines > 1 else "")
            + f" with DeepSpeed ZeRO-{stage} (deepspeed_config.zero_stage: {stage})",
            *_batch_changes(cand, cand.batch.micro_batch, gas),
        ]
        title = f"{new_n} GPUs with ZeRO-{stage}"
        s = ev.make(title, Tier.HARDWARE, cand, argv, changes, notes, lower_micro=False)
        if s.fits:
            return s
    return None


def _shorter_sequence(ev: _Evaluator) -> Suggestion | None:
    spec = ev.spec
    step = 256  # a multiple of 256 keeps tensor-core friendly shapes
    if spec.batch.seq_len <= step:
        return None

    def ok(seq: int) -> bool:
        cand = replace(spec, batch=replace(spec.batch, seq_len=seq, micro_batch=1))
        return fits_with_margin(ev.est(cand), ev.margin)

    lo, hi = 0, spec.batch.seq_len // step  # in units of `step`; hi does not fit (else the run would)
    if not ok(step):
        return None
    lo = 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid * step):
            lo = mid
        else:
            hi = mid
    seq = lo * step
    cand = replace(spec, batch=replace(spec.batch, seq_len=seq))
    return ev.make(
        f"max_seq_length {seq} instead of {spec.batch.seq_len}",
        Tier.DATA,
        cand,
        ["--max_seq_length", str(seq)],
        [f"max_seq_length={seq} (TRL SFTConfig max_length; truncate or pack to it)"],
        ["last resort: longer samples are truncated, so the model sees less context"],
    )


def _improvements(ev: _Evaluator, report: Report) -> list[Suggestion]:
    """When the run fits: faster settings that still fit."""
    spec = ev.spec
    out: list[Suggestion] = []
    if spec.activations.checkpointing:
        cand = replace(spec, activations=replace(spec.activations, checkpointing=False))
        s = ev.make(
            "no gradient checkpointing",
            Tier.SAME_TRAINING,
            cand,
            ["--gradient_checkpointing", "false"],
            [CKPT_WORDS.replace("True", "False")],
            ["no recomputation in backward"],
        )
        if s.fits and s.relative_step_time < 1.0:
            out.append(s)
    m = max_micro_batch(spec, ev.est, ev.margin)
    if spec.batch.grad_accum > 1 and m > spec.batch.micro_batch:
        plan = plan_global_batch(spec, m)
        if plan.micro_batch > spec.batch.micro_batch:
            cand = with_micro_batch(spec, plan.micro_batch, plan.grad_accum)
            s = ev.make(
                f"micro-batch {plan.micro_batch} × accumulation {plan.grad_accum}"
                + (" (global batch kept)" if plan.exact else ""),
                Tier.SAME_TRAINING,
                cand,
                [
                    "--per_device_train_batch_size",
                    str(plan.micro_batch),
                    "--gradient_accumulation_steps",
                    str(plan.grad_accum),
                ],
                _batch_changes(cand, plan.micro_batch, plan.grad_accum),
                [
                    f"largest micro-batch that fits is {m}; larger micro-batches usually raise GPU "
                    "utilisation (not in the FLOPs model)",
                    *([plan.note] if plan.note else []),
                ],
                lower_micro=False,
            )
            if s.fits:
                out.append(s)
    return out


def _rank_key(s: Suggestion) -> tuple[bool, int, float, int, int]:
    return (not s.fits, TIER_ORDER[s.tier], round(s.relative_step_time, 3), len(s.changes), -s.micro_batch)


def advise(
    spec: TrainingSpec,
    report: Report,
    estimate_fn: EstimateFn | None = None,
    limit: int = 8,
    *,
    safety_margin: float = 0.0,
    mfu: float | None = None,
) -> tuple[Suggestion, ...]:
    """Suggestions for a run, best first (see the module docstring for the ranking).

    When the run does not fit: single changes, pairs of changes where no single one fits at the requested
    micro-batch, each with the micro-batch lowered (accumulation raised) until it fits; then more GPUs, then a
    shorter sequence length. When it fits: turning checkpointing off and a larger micro-batch, if they fit.

    Args:
        spec: The run.
        report: Its estimate.
        estimate_fn: The estimator (default ``fitcheck.core.estimator.estimate``).
        limit: Most suggestions returned.
        safety_margin: Fraction of the GPU budget a suggestion must leave free.
        mfu: Assumed MFU for the time ratios (see ``fitcheck.core.compute``).

    Returns:
        Suggestions, fitting ones first.
    """
    est = estimate_fn or _default_estimate()
    ev = _Evaluator(spec, est, safety_margin, mfu)
    if fits_with_margin(report, safety_margin):
        return tuple(sorted(_improvements(ev, report), key=_rank_key)[:limit])

    candidates: list[Suggestion] = []
    identity = ev.make("", Tier.SAME_TRAINING, spec, [], [], [])
    if identity.argv:  # only the micro-batch changed
        candidates.append(identity)
    options = [*levers(spec, report), *parallel_levers(spec)]
    if spec.peft is not None:  # a non-LoRA PEFT adapter: a plain (DDP) run only (core/states/peft_adapter.py)
        options = [lv for lv in options if _plain_peft_run(lv.apply(spec))]
    # no DeepSpeed lever over a 4-bit base packed in a float dtype the engine would cast (core/kernels/module_cast.py)
    options = [lv for lv in options if not deepspeed_quant_storage_problem(lv.apply(spec))]
    singles: dict[str, Suggestion] = {}
    for lever in options:
        s = ev.levers([lever])
        singles[lever.key] = s
        candidates.append(s)
    enough = {k for k, s in singles.items() if s.fits and s.micro_batch == spec.batch.micro_batch}
    for a, b in itertools.combinations(options, 2):
        if a.group == b.group or a.key in enough or b.key in enough:
            continue
        if (
            TIER_ORDER[a.tier] > TIER_ORDER[Tier.OPTIMIZER_NUMERICS]
            and TIER_ORDER[b.tier] > TIER_ORDER[Tier.OPTIMIZER_NUMERICS]
        ):
            continue
        s = ev.levers([a, b])
        best_single = max((singles[k].micro_batch for k in (a.key, b.key) if singles[k].fits), default=0)
        if s.fits and s.micro_batch > best_single:
            candidates.append(s)
    if not any(c.fits and TIER_ORDER[c.tier] <= TIER_ORDER[Tier.METHOD] for c in candidates):
        for extra in (_more_gpus(ev), _shorter_sequence(ev)):
            if extra is not None:
                candidates.append(extra)
    unique: list[Suggestion] = []  # specs hold dicts (unhashable): compare by equality
    for s in sorted(candidates, key=_rank_key):
        if s.spec is not None and any(u.spec == s.spec for u in unique):
            continue
        unique.append(s)
    kept = [s for s in unique if not any(_dominates(u, s) for u in unique if u is not s)]
    return tuple(kept[:limit])


def _flag_pairs(s: Suggestion) -> frozenset[tuple[str, str]]:
    """The suggestion's flags as (flag, value) pairs (a bare boolean flag has value "")."""
    pairs: list[tuple[str, str]] = []
    for i, token in enumerate(s.argv):
        if token.startswith("--"):
            nxt = s.argv[i + 1] if i + 1 < len(s.argv) else ""
            pairs.append((token, "" if nxt.startswith("--") else nxt))
    return frozenset(pairs)


def _dominates(a: Suggestion, b: Suggestion) -> bool:
    """``a`` asks for a strict subset of ``b``'s changes and is no worse in memory, time or verdict."""
    return (
        _flag_pairs(a) < _flag_pairs(b)
        and a.device_used_bytes <= b.device_used_bytes
        and a.relative_step_time <= b.relative_step_time
        and (a.fits or not b.fits)
    )
