"""``GET /v1/requests/{call id}`` for a pipeline call: its status read from its stages.

A pipeline call has no record of its own: each stage is a request ``{call id}.{stage}``
in the request ledger, the one owner of a request's state. So the status of a call is
put together from those records: which pipeline it was is found by reading each
pipeline's first stages under the id (one read per first stage, concurrently; only when
the id is no request of its own), then every stage of that pipeline is read.

The call's ``status``:

- ``ok``: every stage finished ``ok``; ``output`` then holds the outputs of the stages
  nothing runs after, as the call's own answer does.
- the status of the first stage, in pipeline order, that finished otherwise
  (``failed``, ``expired`` or ``cancelled``), with ``error`` naming that stage;
- ``running`` while some stage is assigned, running or finished and none failed;
- ``queued`` while no stage has gone further than the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from switchyard.contracts.messages import CompletionStatus, StageResult
from switchyard.lifecycle import RequestLedger
from switchyard.lifecycle.record import RequestRecord, RequestStatus
from switchyard.multimodel.model import PipelineSpec

from services.ingress.tenants import public_request_id

__all__ = ["pipeline_call_status"]


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
    stages: list[dict[str, Any]] = []
    outputs: dict[str, str] = {}
    failed: tuple[str, str, str | None] | None = None  # stage, status, error
    feeding = {name for stage in pipeline.stages for name in stage.after}
    for stage, record in zip(pipeline.stages, records, strict=True):
        block: dict[str, Any] = {
            "stage": stage.name,
            "model": stage.model,
            "request_id": public_request_id(f"{call_id}.{stage.name}"),
            "status": None if record is None else record.status,
            "worker_id": None if record is None else record.worker_id,
        }
        completion = None if record is None else record.completion
        if completion is not None:
            block.update(status=str(completion.status), worker_id=completion.worker_id)
            if completion.status is not CompletionStatus.OK and failed is None:
                failed = (stage.name, str(completion.status), completion.error)
            result = completion.result
            if stage.name not in feeding and isinstance(result, StageResult):
                outputs[stage.name] = result.output
        stages.append(block)
    body: dict[str, Any] = {
        "request_id": public_request_id(call_id),
        "app": pipeline.name,
        "kind": "pipeline",
        "status": _call_status(stages, failed),
        "stages": stages,
    }
    if failed is not None:
        name, status, error = failed
        body["error"] = f"stage {name!r} {status}: {error or 'no reason given'}"
    elif body["status"] == RequestStatus.OK:
        body["output"] = outputs
    return body


def _is_stage_of(record: RequestRecord | None, pipeline: PipelineSpec) -> bool:
    return record is not None and record.app == pipeline.name


def _call_status(stages: list[dict[str, Any]], failed: tuple[str, str, str | None] | None) -> str:
    if failed is not None:
        return failed[1]
    statuses = [block["status"] for block in stages]
    if all(status == RequestStatus.OK for status in statuses):
        return str(RequestStatus.OK)
    if all(status in (None, RequestStatus.QUEUED) for status in statuses):
        return str(RequestStatus.QUEUED)
    return str(RequestStatus.RUNNING)
