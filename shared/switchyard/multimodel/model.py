"""The catalogue of multi-model serving: resource vectors, models, pipelines, workers.

Units: ``cpu`` in cores, ``gpu`` in whole-GPU fractions (0.5 = half a GPU's compute and
memory share), ``mem_gib`` in GiB of host memory; times in seconds. A model's ``exec_s``
is its mean service time for one request on a worker of speed 1.0; a worker of speed
``v`` serves it in ``exec_s / v``.

A pipeline stage either runs one of these models (on the multi-model workers, placed by
the placement policy) or is an *LLM stage* (:class:`LlmStage`): a completion served by
the LLM workers of an LLM application, scheduled as any LLM request. Placement, the
multi-model simulator and the critical-path arithmetic see only the model stages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ZERO",
    "LlmStage",
    "ModelSpec",
    "MultiModelRequest",
    "PipelineSpec",
    "ResourceVector",
    "Stage",
    "StageCondition",
    "WorkerSpec",
    "Workload",
]


@dataclass(frozen=True, slots=True)
class ResourceVector:
    """``[cpu, gpu, mem]``: cores, GPUs (fractions allowed) and GiB of memory."""

    cpu: float
    gpu: float
    mem_gib: float

    def __post_init__(self) -> None:
        for name in ("cpu", "gpu", "mem_gib"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0.0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")

    def fits_in(self, capacity: ResourceVector) -> bool:
        """Whether this demand fits within ``capacity`` in every dimension (1e-9 slack)."""
        return (
            self.cpu <= capacity.cpu + 1e-9
            and self.gpu <= capacity.gpu + 1e-9
            and self.mem_gib <= capacity.mem_gib + 1e-9
        )

    def __add__(self, other: ResourceVector) -> ResourceVector:
        return ResourceVector(
            self.cpu + other.cpu, self.gpu + other.gpu, self.mem_gib + other.mem_gib
        )

    def __sub__(self, other: ResourceVector) -> ResourceVector:
        """Component-wise difference, floored at 0 (free capacity never goes negative)."""
        return ResourceVector(
            max(0.0, self.cpu - other.cpu),
            max(0.0, self.gpu - other.gpu),
            max(0.0, self.mem_gib - other.mem_gib),
        )

    def share_of(self, capacity: ResourceVector) -> float:
        """The largest share of ``capacity`` this vector takes in any dimension (the
        dominant share; 0 for dimensions the capacity lacks and the demand does not
        need). Example: (4 cores, 0.5 GPU, 8 GiB) of (16, 1, 64) -> max(0.25, 0.5,
        0.125) = 0.5."""
        shares = []
        for used, total in (
            (self.cpu, capacity.cpu),
            (self.gpu, capacity.gpu),
            (self.mem_gib, capacity.mem_gib),
        ):
            if total > 0:
                shares.append(used / total)
            elif used > 0:
                shares.append(math.inf)
        return max(shares, default=0.0)


ZERO = ResourceVector(0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """One servable model: what it takes while resident and how long it serves."""

    name: str
    resources: ResourceVector
    load_s: float
    """Seconds to load it onto a worker (placement cost)."""
    exec_s: float
    """Mean seconds to serve one request on a worker of speed 1.0."""
    labels: tuple[tuple[str, float], ...] = ()
    """A classifier's answers and the share of requests each gets ((label, share), the
    shares summing to 1), which a conditional stage after it can branch on; emulated
    workers and the simulator draw them (:mod:`switchyard.multimodel.branching`)."""


@dataclass(frozen=True, slots=True)
class StageCondition:
    """Run a stage only when the stage ``stage`` (one it runs after) answered ``label``."""

    stage: str
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmStage:
    """What an LLM stage asks of the LLM workers: a completion of at most
    ``output_tokens`` tokens on the outputs of the stages before it (the call's input for
    a first stage), or, with ``choices``, one of those labels (a judge: a draft's
    verifier, a router), which conditional stages after it branch on: the torch model
    answers the label it scores most likely after the prompt, an emulated worker draws
    one by the shares ((label, share), summing to 1)."""

    output_tokens: int
    choices: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    """One stage of a pipeline: a model, run after the stages named in ``after``, and
    only ``when`` an earlier stage answered a given label (always, when ``None``).

    For an LLM stage (``llm`` set) ``model`` names the LLM application that serves it
    (what an OpenAI client sends as ``model``), not a multi-model catalogue model."""

    name: str
    model: str
    after: tuple[str, ...] = ()
    when: StageCondition | None = None
    llm: LlmStage | None = None

    @property
    def labels(self) -> tuple[str, ...] | None:
        """An LLM stage's choices' labels; ``None`` for a model stage (its model's)."""
        return None if self.llm is None else tuple(label for label, _ in self.llm.choices)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineSpec:
    """An application: a DAG of stages (one stage for a single-model application).

    A stage starts when every stage in its ``after`` has finished or been skipped; a
    stage's output may feed several later stages (shared intermediate result). A stage is
    skipped when its ``when`` does not hold, or when every stage it runs after was
    skipped (:func:`switchyard.multimodel.branching.stage_runs`). A request's latency is
    the end of its last stage run minus its arrival; it meets its SLO within ``slo_s``.
    """

    name: str
    stages: tuple[Stage, ...]
    slo_s: float
    answer: tuple[str, ...] = ()
    """The stages whose output answers a call, the first of them that ran (a revision
    when there is one, else the draft); empty: the outputs of the stages run that no
    stage run after them reads."""

    def models(self) -> tuple[str, ...]:
        """The multi-model catalogue models its stages use, in stage order, without
        repeats (an LLM stage's application is not one)."""
        return tuple(dict.fromkeys(stage.model for stage in self.stages if stage.llm is None))

    def llm_applications(self) -> tuple[str, ...]:
        """The LLM applications its LLM stages run on, in stage order, without repeats."""
        return tuple(dict.fromkeys(s.model for s in self.stages if s.llm is not None))

    def llm_prompt_tokens(self, stage: Stage, input_tokens: int) -> int:
        """An LLM stage's prompt tokens as known before any stage ran: the call's input
        and the output tokens of the LLM stages it runs after (the live prompt's exact
        count depends on the text those stages answer)."""
        by_name = {s.name: s for s in self.stages}
        before = (by_name[name].llm for name in stage.after)
        return max(1, input_tokens + sum(llm.output_tokens for llm in before if llm is not None))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """One worker: its GPU type, capacity and relative speed."""

    worker_id: str
    gpu_type: str
    capacity: ResourceVector
    speed: float = 1.0
    """Service-time divisor relative to the reference GPU (2.0: twice as fast)."""


@dataclass(frozen=True, slots=True)
class MultiModelRequest:
    """One request to an application (a pipeline)."""

    request_id: str
    arrival_s: float
    pipeline: str
    exec_scale: float = 1.0
    """This request's service times relative to its models' means (a trace row's
    execution time over its model's mean; 1.0 for synthetic requests)."""
    input_tokens: int = 0
    """The call's input in tokens: what its LLM stages' prompts are built on (0: none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A catalogue and a request stream, arrivals sorted, the first at 0.0 s."""

    name: str
    models: Mapping[str, ModelSpec]
    pipelines: Mapping[str, PipelineSpec]
    requests: tuple[MultiModelRequest, ...]
    step_at_s: float | None = None
    """When the workload changes its load or mix in one step (for responsiveness), if
    it does."""
