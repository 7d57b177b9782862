"""``GET /v1/requests/{call id}`` for a pipeline call: its status read from its stages.

A pipeline call has no record of its own: each stage is a request ``{call id}.{stage}``
in the request ledger, the one owner of a request's state. So the status of a call is
put together from those records: which pipeline it was is found by reading each
pipeline's first stages under the id (one read per first stage, concurrently; only when
the id is no request of its own), then every stage of that pipeline is read.

A stage with no record whose earlier stages are all settled, and whose branch their
answers rule out, reads ``skipped`` (:func:`switchyard.multimodel.branching.stage_runs`).

The call's ``status``:

- ``ok``: every stage finished ``ok`` or was skipped; ``output`` then holds the outputs
  of the stages run that nothing run after reads, as the call's own answer does.
- the status of the first stage, in pipeline order, that finished otherwise
  (``failed``, ``expired`` or ``cancelled``), with ``error`` naming that stage;
- ``running`` while some stage is assigned, running or finished and none failed;
- ``queued`` while no stage has gone further than the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from switchyard.contracts.messages import CompletionStatus
from switchyard.lifecycle import RequestLedger
from switchyard.lifecycle.record import RequestRecord, RequestStatus
from switchyard.multimodel.branching import stage_runs
from switchyard.multimodel.dag import topological_order
from switchyard.multimodel.model import PipelineSpec, Stage

from services.ingress.pipeline_call import final_outputs
from services.ingress.pipeline_llm import stage_label, stage_output
from services.ingress.tenants import public_request_id

__all__ = ["SKIPPED", "pipeline_call_status"]

SKIPPED = "skipped"
"""A stage's status when its branch was not taken (it has no record)."""


async def pipeline_call_status(
    ledger: RequestLedger, pipelines: Mapping[str, PipelineSpec], call_id: str
) -> dict[str, Any] | None:
    """The status body of pipeline call ``call_id`` (tenant-scoped), or ``None`` when
    no pipeline has a stage recorded under it."""
    firsts = [(p, s.name) for p in pipelines.values() for s in p.stages if not s.after]
    found = await asyncio.gather(*(ledger.read(f"{call_id}.{stage}") for _, stage in firsts))
    pipeline = next(
        (p for (p, _), record in zip(firsts, found, strict=True) if _is_stage_of(record, p)),
        None,
    )
    if pipeline is None:
        return None
    records = await asyncio.gather(
        *(ledger.read(f"{call_id}.{stage.name}") for stage in pipeline.stages)
    )
    by_name = dict(zip((stage.name for stage in pipeline.stages), records, strict=True))
    answered: dict[str, str | None] = {}
    skipped: set[str] = set()
    blocks: dict[str, dict[str, Any]] = {}
    outputs: dict[str, str] = {}
    failed: tuple[str, str, str | None] | None = None  # stage, status, error
    stages = {stage.name: stage for stage in pipeline.stages}
    for name in topological_order({stage.name: stage.after for stage in pipeline.stages}):
        stage, record = stages[name], by_name[name]
        block: dict[str, Any] = {
            "stage": name,
            "model": stage.model,
            "request_id": public_request_id(f"{call_id}.{name}"),
            "status": None if record is None else record.status,
            "worker_id": None if record is None else record.worker_id,
        }
        completion = None if record is None else record.completion
        if completion is not None:
            block.update(status=str(completion.status), worker_id=completion.worker_id)
            if completion.status is CompletionStatus.OK:
                answered[name] = stage_label(completion)
                outputs[name] = stage_output(completion)
            elif failed is None:
                failed = (name, str(completion.status), completion.error)
        elif (
            record is None
            and _settled(stage, answered, skipped)
            and not stage_runs(stage, answered, skipped)
        ):
            skipped.add(name)
            block["status"] = SKIPPED
        blocks[name] = block
    ordered = [blocks[stage.name] for stage in pipeline.stages]
    body: dict[str, Any] = {
        "request_id": public_request_id(call_id),
        "app": pipeline.name,
        "kind": "pipeline",
        "status": _call_status(ordered, failed),
        "stages": ordered,
    }
    if failed is not None:
        name, status, error = failed
        body["error"] = f"stage {name!r} {status}: {error or 'no reason given'}"
    elif body["status"] == RequestStatus.OK:
        body["output"] = final_outputs(pipeline, outputs)
    return body


def _settled(stage: Stage, answered: Mapping[str, str | None], skipped: set[str]) -> bool:
    """Whether every stage ``stage`` runs after was answered or skipped."""
    return all(name in answered or name in skipped for name in stage.after)


def _is_stage_of(record: RequestRecord | None, pipeline: PipelineSpec) -> bool:
    return record is not None and record.app == pipeline.name


def _call_status(stages: list[dict[str, Any]], failed: tuple[str, str, str | None] | None) -> str:
    if failed is not None:
        return failed[1]
    statuses = [block["status"] for block in stages if block["status"] != SKIPPED]
    if all(status == RequestStatus.OK for status in statuses):
        return str(RequestStatus.OK)
    if all(status in (None, RequestStatus.QUEUED) for status in statuses):
        return str(RequestStatus.QUEUED)
    return str(RequestStatus.RUNNING)
