"""The multi-model simulator's mutable state: pipelines as runnable graphs, requests in
flight, model replicas and workers (:mod:`research.multimodel.simulator` drives them)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from switchyard.multimodel.model import ModelSpec, PipelineSpec, ResourceVector, WorkerSpec
from switchyard.multimodel.snapshot import ResidentModel, WorkerState

from research.multimodel.errors import SimulationInputError

__all__ = ["PipelineRun", "Replica", "RequestRun", "Task", "WorkerRun"]


class PipelineRun:
    __slots__ = (
        "branching",
        "dependents",
        "has_model_stages",
        "indegree",
        "labels",
        "llm",
        "models",
        "name",
        "roots",
        "slo_s",
        "spec",
        "stages",
    )

    def __init__(
        self,
        spec: PipelineSpec,
        models: Mapping[str, ModelSpec],
        llm_applications: AbstractSet[str] = frozenset(),
    ) -> None:
        self.name = spec.name
        self.slo_s = spec.slo_s
        if not spec.stages:
            raise SimulationInputError(f"pipeline {spec.name!r} has no stages")
        index: dict[str, int] = {}
        for i, stage in enumerate(spec.stages):
            if stage.name in index:
                raise SimulationInputError(f"pipeline {spec.name!r}: stage {stage.name!r} twice")
            if stage.llm is not None:
                if stage.model not in llm_applications:
                    raise SimulationInputError(
                        f"pipeline {spec.name!r}: stage {stage.name!r} is an LLM stage of "
                        f"LLM application {stage.model!r}, which has no LLM workers in this "
                        f"simulation (research.multimodel.llm_stages.LlmWorkers)"
                    )
            elif stage.model not in models:
                raise SimulationInputError(
                    f"pipeline {spec.name!r}: stage {stage.name!r} names unknown model {stage.model!r}"
                )
            index[stage.name] = i
        dependents: list[list[int]] = [[] for _ in spec.stages]
        indegree = [0] * len(spec.stages)
        for i, stage in enumerate(spec.stages):
            for before in dict.fromkeys(stage.after):
                if before not in index:
                    raise SimulationInputError(
                        f"pipeline {spec.name!r}: stage {stage.name!r} runs after unknown stage {before!r}"
                    )
                dependents[index[before]].append(i)
                indegree[i] += 1
        # Kahn's algorithm: every stage must be reachable in topological order.
        left = list(indegree)
        queue = [i for i, d in enumerate(left) if d == 0]
        seen = 0
        while queue:
            i = queue.pop()
            seen += 1
            for j in dependents[i]:
                left[j] -= 1
                if left[j] == 0:
                    queue.append(j)
        if seen != len(spec.stages):
            raise SimulationInputError(f"pipeline {spec.name!r} has a cycle among its stages")
        self.models = tuple(stage.model for stage in spec.stages)
        self.stages = spec.stages
        self.labels = tuple(
            models[stage.model].labels if stage.llm is None else stage.llm.choices
            for stage in spec.stages
        )
        self.llm = tuple(stage.llm for stage in spec.stages)
        """Each stage's LLM request (``None``: a model stage)."""
        self.spec = spec
        self.has_model_stages = any(stage.llm is None for stage in spec.stages)
        # Conditional stages need what each stage answered (switchyard.multimodel.branching).
        self.branching = any(stage.when is not None for stage in spec.stages)
        self.dependents = tuple(tuple(d) for d in dependents)
        self.indegree = tuple(indegree)
        self.roots = tuple(i for i, d in enumerate(indegree) if d == 0)


_NO_LABELS: dict[str, str | None] = {}
_NONE_SKIPPED: set[str] = set()


