"""Accepting a call's request and waiting for its answer.

How one call goes (:meth:`RequestDesk.accept`): a retry of a client-chosen
``request_id`` finds the earlier request's record and gets its answer (stored, or
awaited), or a 409 when it asks something else than the recorded request; a new request passes the admission gate when there is one (refused with 429
or 503 before anything is recorded: nothing was started), is recorded as queued in the
request ledger (calls arriving together share one round trip:
:class:`~switchyard.runtime.group_commit.GroupCommit`) and published to
``switchyard.requests`` with ``reply_to`` and ``reply_partition`` naming this replica and
the partition of ``switchyard.answers`` it reads; then the call waits for its answer
(:meth:`RequestDesk.completion`), delivered to its
:class:`~services.ingress.answers.Waiter`.

When the publish cannot be confirmed (a broker outage past ``publish_timeout_s``), the
request may still go out later, so the call is not told that nothing was started: it
gets 503 ``outcome_unknown`` naming the request id, and the record stays. A retry with
that id waits for the one answer (re-publishing the request first while it is still
queued or assigned and not started: deciding, running and answering a request are
idempotent in the ledger, so a request published twice runs once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.types import Receive
from switchyard.contracts.messages import (
    ClassificationPayload,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    OutputChunk,
)
from switchyard.lifecycle import (
    CANCELLED_BY_CLIENT,
    REQUEST_TTL_S,
    Assign,
    RequestLedger,
    RequestRecord,
    RequestStatus,
)
from switchyard.lifecycle.ledger import Accepted as LedgerAccepted
from switchyard.runtime.group_commit import GroupCommit

from services.ingress.answers import AnswerRegistry, Waiter
from services.ingress.drain import unavailable
from services.ingress.errors import SERVER_ERROR, ApiError
from services.ingress.load_shedding import AdmissionGate, Decision, Demand, Verdict
from services.ingress.responses import answer_headers, switchyard_block
from services.ingress.tenants import ANONYMOUS, Tenant, public_request_id

log = logging.getLogger("switchyard.ingress")

Publish = Callable[[InferenceRequest], Awaitable[object]]
"""Publishes a request to ``switchyard.requests``; returns once the bus stored it."""


class FirstDecisions(Protocol):
    """An ingress that places requests itself (:mod:`services.ingress.dispatch`)."""

    def refusal(self, request: InferenceRequest) -> str | None:
        """Why the placement policy's admission refuses a new request (None: it takes
        it); asked before anything is recorded."""

    def decide(self, request: InferenceRequest) -> Assign | None:
        """The first decision for a new request; None: publish it undecided."""

    async def send(self, decided: Assign) -> None:
        """Send a recorded first decision to its worker; returns once the bus stored it."""


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Limits and timings of the calls.

    Attributes:
        answer_timeout_s: longest a call waits for its answer (504 after, with the id).
        publish_timeout_s: longest publishing a request may take before the call is
            answered 503 ``outcome_unknown``.
        poll_interval_s: how often a call polls the request's record when its answer
            comes to another replica (a retry of a request served elsewhere).
    """

    answer_timeout_s: float = 300.0
    publish_timeout_s: float = 10.0
    poll_interval_s: float = 0.05


@dataclass(slots=True)
class Accepted:
    """A call's request: fresh (a waiter), or a retry (a stored answer, another call's
    request on this replica, or one being served elsewhere: polled)."""

    request_id: str
    waiter: Waiter | None = None
    stored: Completion | None = None
    record: RequestRecord | None = None


