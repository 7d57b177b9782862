"""What one round of the scheduler's decisions records and publishes.

A round (a consumed batch of requests, a retry of parked ones, a worker's death) adds
its assignments and the answers it gives itself to a :class:`DecisionOutbox`, then
flushes it: every assignment is recorded in the request ledger in one round trip
(:meth:`~switchyard.lifecycle.RequestLedger.assign_many`), and then published to its
worker's partition of ``switchyard.worker-inbox``, each inside its request's trace.

What the ledger says decides what is published:

- ``assigned``: the assignment as decided;
- ``exists``: the request was decided before (a redelivery after a crash or a partition
  move): the *recorded* assignment is sent again instead (same message id; the worker
  drops a copy it holds), so a request is never decided twice;
- ``answered``, ``superseded``: nothing (answered meanwhile; another replica re-assigned
  it first);
- ``missing``: the record is gone (expired, or the state store lost it): it is recorded
  again as accepted, then assigned.

Answers the scheduler gives itself (what a window plan answers from SneakPeek's
estimate; what no worker could serve in time) are recorded as the request's answer
(fenced on the epoch) and sent to the asking replica's partition of
``switchyard.answers``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from switchyard.bus import Bus, Delivery, Subscription
from switchyard.contracts.messages import Assignment, Completion, InferenceRequest
from switchyard.contracts.topics import ANSWERS, WORKER_INBOX
from switchyard.lifecycle import Assign, AssignOutcome, RequestLedger
from switchyard.telemetry import extract_context, trace_carrier

Origin = Delivery[InferenceRequest] | Context
"""Where a decision comes from, for tracing: the request's delivery in a batch (its
CONSUMER span), or the trace context of a request decided later."""


def trace_of(origin: Origin | None) -> Context:
    """The trace context of a decision's origin (the current one when it has none)."""
    if isinstance(origin, Delivery):
        return extract_context(origin.envelope.headers)
    return origin if origin is not None else otel_context.get_current()


@dataclass(slots=True)
class _Decided:
    item: Assign
    origin: Origin | None


@dataclass(slots=True)
class FlushReport:
    """What a flush did, for the scheduler's metrics and logs."""

    assigned: list[Assignment] = field(default_factory=list)
    resent: list[Assignment] = field(default_factory=list)
    skipped: int = 0
    unaddressed: list[str] = field(default_factory=list)
    """Request ids recorded but not sent: their worker names no inbox partition."""


class DecisionOutbox:
    """One round's decisions, in order (see the module docstring).

    Args:
        sub: the subscription whose batch is being decided (its deliveries' CONSUMER
            spans scope what is published for them); None for a round without one.
    """

    def __init__(self, sub: Subscription[InferenceRequest] | None = None) -> None:
        self._sub = sub
        self._decided: list[_Decided] = []
        self._answers: list[tuple[Completion, Origin | None, int | None]] = []

    def __bool__(self) -> bool:
        return bool(self._decided or self._answers)

    def assign(
        self,
        assignment: Assignment,
        origin: Origin | None,
        *,
        replaces_epoch: int | None = None,
        replaces_worker: str | None = None,
    ) -> None:
        """Record and send ``assignment`` (a first decision, or with the epoch and worker
        it replaces, a re-assignment)."""
        # The decision's trace is kept with the record: a re-assignment continues it.
        trace = trace_carrier(trace_of(origin)) if origin is not None else None
        self._decided.append(
            _Decided(Assign(assignment, replaces_epoch, replaces_worker, trace), origin)
        )

    def answer(
        self,
        completion: Completion,
        request: InferenceRequest,
        origin: Origin | None,
        *,
        epoch: int = 0,
    ) -> None:
        """Record an answer the scheduler gives ``request`` itself in place of its
        assignment of ``epoch`` (a first decision, or a re-assignment), and send it to
        the replica that asked."""
        # Fenced on the epoch the record shows: the one this decision would replace.
        fence = completion.model_copy(update={"epoch": max(0, epoch - 1)})
        self._answers.append((fence, origin, request.reply_partition))

    def scope(self, origin: Origin | None) -> AbstractContextManager[None]:
        """The request's CONSUMER span (a delivery of this batch), or its kept trace
        context (a request decided later); nothing when there is neither."""
        if isinstance(origin, Delivery):
            if self._sub is not None:
                return self._sub.handling(origin)
            return _attached(extract_context(origin.envelope.headers))
        if origin is not None:
            return _attached(origin)
        return nullcontext()

    async def flush(
        self,
        ledger: RequestLedger,
        bus: Bus,
        partition_of: Callable[[str], int | None],
    ) -> FlushReport:
        """Record everything, then publish it and wait for the broker (see the module
        docstring); ``partition_of`` names a worker's inbox partition."""
        report = FlushReport()
        acks: list[Awaitable[object]] = []
        if self._decided:
            outcomes = await ledger.assign_many([d.item for d in self._decided])
            outcomes = await self._recreate_missing(ledger, outcomes)
            for decided, outcome in zip(self._decided, outcomes, strict=True):
                if outcome.result == "assigned":
                    sent = decided.item.assignment
                    report.assigned.append(sent)
                elif outcome.result == "exists" and outcome.recorded is not None:
                    sent = outcome.recorded
                    report.resent.append(sent)
                else:
                    report.skipped += 1
                    continue
                partition = partition_of(sent.worker_id)
                if partition is None:
                    # Recorded on the worker: its death or drain re-assigns it.
                    report.unaddressed.append(sent.request.request_id)
                    continue
                with self.scope(decided.origin):
                    acks.append(await bus.send(WORKER_INBOX, sent, partition=partition))
        if self._answers:
            results = await ledger.finish_many(
                [completion for completion, _, _ in self._answers], worker_fenced=False
            )
            for (completion, origin, partition), result in zip(self._answers, results, strict=True):
                if result != "finished" or partition is None:
                    continue
                with self.scope(origin):
                    acks.append(await bus.send(ANSWERS, completion, partition=partition))
        if acks:
            await asyncio.gather(*acks)
        return report

    async def _recreate_missing(
        self, ledger: RequestLedger, outcomes: list[AssignOutcome]
    ) -> list[AssignOutcome]:
        missing = [
            index
            for index, outcome in enumerate(outcomes)
            if outcome.result == "missing" and self._decided[index].item.replaces_epoch is None
        ]
        if not missing:
            return outcomes
        for index in missing:
            await ledger.accept(self._decided[index].item.assignment.request)
        again = await ledger.assign_many([self._decided[i].item for i in missing])
        for index, outcome in zip(missing, again, strict=True):
            outcomes[index] = outcome
        return outcomes


@contextmanager
def _attached(context: Context) -> Iterator[None]:
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)
