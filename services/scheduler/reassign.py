"""Re-assigning a dead, draining or drained worker's requests, and a live one's that never
reached it (a :class:`WorkerDown`).

For a worker that died (``heartbeat-timeout``) or drained, the requests are those the
event lists plus whatever the worker's assigned set names now (another scheduler replica
may have sent it one more after the monitor looked: read again now that no decision
here can choose the worker); for one that began to drain, only what the event lists as
waiting (what runs there finishes there); for a live worker's ``unclaimed`` requests,
only those listed (the monitor took them back from the worker: their record's epoch moved
on), and the worker stays a candidate for them and for everything else.

Each is re-assigned with epoch + 1 by the request ledger's compare-and-set on the epoch
and worker it replaces: of several scheduler replicas that all see the event, one moves
each request, and a request that finished, moved or was re-assigned meanwhile is left
alone. A draining or drained worker's request that it took in (its record shows it
``running`` there) and did not list as waiting ran, or runs, there: it is not run again.

An LLM request is placed again with the LLM policy, a classification request in a
window of its own, a pipeline stage routed again by the placement policy's router
(:mod:`services.scheduler.stages`; held there until a worker holds its model).

A re-assignment continues the request's trace: it is decided inside a
``scheduler reassign`` span in the trace its record keeps, linked to the WorkerDown's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from switchyard.bus import Delivery
from switchyard.cluster import read_assigned
from switchyard.contracts.messages import InferenceRequest, LLMPayload, StagePayload, WorkerDown
from switchyard.lifecycle import RequestLedger, RequestRecord, RequestStatus
from switchyard.runtime import ServiceContext
from switchyard.telemetry import context_from_carrier

from services.scheduler.outbox import DecisionOutbox, FlushReport, Origin
from services.scheduler.stages import StageRouting

log = logging.getLogger(__name__)


class Decider(Protocol):
    """What a re-assignment needs of the scheduler replica it runs in
    (:class:`services.scheduler.service.SchedulerService`)."""

    ctx: ServiceContext
    ledger: RequestLedger
    tracer: Tracer
    stages: StageRouting

    def forget_worker(self, worker_id: str) -> None: ...

    def place_llm(
        self,
        request: InferenceRequest,
        now_s: float,
        epoch: int,
        exclude: frozenset[str],
        outbox: DecisionOutbox,
        origin: Origin | None = None,
        replaces_worker: str | None = None,
    ) -> bool: ...

    def decide_window(
        self,
        requests: list[InferenceRequest],
        outbox: DecisionOutbox,
        origins: Mapping[str, Origin],
        epoch: int = 0,
        replaces_worker: str | None = None,
    ) -> None: ...

    async def flush(self, outbox: DecisionOutbox) -> FlushReport: ...


class Reassigner:
    """Handles WorkerDown events for a scheduler replica."""

    def __init__(self, scheduler: Decider) -> None:
        self.scheduler = scheduler
        self.reassigned = 0

    async def on_worker_down(self, delivery: Delivery[WorkerDown]) -> None:
        scheduler = self.scheduler
        event = delivery.message
        unclaimed = event.reason == "unclaimed"
        if not unclaimed:
            scheduler.forget_worker(event.worker_id)
        if event.reason in ("draining", "unclaimed"):
            orphans = list(event.orphaned_request_ids)
        else:
            late = await read_assigned(scheduler.ctx.state, event.worker_id)
            orphans = list(dict.fromkeys([*event.orphaned_request_ids, *late]))
        held = None if event.held_request_ids is None else frozenset(event.held_request_ids)
        records = await asyncio.gather(*(scheduler.ledger.read(rid) for rid in orphans))
        outbox = DecisionOutbox()
        spans: list[Span] = []
        moved = 0
        for request_id, record in zip(orphans, records, strict=True):
            if not self._moves(record, event, held):
                continue
            assert record is not None
            previous = record.assignment
            if previous is None:
                log.warning("request %s has no readable assignment: not re-assigned", request_id)
                continue
            epoch = record.epoch + 1
            span = self._span(record, event)
            spans.append(span)
            origin = trace.set_span_in_context(span)
            request = previous.request
            # A live worker may take it again: the message was lost, not the worker.
            exclude = frozenset() if unclaimed else frozenset({event.worker_id})
            if isinstance(request.payload, LLMPayload):
                scheduler.place_llm(
                    request,
                    time.time(),
                    epoch,
                    exclude,
                    outbox,
                    origin,
                    replaces_worker=event.worker_id,
                )
            elif isinstance(request.payload, StagePayload):
                # Routed again (or held until a worker holds its model), never a window.
                scheduler.stages.place(
                    request,
                    time.time(),
                    outbox,
                    origin,
                    epoch=epoch,
                    exclude=exclude,
                    replaces_worker=event.worker_id,
                )
            else:
                scheduler.decide_window(
                    [request], outbox, {request_id: origin}, epoch, event.worker_id
                )
            moved += 1
        try:
            report = await scheduler.flush(outbox)
        finally:
            for span in spans:
                span.end()
        self.reassigned += len(report.assigned)
        log.info(
            "worker %s down (%s): %d of %d listed requests re-assigned here",
            event.worker_id,
            event.reason,
            len(report.assigned),
            len(orphans),
        )

    @staticmethod
    def _moves(
        record: RequestRecord | None, event: WorkerDown, held: frozenset[str] | None
    ) -> bool:
        """Whether a listed request is still this worker's to give away."""
        if record is None or record.final:
            return False
        if record.worker_id != event.worker_id:
            return False  # moved on since
        # A draining worker finishes everything it took in: one it did not list as
        # waiting ran, or runs, there, its answer still to come.
        ran_there = (
            held is not None
            and record.request_id not in held
            and record.status == RequestStatus.RUNNING
        )
        return not ran_there

    def _span(self, record: RequestRecord, event: WorkerDown) -> Span:
        """A span for one re-assignment, in the request's own trace (the context its
        decision recorded; the WorkerDown's when none was) and linked to the WorkerDown
        that caused it (the current CONSUMER span)."""
        cause = trace.get_current_span().get_span_context()
        carrier = record.trace_carrier()
        return self.scheduler.tracer.start_span(
            "scheduler reassign",
            context=context_from_carrier(carrier) if carrier else None,
            kind=SpanKind.INTERNAL,
            links=[Link(cause)] if cause.is_valid else None,
            attributes={
                "switchyard.request_id": record.request_id,
                "switchyard.epoch": record.epoch + 1,
                "switchyard.worker_id": event.worker_id,
                "switchyard.worker_down.reason": event.reason,
            },
        )