class RequestRun:
    __slots__ = (
        "answered",
        "arrival_s",
        "deps",
        "index",
        "input_tokens",
        "left",
        "pipeline",
        "scale",
        "skipped",
    )

    def __init__(
        self,
        index: int,
        arrival_s: float,
        pipeline: PipelineRun,
        scale: float,
        input_tokens: int = 0,
    ) -> None:
        self.index = index
        self.input_tokens = input_tokens
        self.arrival_s = arrival_s
        self.pipeline = pipeline
        self.scale = scale
        self.deps = list(pipeline.indegree)
        self.left = len(pipeline.indegree)
        # Each answered stage's label and the stages skipped: a branching pipeline's only
        # (the others share these two empty ones, never written).
        self.answered: dict[str, str | None] = {} if pipeline.branching else _NO_LABELS
        self.skipped: set[str] = set() if pipeline.branching else _NONE_SKIPPED


# A stage of a request: (request, stage index).
Task = tuple[RequestRun, int]


class Replica:
    __slots__ = (
        "current",
        "current_end",
        "current_svc",
        "gone",
        "model",
        "queue",
        "queued_s",
        "ready_at",
        "resources",
        "spec",
        "worker",
    )

    def __init__(self, worker: WorkerRun, spec: ModelSpec, ready_at: float) -> None:
        self.worker = worker
        self.spec = spec
        self.model = spec.name
        self.resources = spec.resources
        self.ready_at = ready_at
        self.queue: deque[tuple[RequestRun, int, float]] = deque()
        self.queued_s = 0.0
        self.current: Task | None = None
        self.current_end = 0.0
        self.current_svc = 0.0
        self.gone = False


class WorkerRun:
    __slots__ = (
        "built",
        "busy",
        "busy_cpu",
        "busy_gpu",
        "busy_mem",
        "busy_s",
        "cap",
        "free_vec",
        "index",
        "last_s",
        "loading",
        "replicas",
        "share_at_update",
        "share_s",
        "spec",
        "utilization",
        "version",
    )

    def __init__(self, index: int, spec: WorkerSpec) -> None:
        self.index = index
        self.spec = spec
        self.cap = spec.capacity
        self.replicas: dict[str, Replica] = {}
        self.loading = 0
        self.busy = 0
        self.busy_cpu = 0.0
        self.busy_gpu = 0.0
        self.busy_mem = 0.0
        self.busy_s = 0.0
        self.share_s = 0.0
        self.last_s = 0.0
        self.share_at_update = 0.0
        self.utilization = 0.0
        # Bumped on every change of what its state shows; ``built`` is the version its
        # cached WorkerState was built at.
        self.version = 0
        self.built = -1
        self.free_vec = spec.capacity

    def share(self) -> float:
        cap = self.cap
        best = 0.0
        for used, total in (
            (self.busy_cpu, cap.cpu),
            (self.busy_gpu, cap.gpu),
            (self.busy_mem, cap.mem_gib),
        ):
            if total > 0:
                best = max(best, used / total)
            elif used > 1e-12:
                best = 1.0
        return min(1.0, best)

    def advance(self, now: float) -> None:
        dt = now - self.last_s
        if dt > 0:
            if self.busy:
                self.busy_s += dt
                self.share_s += self.share() * dt
            self.last_s = now

    def state(self, now: float) -> WorkerState:
        """The worker as placement and routing see it at ``now`` (marks it built)."""
        resident = []
        work_s = 0.0
        for replica in self.replicas.values():
            running = 1 if replica.current is not None else 0
            if running:
                work_s += max(0.0, replica.current_end - now)
            work_s += replica.queued_s
            resident.append(
                ResidentModel(
                    model=replica.model,
                    ready_at_s=replica.ready_at,
                    queued=len(replica.queue),
                    running=running,
                )
            )
        self.built = self.version
        return WorkerState(
            spec=self.spec,
            resident=tuple(resident),
            free=self.free_vec,
            queued_work_s=work_s,
            utilization=self.utilization,
        )

    def refresh_free(self) -> None:
        used_cpu = used_gpu = used_mem = 0.0
        for replica in self.replicas.values():
            r = replica.resources
            used_cpu += r.cpu
            used_gpu += r.gpu
            used_mem += r.mem_gib
        self.free_vec = self.cap - ResourceVector(used_cpu, used_gpu, used_mem)


# Event kinds, in the heap as (time, sequence, kind, payload).
