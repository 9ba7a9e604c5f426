"""The itemised result of an estimate: components, phases, the peak, the verdict and findings.

A component says how many bytes it holds in each phase of a training step; the peak is the largest
per-phase sum of the components that live in torch's caching allocator. Rendering (table, JSON, plot) is
separate (``fitcheck.render``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from fitcheck.findings import REFUSED_CODES, Finding, Severity
from fitcheck.spec import TrainingSpec


class Phase(str, Enum):
    """Points in one training step where memory can peak (steady state: step >= 2)."""

    FORWARD_END = "end of forward"
    BACKWARD_START = "start of backward"
    BACKWARD = "during backward"
    OPTIMIZER_STEP = "optimizer step"
    GENERATION = "generation"  # GRPO's generate() for the generation batch (fitcheck.core.trainers)
    EVALUATION = "evaluation"  # an evaluation step (fitcheck.core.trainers)
    LOAD = "load"  # from_pretrained and the preparation before step 1 (fitcheck.core.loading)
    SAVE = "save"  # Trainer.save_model's gathers (fitcheck.core.saving)


def phase_phrase(phase: Phase) -> str:
    """The phase as words after "the peak is": ``"during backward"``, ``"at the optimizer step"``."""
    return phase.value if phase.value.startswith("during") else f"at the {phase.value}"


# The phases of the training step; LOAD/GENERATION/EVALUATION/SAVE apply only where a component fills them.
PHASES: tuple[Phase, ...] = tuple(
    p for p in Phase if p not in (Phase.GENERATION, Phase.EVALUATION, Phase.LOAD, Phase.SAVE))
EXTRA_PHASES: tuple[Phase, ...] = (Phase.LOAD, Phase.GENERATION, Phase.EVALUATION, Phase.SAVE)


def phases_of(components: tuple[Component, ...]) -> tuple[Phase, ...]:
    """The training phases plus the extra phases some component fills."""
    extra = tuple(p for p in EXTRA_PHASES if any(p in c.by_phase for c in components))
    return (*PHASES, *extra)


class Category(str, Enum):
    """What a component is."""

    WEIGHTS = "weights"
    ADAPTERS = "adapters"
    QUANT_META = "quantization metadata"
    GRADIENTS = "gradients"
    OPTIMIZER = "optimizer states"
    MASTER = "master weights"
    ACTIVATIONS = "activations"
    LOGITS = "logits and loss"
    TEMPORARIES = "temporaries"
    BUFFERS = "communication buffers"
    OVERHEAD = "overhead"


class Location(str, Enum):
    """Where a component's bytes live."""

    DEVICE = "device"  # torch's caching allocator on the GPU: counted by max_memory_allocated
    DEVICE_OTHER = "device (outside torch's allocator)"  # CUDA context, cuBLAS workspace, managed memory
    HOST = "host"  # CPU RAM (offload), per node


@dataclass(frozen=True)
class Component:
    """One itemised memory consumer.

    Attributes:
        name: Stable dotted name, e.g. ``"weights.frozen"``, ``"optimizer.states"``, ``"logits.grad"``.
        category: What it is.
        location: Where it lives.
        by_phase: Bytes alive in each phase (missing phase = 0).
        source: Where the number comes from (library source, paper, measurement in this repo).
        detail: Short human explanation (e.g. "6.98e9 params x 2 B (bfloat16)").
    """

    name: str
    category: Category
    location: Location
    by_phase: Mapping[Phase, int]
    source: str
    detail: str = ""

    @classmethod
    def persistent(
        cls,
        name: str,
        category: Category,
        nbytes: int,
        source: str,
        detail: str = "",
        location: Location = Location.DEVICE,
    ) -> Component:
        """A component alive in every phase (weights, optimizer states, ...)."""
        return cls(name, category, location, {p: int(nbytes) for p in PHASES}, source, detail)

    @property
    def peak_bytes(self) -> int:
        """Largest bytes over phases."""
        return max(self.by_phase.values(), default=0)

    def at(self, phase: Phase) -> int:
        """Bytes alive in a phase."""
        return int(self.by_phase.get(phase, 0))


@dataclass(frozen=True)
class Report:
    """The estimate for one training run, on the busiest GPU.

    Attributes:
        spec: The spec that was estimated.
        components: Every component (device, outside-allocator and host).
        peak_phase: The phase that sets the peak.
        peak_allocated_bytes: What ``torch.cuda.max_memory_allocated`` would report.
        peak_reserved_bytes: What ``torch.cuda.max_memory_reserved`` would report.
        device_used_bytes: Reserved + CUDA context, workspaces and managed memory (what nvidia-smi shows).
        budget_bytes: Memory of one GPU.
        host_bytes: Host RAM needed per node (offloaded states, pinned buffers).
        fits: ``device_used_bytes <= budget_bytes`` (and host fits when host memory is known).
        findings: Everything to tell the user, worst first.
        regime: Which precision/optimizer regime applies, in words.
        trainable_params: Trainable parameter count (adapters included).
        total_params: Parameter count of the model as loaded (adapters included).
        assumptions: Lines that state what was assumed (defaults taken, spellings read).
        pinned: The activations come from a trace, or from formulas checked against traces for this kind of
            run (``fitcheck.core.activations.envelope``).
    """

    spec: TrainingSpec
    components: tuple[Component, ...]
    peak_phase: Phase
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    device_used_bytes: int
    budget_bytes: int
    host_bytes: int
    fits: bool
    findings: tuple[Finding, ...]
    regime: str
    trainable_params: int
    total_params: int
    assumptions: tuple[str, ...] = field(default=())
    pinned: bool = False

    def phase_totals(self, location: Location = Location.DEVICE) -> dict[Phase, int]:
        """Sum of component bytes per phase for one location (generation/evaluation where they apply)."""
        return {
            p: sum(c.at(p) for c in self.components if c.location is location)
            for p in phases_of(self.components)
        }

    def at_peak(self) -> dict[str, int]:
        """Component name -> bytes alive in the peak phase (device) or at peak (other locations)."""
        out: dict[str, int] = {}
        for c in self.components:
            value = c.at(self.peak_phase) if c.location is Location.DEVICE else c.peak_bytes
            if value:
                out[c.name] = value
        return out

    @property
    def headroom_bytes(self) -> int:
        """Budget minus device used (negative when it does not fit)."""
        return self.budget_bytes - self.device_used_bytes

    @property
    def errors(self) -> tuple[Finding, ...]:
        """Findings of severity error."""
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def refused(self) -> tuple[Finding, ...]:
        """Error findings that mean a library refuses the run outright (``fitcheck.findings.REFUSED_CODES``)."""
        return tuple(f for f in self.errors if f.code in REFUSED_CODES)

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for this report: 2 a library refuses the run, 1 it does not fit or an error
        finding stands, 0 it fits with no error."""
        if self.refused:
            return 2
        return 0 if self.fits and not self.errors else 1