class RequestDesk:
    """Accepts requests and hands calls their answers (see the module docstring).

    Args:
        ledger: the request ledger.
        publish: stores a request on ``switchyard.requests``.
        answers: this replica's waiters; its ``instance_id`` and ``reply_partition``
            go into every request.
        options: timings.
        clock: epoch seconds.
        gate: deadline-aware admission control, or None (every valid request accepted).
        decisions: places new requests in this process (direct dispatch): a request it
            places is recorded with its decision in one round trip and sent to its
            worker; None (or a request it does not place): recorded, then ``publish``.
    """

    def __init__(
        self,
        ledger: RequestLedger,
        publish: Publish,
        answers: AnswerRegistry,
        options: CallOptions,
        *,
        clock: Callable[[], float] = time.time,
        gate: AdmissionGate | None = None,
        decisions: FirstDecisions | None = None,
    ) -> None:
        self.ledger = ledger
        self.publish = publish
        self.answers = answers
        self.options = options
        self.clock = clock
        self.gate = gate
        # Calls arriving together share one round trip to the store (group commit).
        # Each with whether its id is the client's (see RequestLedger.accept).
        self._accepts: GroupCommit[tuple[InferenceRequest, bool], LedgerAccepted] = GroupCommit(
            lambda items: ledger.accept_many([r for r, _ in items], [n for _, n in items])
        )
        self.decisions = decisions
        self._accepts_decided: GroupCommit[tuple[Assign, bool], LedgerAccepted] = GroupCommit(
            lambda items: ledger.accept_decided_many([a for a, _ in items], [n for _, n in items])
        )

    def request(
        self,
        request_id: str,
        app: str,
        payload: LLMPayload | ClassificationPayload,
        arrival_s: float,
        deadline_s: float | None,
        priority: int,
        tenant: Tenant = ANONYMOUS,
    ) -> InferenceRequest:
        """The request of a call, addressed back to this replica."""
        return InferenceRequest(
            request_id=request_id,
            app=app,
            payload=payload,
            arrival_s=arrival_s,
            deadline_s=deadline_s,
            priority=priority,
            tenant=tenant.name,
            reply_to=self.answers.instance_id,
            reply_partition=self.answers.reply_partition,
        )

    async def accept(
        self,
        client_id: str | None,
        make_request: Callable[[str], InferenceRequest],
        *,
        stream: bool,
        demand: Demand | None = None,
        what: str = "",
        tenant: Tenant = ANONYMOUS,
    ) -> Accepted:
        """Record and publish a request, or find the earlier one a retry names.

        A new request passes the admission gate first with ``demand``; ``what`` names
        its model or application in a refusal. One round trip to the store in the common
        case: the ledger's accept creates the record or returns the earlier one; a
        refusal looks for an earlier one first (a retry of an accepted request gets its
        answer, it is not judged again). The request is recorded under its id scoped by
        ``tenant`` (:mod:`services.ingress.tenants`)."""
        request_id = tenant.scoped(client_id or f"req-{uuid.uuid4().hex}")
        if self.gate is not None and demand is not None:
            decision = self.gate.decide(demand, self.clock(), request_id)
            if not decision.admitted:
                earlier = await self.read(request_id) if client_id is not None else None
                if earlier is not None:
                    _same_call_or_conflict(earlier, make_request(request_id))
                    return await self._existing(earlier, stream=stream)
                log.debug(
                    "refused request %s for %s: %s",
                    request_id,
                    what,
                    decision.reason,
                    extra={"event": "admission_refused", "verdict": str(decision.verdict)},
                )
                raise refusal(decision, what)
        request = make_request(request_id)
        refused = self.decisions.refusal(request) if self.decisions is not None else None
        if refused is not None:
            self._forget(request_id)
            earlier = await self.read(request_id) if client_id is not None else None
            if earlier is not None:
                _same_call_or_conflict(earlier, request)
                return await self._existing(earlier, stream=stream)
            log.debug(
                "refused request %s for %s: %s",
                request_id,
                what,
                refused,
                extra={"event": "admission_refused", "verdict": "ttft_objective_unattainable"},
            )
            raise unattainable(refused, what)
        decided = self.decisions.decide(request) if self.decisions is not None else None
        waiter = self.answers.register(request_id, stream=stream)
        try:
            named = client_id is not None
            if decided is not None:
                accepted = await self._accepts_decided.submit((decided, named))
            else:
                accepted = await self._accepts.submit((request, named))
        except Exception as exc:
            self.answers.release(waiter)
            self._forget(request_id)
            raise unavailable(f"the state store is unavailable: {exc}") from None
        if accepted.restoring:
            self.answers.release(waiter)
            self._forget(request_id)
            raise restoring(public_request_id(request_id))
        if not accepted.accepted:
            # A retry: the earlier request's answer. Another call's use of the id is a 409.
            self.answers.release(waiter)
            self._forget(request_id)
            assert accepted.record is not None
            _same_call_or_conflict(accepted.record, request)
            return await self._existing(accepted.record, stream=stream)
        try:
            # asyncio.timeout, not wait_for: the publish runs in this call's task (no task
            # per call, and its trace context is the call's).
            async with asyncio.timeout(self.options.publish_timeout_s):
                if decided is not None and self.decisions is not None:
                    await self.decisions.send(decided)
                else:
                    await self.publish(request)
        except Exception as exc:
            self.answers.release(waiter)
            reason = str(exc) or type(exc).__name__
            log.warning("could not confirm the publish of request %s: %s", request_id, reason)
            public_id = public_request_id(request_id)
            raise ApiError(
                503,
                f"request {public_id} may or may not have been queued ({reason}); retry "
                f"with the same request_id to get its one answer",
                type_=SERVER_ERROR,
                code="outcome_unknown",
                headers={"Retry-After": "1"},
                extra={"switchyard": {"request_id": public_id, "status": "unknown"}},
            ) from None
        return Accepted(request_id, waiter=waiter)

    def _forget(self, request_id: str) -> None:
        """An admitted request was not accepted: the gate learns nothing from its id."""
        if self.gate is not None:
            self.gate.forget(request_id)

    async def read(self, request_id: str) -> RequestRecord | None:
        """The ledger's record of ``request_id`` (scoped), or None; 503 (retry shortly)
        while the state store cannot be read."""
        try:
            return await self.ledger.read(request_id)
        except Exception as exc:
            raise unavailable(f"the state store is unavailable: {exc}") from None

    async def _existing(self, record: RequestRecord, *, stream: bool) -> Accepted:
        """A retry of a request already recorded."""
        request_id = record.request_id
        if record.final and (completion := record.completion) is not None:
            return Accepted(request_id, stored=completion, record=record)
        if self.answers.is_waited_for(request_id):
            # The first call still waits on this replica: wait with it.
            waiter = self.answers.register(request_id, stream=stream)
            # The answer may have come between the read above and registering.
            again = await self.ledger.read(request_id)
            if again is not None and again.final and (completion := again.completion):
                self.answers.release(waiter)
                return Accepted(request_id, stored=completion, record=again)
            return Accepted(request_id, waiter=waiter, record=record)
        if (
            record.status in (RequestStatus.QUEUED, RequestStatus.ASSIGNED)
            and (request := record.request) is not None
        ):
            # Maybe never published, or decided but its assignment never sent (its call
            # got "outcome unknown"): publish it now. If it went out after all, the
            # ledger decides it once and the worker runs it once (a decided request gets
            # its recorded assignment again, and a worker starts an assignment once).
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.options.publish_timeout_s):
                    await self.publish(request)
        return Accepted(request_id, record=record)  # served elsewhere: poll the record

    async def completion(
        self, accepted: Accepted, timeout_s: float, receive: Receive | None = None
    ) -> Completion | None:
        """The completion, or None when it did not come within ``timeout_s``.

        With the call's ``receive``, a client that goes away while its request waits
        cancels the request if it has not started (nothing runs it; a started one runs
        on and its answer is recorded), and the call ends with :func:`client_gone`."""
        if accepted.stored is not None:
            return accepted.stored
        if accepted.waiter is not None and receive is not None:
            gone = asyncio.ensure_future(_disconnected(receive))
            try:
                answer = await accepted.waiter.completion_unless(gone, timeout_s)
            finally:
                gone.cancel()
            if answer is None and gone.done() and not gone.cancelled() and not gone.exception():
                await self._cancel(accepted.request_id)
            return answer
        if accepted.waiter is not None:
            return await accepted.waiter.completion(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                record = await self.ledger.read(accepted.request_id)
            except Exception as exc:
                log.warning("polling request %s failed: %s", accepted.request_id, exc)
                record = None
            if record is not None and record.final and (completion := record.completion):
                return completion
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(self.options.poll_interval_s, left))

    async def first_event(
        self, request_id: str, waiter: Waiter, timeout_s: float, receive: Receive
    ) -> OutputChunk | Completion | None:
        """The first chunk or the completion of a streamed call (``waiter`` streams), or
        None when neither came within ``timeout_s``; a client that goes away first cancels the request as
        :meth:`completion` does (a streamed answer's headers wait for its first chunk)."""
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            event = await waiter.next_event_unless(gone, timeout_s)
        finally:
            gone.cancel()
        if event is None and gone.done() and not gone.cancelled() and not gone.exception():
            await self._cancel(request_id)
        return event

    async def _cancel(self, request_id: str) -> None:
        outcome: str
        try:
            outcome = await self.ledger.cancel(
                request_id, self.clock(), "the client disconnected before it started"
            )
        except Exception as exc:
            outcome = f"not cancelled ({exc})"
        log.info(
            "the client of request %s went away: %s",
            request_id,
            outcome,
            extra={"event": "client_gone", "outcome": outcome},
        )
        raise client_gone()

    def release(self, accepted: Accepted) -> None:
        """The call is done with its waiter (answered, failed or gone)."""
        if accepted.waiter is not None:
            self.answers.release(accepted.waiter)

    def timeout(self, request_id: str) -> ApiError:
        """The 504 of a call whose answer did not come in time."""
        request_id = public_request_id(request_id)
        return ApiError(
            504,
            f"no answer for request {request_id} within {self.options.answer_timeout_s:g} s; "
            f"it was accepted and may still finish: poll GET /v1/requests/{request_id}",
            type_=SERVER_ERROR,
            code="answer_timeout",
            headers=answer_headers(request_id, emulated=False),
            extra={"switchyard": {"request_id": request_id, "status": "pending"}},
        )


