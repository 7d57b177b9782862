"""One pipeline call's state as its stages run, and its answer.

:class:`PipelineCall` is what :mod:`services.ingress.pipelines` coordinates: the stages
started (each a :class:`StageRun`, its request and answer), the ones skipped, and which
are ready next. :func:`pipeline_answer` is the 200 body of a call whose stages all
finished ``ok`` or were skipped, and :func:`final_outputs` the outputs it carries (also
read back by ``GET /v1/requests/{call id}``, :mod:`services.ingress.pipeline_status`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span
from switchyard.contracts.messages import Completion
from switchyard.multimodel.model import PipelineSpec, Stage

from services.ingress.calls import Accepted
from services.ingress.pipeline_llm import stage_label, stage_output
from services.ingress.tenants import Tenant, public_request_id

__all__ = ["PipelineCall", "StageRun", "final_outputs", "pipeline_answer", "stage_blocks"]


@dataclass(slots=True)
class StageRun:
    """One stage of one call: its request and what became of it."""

    spec: Stage
    request_id: str
    accepted: Accepted | None = None
    span: Span | None = None
    completion: Completion | None = None

    @property
    def output(self) -> str:
        return stage_output(self.completion)


@dataclass(slots=True)
class PipelineCall:
    """One pipeline call being coordinated.

    ``arrival_s`` and ``deadline_s`` are the first call's when this one is a retry (read
    back from its first stages' records)."""

    call_id: str
    pipeline: PipelineSpec
    tenant: Tenant
    input: str
    exec_scale: float
    arrival_s: float
    deadline_s: float
    slo_s: float
    """The SLO in wall seconds (the catalogue's model seconds over the time scale)."""
    stages: dict[str, StageRun] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    """Stages whose branch was not taken (:func:`switchyard.multimodel.branching.stage_runs`)."""

    @property
    def public_id(self) -> str:
        return public_request_id(self.call_id)

    def answered(self) -> dict[str, str | None]:
        """Each answered stage's label (``None``: not a classifier)."""
        return {
            name: stage_label(run.completion)
            for name, run in self.stages.items()
            if run.completion is not None
        }

    def ready(self) -> list[Stage]:
        """The stages neither started nor skipped whose ``after`` stages are all answered
        or skipped, in pipeline order."""
        done = self.skipped | {n for n, run in self.stages.items() if run.completion is not None}
        return [
            stage
            for stage in self.pipeline.stages
            if stage.name not in self.stages
            and stage.name not in self.skipped
            and all(name in done for name in stage.after)
        ]

    def pending(self) -> list[StageRun]:
        """The stages started and not answered."""
        return [run for run in self.stages.values() if run.completion is None]


def stage_blocks(call: PipelineCall) -> Iterator[dict[str, Any]]:
    """Each answered stage, in pipeline order: who served it, how, and when."""
    for stage in call.pipeline.stages:
        run = call.stages.get(stage.name)
        if run is None or run.completion is None:
            continue
        completion = run.completion
        t = completion.timeline
        yield {
            "stage": stage.name,
            "model": stage.model,
            "request_id": public_request_id(run.request_id),
            "status": str(completion.status),
            "label": stage_label(completion),
            "worker_id": completion.worker_id,
            "worker_type": completion.worker_type,
            "emulated": completion.emulated,
            "arrival_s": t.arrival_s,
            "assigned_s": t.assigned_s,
            "started_s": t.started_s,
            "finished_s": t.finished_s,
            "latency_s": None if t.finished_s is None else t.finished_s - t.arrival_s,
            "execution_s": t.execution_s(),
        }


def final_outputs(pipeline: PipelineSpec, outputs: Mapping[str, str]) -> dict[str, str]:
    """The call's answer (``outputs``: each stage run's output by name): the first stage
    of the pipeline's ``answer`` that ran, or without one, the stages run that no stage
    run after them reads, in pipeline order."""
    for name in pipeline.answer:
        if name in outputs:
            return {name: outputs[name]}
    ran = [stage for stage in pipeline.stages if stage.name in outputs]
    feeding = {name for stage in ran for name in stage.after}
    return {stage.name: outputs[stage.name] for stage in ran if stage.name not in feeding}


def pipeline_answer(call: PipelineCall, now_s: float) -> dict[str, Any]:
    """The answer of a call whose stages all finished ``ok`` or were skipped (a branch
    not taken, listed in ``skipped``): ``output`` holds the outputs of the stages run that
    no stage run after them reads, by stage name; ``latency_s`` runs from the
    call's arrival to its last stage's finish (``now_s`` when no stage says when it
    finished) and ``slo_s`` is what it is judged by, both wall seconds."""
    runs = [call.stages[stage.name] for stage in call.pipeline.stages if stage.name in call.stages]
    finished = [
        run.completion.timeline.finished_s
        for run in runs
        if run.completion is not None and run.completion.timeline.finished_s is not None
    ]
    latency_s = (max(finished) if finished else now_s) - call.arrival_s
    return {
        "id": call.public_id,
        "object": "pipeline.result",
        "created": int(call.arrival_s),
        "app": call.pipeline.name,
        "output": final_outputs(call.pipeline, {run.spec.name: run.output for run in runs}),
        "stages": list(stage_blocks(call)),
        "skipped": [stage.name for stage in call.pipeline.stages if stage.name in call.skipped],
        "latency_s": latency_s,
        "slo_s": call.slo_s,
        "deadline_s": call.deadline_s,
        "met_slo": call.arrival_s + latency_s <= call.deadline_s,
        "emulated": any(run.completion is not None and run.completion.emulated for run in runs),
    }