def client_gone() -> ApiError:
    """How a call ends whose client went away (nginx's 499 "client closed request"); no
    one reads it, the logs and metrics count it. A new error each time: a raised
    exception keeps its traceback, so one shared instance would keep frames alive."""
    return ApiError(499, "the client closed the connection before the answer", code="client_closed")


async def _disconnected(receive: Receive) -> None:
    """Return once the client closed its connection (the body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def status_error(completion: Completion, deadline_s: float | None) -> ApiError | None:
    """The error answer of a completion that is not ``ok``; None when it is."""
    rid = completion.request_id
    extra = {"switchyard": switchyard_block(completion, deadline_s)}
    headers = answer_headers(rid, emulated=completion.emulated)
    if completion.status is CompletionStatus.OK:
        return None
    if completion.status is CompletionStatus.EXPIRED:
        return ApiError(
            504,
            f"request {rid} expired: its deadline passed before it was served"
            + (f" ({completion.error})" if completion.error else ""),
            type_=SERVER_ERROR,
            code="deadline_expired",
            headers=headers,
            extra=extra,
        )
    if completion.worker_id == CANCELLED_BY_CLIENT:
        return ApiError(
            409,
            f"request {rid} was cancelled: {completion.error or 'its client went away'}; "
            f"nothing ran it, so send it again with a new request_id",
            param="request_id",
            code="request_cancelled",
            headers=headers,
            extra=extra,
        )
    what = "failed" if completion.status is CompletionStatus.FAILED else "was cancelled"
    return ApiError(
        502,
        f"request {rid} {what} on worker {completion.worker_id}: "
        f"{completion.error or 'no reason given'}",
        type_=SERVER_ERROR,
        code="worker_failed" if completion.status is CompletionStatus.FAILED else "cancelled",
        headers=headers,
        extra=extra,
    )


_NOT_ASKED = {"stream", "ttft_slo_s"}
"""Payload fields a retry may change: whether it streams, and what the ingress adds from
its configuration (the application's objective, which a redeploy may change)."""


def _same_call_or_conflict(record: RequestRecord, request: InferenceRequest) -> None:
    """Nothing when ``request`` asks what the recorded one asked (a retry: the same
    application, model, prompt or features, output limit and priority; whether it
    streams, and its deadline, may differ); else the 409 of an id reused for another
    request, as payment APIs answer a reused idempotency key: never the other's answer."""
    earlier = record.request
    if earlier is None:
        return
    if (
        earlier.app == request.app
        and earlier.priority == request.priority
        and earlier.payload.model_dump(exclude=_NOT_ASKED)
        == request.payload.model_dump(exclude=_NOT_ASKED)
    ):
        return
    raise ApiError(
        409,
        f"request_id {public_request_id(record.request_id)!r} was used for a different request (another "
        f"application, model, prompt, features, max_tokens or priority); a retry must "
        f"repeat the request exactly, and a new request needs a new request_id",
        param="request_id",
        code="request_id_reused",
    )


def restoring(request_id: str) -> ApiError:
    """The 503 of a call naming its id while the state store's answers are being
    restored: accepting it now could run an answered request again."""
    return ApiError(
        503,
        f"the state store lost its data and the answers are being restored from the "
        f"broker: a call naming its request_id ({request_id!r}) cannot be accepted until "
        f"then, or an answered request could run again; retry shortly",
        type_=SERVER_ERROR,
        code="state_restoring",
        headers={"Retry-After": "2"},
    )


def unattainable(reason: str, what: str) -> ApiError:
    """The 400 of a request the placement policy's admission refused because no worker
    can give it its first token within its application's objective: retrying the same
    request will not help; nothing was recorded or published."""
    return ApiError(
        400,
        f"{what} cannot give this request its first token within the application's "
        f"objective: {reason}; nothing was started. A shorter prompt can be served",
        param="prompt",
        code="ttft_objective_unattainable",
    )


def refusal(
    decision: Decision, what: str, *, judged_on: str = "on the least-loaded worker"
) -> ApiError:
    """The answer to a request the admission gate refused: 429 (overloaded) or 503 (no
    live worker), both with ``Retry-After``; nothing was recorded or published.
    ``judged_on`` says where the estimated wait and service are (a pipeline call's are
    its stages' critical path)."""
    retry = str(decision.retry_after_s)
    if decision.verdict is Verdict.NO_WORKER:
        return ApiError(
            503,
            f"no live worker serves {what} ({decision.reason}); nothing was started, "
            f"retry after {retry} s",
            type_=SERVER_ERROR,
            code="no_worker",
            headers={"Retry-After": retry},
        )
    return ApiError(
        429,
        f"{what} is overloaded: the estimated wait is {decision.wait_s:.2f} s plus "
        f"{decision.service_s:.2f} s of service {judged_on}, more than the "
        f"{max(0.0, decision.time_left_s):.2f} s left to the request's deadline; nothing "
        f"was started, retry after {retry} s",
        type_=SERVER_ERROR,
        code="overloaded",
        headers={"Retry-After": retry},
        extra={
            "switchyard": {
                "estimated_wait_s": round(decision.wait_s, 4),
                "estimated_service_s": round(decision.service_s, 4),
                "time_left_s": round(decision.time_left_s, 4),
                "retry_after_s": decision.retry_after_s,
            }
        },
    )


__all__ = [
    "REQUEST_TTL_S",
    "Accepted",
    "CallOptions",
    "Publish",
    "RequestDesk",
    "refusal",
    "status_error",
    "unattainable",
]
