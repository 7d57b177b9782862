"""The request ledger: every change of a request's record goes through here.

A request lives through ``queued -> assigned -> running -> answered`` (``ok``,
``failed``, ``expired`` or ``cancelled``), with ``assigned`` entered again by each
re-assignment (a worker died or drained) and each move (a migration); see
:mod:`switchyard.lifecycle.record` for the fields. Each transition is one atomic script
on the state store (:mod:`switchyard.lifecycle.scripts`), and the ``_many`` forms run a
whole consumed batch in one round trip.

Who calls what:

- the ingress :meth:`RequestLedger.accept`\\ s a call's request (or finds the earlier one
  a retry names) and :meth:`~RequestLedger.read`\\ s records for status and retries;
- the scheduler :meth:`~RequestLedger.assign`\\ s (a first decision, or a re-assignment
  with the epoch it replaces), and answers directly with
  :meth:`~RequestLedger.finish_many` (``worker_fenced=False``) what a window plan gives
  itself or what no worker can serve;
- the monitor :meth:`~RequestLedger.disown_many`\\ s what a live worker was sent and
  never took in (its heartbeats do not list it), for the scheduler to re-assign, and
  :meth:`~RequestLedger.restore_many`\\ s the answers read back from the answers topic
  after the store lost its data, and
  :meth:`~RequestLedger.restore_requests_many`\\ s the requests and assignments read back
  from theirs;
- a worker :meth:`~RequestLedger.start_many`\\ s what it takes in and
  :meth:`~RequestLedger.finish_many`\\ es what it ran; a worker that moves a request
  assigns it to the target with its own epoch as the one it replaces.

Example::

    ledger = RequestLedger(state)
    if (await ledger.accept(request)).accepted:
        ...  # publish it
    outcome = (await ledger.assign_many([Assign(assignment)]))[0]
    (await ledger.start_many([Fence(request_id, epoch, worker_id)]))[0]  # "started"
    (await ledger.finish_many([completion]))[0]  # "finished"
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    InferenceRequest,
    LLMPayload,
    RequestTimeline,
)
from switchyard.lifecycle import scripts
from switchyard.lifecycle.record import REQUEST_TTL_S, RequestRecord, RequestStatus
from switchyard.state import keys
from switchyard.state.base import StateStore

RECENT_WINDOW = 100
"""How many of the latest completions ``cluster:stats`` field ``recent`` keeps (the
simulator's default ``violation_window``)."""


def completion_violated(completion: Completion) -> bool:
    """Whether ``completion`` missed its SLO: it has a deadline and either expired or
    finished after it. Completions without a deadline never count."""
    deadline_s = completion.deadline_s
    if deadline_s is None:
        return False
    if completion.status is CompletionStatus.EXPIRED:
        return True
    finished_s = completion.timeline.finished_s
    return finished_s is not None and finished_s > deadline_s


@dataclass(frozen=True, slots=True)
class Accepted:
    """What :meth:`RequestLedger.accept` found: a new request (``accepted``), the record
    of the earlier one with that id, or, for a request naming its id, that the store
    lost its data and its answers are being restored (``restoring``: not accepted, try
    again shortly)."""

    accepted: bool
    record: RequestRecord | None = None
    restoring: bool = False


@dataclass(frozen=True, slots=True)
class Assign:
    """One assignment to record.

    Attributes:
        assignment: the decision (worker, variant, epoch, ...).
        replaces_epoch: None for a request's first decision (it must still be queued);
            else the epoch this one replaces (a re-assignment or a move), which the record
            must still show.
        replaces_worker: the worker the record must still name (a move, a re-assignment
            after a death); None: any. Its assigned set loses the request.
        trace: the decision's ``traceparent``/``tracestate``.
    """

    assignment: Assignment
    replaces_epoch: int | None = None
    replaces_worker: str | None = None
    trace: Mapping[str, str] | None = None


AssignResult = Literal["assigned", "answered", "exists", "superseded", "missing"]


@dataclass(frozen=True, slots=True)
class AssignOutcome:
    """What became of one :class:`Assign`.

    ``assigned``: recorded. ``exists``: a first decision for a request decided before
    (a redelivery): ``recorded`` is that earlier assignment, to be sent again.
    ``answered``: it has its answer already. ``superseded``: the record no longer shows
    the epoch (or worker) it replaces. ``missing``: there is no record (expired, or the
    state store lost it).
    """

    result: AssignResult
    epoch: int | None = None
    worker_id: str | None = None
    recorded: Assignment | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """A worker's claim on a request: the epoch and worker its assignment names."""

    request_id: str
    epoch: int
    worker_id: str


StartResult = Literal["started", "running", "answered", "superseded", "missing"]
"""``started``: go. ``running``: this worker (an earlier incarnation of it) started it
already; do not run it again. ``answered``, ``superseded``: do not run it. ``missing``:
there is no record to fence on (expired, or the state store lost it)."""

CancelResult = Literal["cancelled", "running", "answered", "missing"]
"""``cancelled``: answered as cancelled, nothing will run it. ``running``: it started
already and will finish. ``answered``: it had its answer. ``missing``: no record."""

CANCELLED_BY_CLIENT = "client"
"""The ``worker_id`` of the answer a request gets when its client went away first."""

FinishResult = Literal["finished", "duplicate", "superseded"]
"""``finished``: the answer is recorded. ``duplicate``: an answer was recorded before,
and the record still names this answer's epoch (and worker). ``superseded``: the request
was given to another worker or epoch since, answered or not: discard it."""


class RequestLedger:
    """The transitions of requests' records on one state store (see the module docs).

    Args:
        state: the store holding ``request:{id}`` and the assigned sets.
        ttl_s: how long a record lives after its last change.
    """

    def __init__(self, state: StateStore, *, ttl_s: float = REQUEST_TTL_S) -> None:
        self.state = state
        self.ttl_s = ttl_s
        self._ttl_ms = str(max(1, math.ceil(ttl_s * 1000)))

    # -- reading -------------------------------------------------------------------------

    async def read(self, request_id: str) -> RequestRecord | None:
        """The record of ``request_id``; None when there is none (unknown or expired)."""
        fields = await self.state.hgetall(keys.request(request_id))
        return RequestRecord.from_fields(request_id, fields) if fields else None

    # -- accept ----------------------------------------------------------------------------

    async def accept(self, request: InferenceRequest, *, named: bool = False) -> Accepted:
        """Record ``request`` as queued, unless a record with its id exists: then that
        record (a retry, or another call's use of the id). ``named``: its id is the
        client's (an idempotency key), so it is refused while the store is without its
        generation marker (:data:`~switchyard.state.keys.STATE_GENERATION`: the data was
        lost and the answers are not restored yet)."""
        return (await self.accept_many([request], [named]))[0]

    async def accept_many(
        self, requests: Sequence[InferenceRequest], named: Sequence[bool] | None = None
    ) -> list[Accepted]:
        """:meth:`accept` for several requests in one round trip; a result each, in order
        (``named``: a flag each, none named when not given)."""
        flags = named if named is not None else [False] * len(requests)
        calls = []
        for request, flag in zip(requests, flags, strict=True):
            args = [self._ttl_ms, "1" if flag else ""]
            for field, value in acceptance_fields(request).items():
                args += (field, value)
            calls.append(([keys.request(request.request_id), keys.STATE_GENERATION], args))
        replies = await self.state.run_script_many(scripts.ACCEPT, calls)
        return [_accepted(request, reply) for request, reply in zip(requests, replies, strict=True)]

    async def accept_decided_many(
        self, items: Sequence[Assign], named: Sequence[bool] | None = None
    ) -> list[Accepted]:
        """:meth:`accept` for new requests and their first decisions at once (an ingress
        that places requests itself): each record is created ``assigned`` under epoch 0,
        as :meth:`assign_many` would leave it, in one round trip for all; a request
        whose id has a record gets that record, and nothing of its decision is kept."""
        flags = named if named is not None else [False] * len(items)
        calls = []
        for item, flag in zip(items, flags, strict=True):
            assignment = item.assignment
            request = assignment.request
            trace = item.trace or {}
            fields = {
                **acceptance_fields(request),
                "status": RequestStatus.ASSIGNED.value,
                "epoch": str(assignment.epoch),
                "worker_id": assignment.worker_id,
                "decision": assignment.model_dump_json(exclude={"request"}),
                "traceparent": trace.get("traceparent", ""),
                "tracestate": trace.get("tracestate", ""),
            }
            args = [
                self._ttl_ms,
                request.request_id,
                repr(assignment.assigned_at_s),
                "1" if flag else "",
            ]
            for field, value in fields.items():
                args += (field, value)
            calls.append(
                (
                    [
                        keys.request(request.request_id),
                        keys.assigned(assignment.worker_id),
                        keys.STATE_GENERATION,
                    ],
                    args,
                )
            )
        replies = await self.state.run_script_many(scripts.ACCEPT_DECIDED, calls)
        return [
            _accepted(item.assignment.request, reply)
            for item, reply in zip(items, replies, strict=True)
        ]

    # -- assign ----------------------------------------------------------------------------

    async def assign(self, item: Assign) -> AssignOutcome:
        """Record one assignment (see :class:`Assign` and :class:`AssignOutcome`)."""
        return (await self.assign_many([item]))[0]

    async def assign_many(self, items: Sequence[Assign]) -> list[AssignOutcome]:
        """Record assignments in one round trip; an outcome each, in order."""
        calls = [self._assign_call(item) for item in items]
        replies = await self.state.run_script_many(scripts.ASSIGN, calls)
        return [_assign_outcome(item, reply) for item, reply in zip(items, replies, strict=True)]

    def _assign_call(self, item: Assign) -> tuple[list[str], list[str]]:
        assignment = item.assignment
        request_id = assignment.request.request_id
        leaving = item.replaces_worker or assignment.worker_id
        trace = item.trace or {}
        return (
            [
                keys.request(request_id),
                keys.assigned(assignment.worker_id),
                keys.assigned(leaving),
            ],
            [
                self._ttl_ms,
                request_id,
                str(assignment.epoch),
                assignment.worker_id,
                "" if item.replaces_epoch is None else str(item.replaces_epoch),
                item.replaces_worker or "",
                repr(assignment.assigned_at_s),
                assignment.model_dump_json(exclude={"request"}),
                trace.get("traceparent", ""),
                trace.get("tracestate", ""),
            ],
        )

    async def hand_over(self, worker_id: str, request_ids: Sequence[str]) -> None:
        """Take requests out of a dead or drained worker's assigned set once a WorkerDown
        listed them (the scheduler re-assigns them from there): what remains in the set
        afterwards was sent to the worker later, and the monitor's sweep lists it."""
        if request_ids:
            await self.state.zrem(keys.assigned(worker_id), *request_ids)

    async def disown_many(
        self, worker_id: str, request_ids: Sequence[str], assigned_by_s: float
    ) -> list[str]:
        """Take back from a live worker the requests it was sent and never took in: each
        still assigned to it and unstarted, in its assigned set since ``assigned_by_s`` or
        earlier. Their epoch moves on (the lost message can no longer start them) and they
        stay in the worker's assigned set until re-assigned. Returns the ids taken back;
        one started (or moved) meanwhile is kept."""
        calls = [
            (
                [keys.request(request_id), keys.assigned(worker_id)],
                [self._ttl_ms, request_id, worker_id, repr(assigned_by_s)],
            )
            for request_id in request_ids
        ]
        replies = await self.state.run_script_many(scripts.DISOWN, calls)
        return [
            request_id
            for request_id, reply in zip(request_ids, replies, strict=True)
            if reply[0] == "disowned"
        ]

    async def restore_many(self, completions: Sequence[Completion]) -> int:
        """Give requests whose records the store lost their answers back, read from the
        answers topic: a final record each, unless the request has a record again (a
        retry accepted since, a finish after the loss); one round trip. Returns how many
        were restored. Such a record holds the answer; :meth:`restore_requests_many` adds
        the request where the topics still hold it."""
        calls = [
            (
                [keys.request(completion.request_id)],
                [
                    self._ttl_ms,
                    str(completion.status),
                    completion.model_dump_json(),
                    str(completion.epoch),
                    completion.worker_id,
                    completion.app,
                ],
            )
            for completion in completions
        ]
        replies = await self.state.run_script_many(scripts.RESTORE, calls)
        return sum(1 for reply in replies if reply[0] == "restored")

    async def restore_requests_many(
        self, items: Sequence[InferenceRequest | Assignment]
    ) -> dict[str, int]:
        """Give requests whose records the store lost what was asked, read back from the
        requests topics (a request) and the worker inbox (an assignment), in any order
        with their answers (:meth:`restore_many`): an unanswered one is recorded again
        as it was, queued or assigned, so a retry waits for its one answer and its
        worker finds the fence it expects (an answer read back later settles it); an
        answered one gets its request, so a retry with another body gets a 409. One
        round trip; returns how many of each outcome
        (``pending``, ``attached``, ``advanced``, ``kept``; see
        :data:`~switchyard.lifecycle.scripts.RESTORE_REQUEST`)."""
        calls = []
        for item in items:
            request = item.request if isinstance(item, Assignment) else item
            fields = acceptance_fields(request)
            del fields["status"]
            key = keys.request(request.request_id)
            args = [self._ttl_ms, request.request_id]
            if isinstance(item, Assignment):
                args += [
                    str(item.epoch),
                    item.worker_id,
                    repr(item.assigned_at_s),
                    item.model_dump_json(exclude={"request"}),
                ]
                touched = [key, keys.assigned(item.worker_id)]
            else:
                args += ["", "", "0", ""]
                touched = [key, key]
            args.append(fields["request"])
            for field, value in fields.items():
                args += (field, value)
            calls.append((touched, args))
        replies = await self.state.run_script_many(scripts.RESTORE_REQUEST, calls)
        counts: dict[str, int] = {}
        for reply in replies:
            counts[reply[0]] = counts.get(reply[0], 0) + 1
        return counts

    # -- start -----------------------------------------------------------------------------

    async def start_many(self, fences: Sequence[Fence], now_s: float) -> list[StartResult]:
        """Mark requests running on the workers their fences name, in one round trip;
        each result says whether that worker may run it (see :data:`StartResult`)."""
        calls = [
            (
                [keys.request(fence.request_id)],
                [self._ttl_ms, str(fence.epoch), fence.worker_id, repr(now_s)],
            )
            for fence in fences
        ]
        replies = await self.state.run_script_many(scripts.START, calls)
        return [_literal_start(reply[0]) for reply in replies]

    # -- finish ----------------------------------------------------------------------------

    async def finish_many(
        self, completions: Sequence[Completion], *, worker_fenced: bool = True
    ) -> list[FinishResult]:
        """Record answers in one round trip (see :data:`FinishResult`).

        A worker's answer (``worker_fenced``) must match the recorded epoch and worker,
        leaves the worker's assigned set and counts in its ``completed``/``violated``;
        an answer the scheduler gives itself (no worker ran it) is fenced on the epoch
        only. Either way the cluster totals count it.
        """
        calls = []
        for completion in completions:
            worker_id = completion.worker_id if worker_fenced else ""
            calls.append(
                (
                    [
                        keys.request(completion.request_id),
                        keys.assigned(completion.worker_id),
                        keys.worker(completion.worker_id),
                        keys.CLUSTER_STATS,
                    ],
                    [
                        self._ttl_ms,
                        completion.request_id,
                        str(completion.epoch),
                        worker_id,
                        str(completion.status),
                        completion.model_dump_json(),
                        "1" if completion_violated(completion) else "0",
                        str(RECENT_WINDOW),
                    ],
                )
            )
        replies = await self.state.run_script_many(scripts.FINISH, calls)
        return [_literal_finish(reply[0]) for reply in replies]

    # -- cancel ----------------------------------------------------------------------------

    async def cancel(self, request_id: str, now_s: float, reason: str) -> CancelResult:
        """Answer a request that has not started as cancelled (its client went away),
        so that nothing runs it; a started one runs on (see :data:`CancelResult`)."""
        for _ in range(3):  # each "moved" is a re-assignment between the read and here
            record = await self.read(request_id)
            if record is None:
                return "missing"
            app = record.app or (record.request.app if record.request else "unknown")
            completion = Completion(
                request_id=request_id,
                app=app,
                worker_id=CANCELLED_BY_CLIENT,
                worker_type=CANCELLED_BY_CLIENT,
                variant=CANCELLED_BY_CLIENT,
                epoch=record.epoch,
                status=CompletionStatus.CANCELLED,
                error=reason[:2000],
                timeline=RequestTimeline(
                    arrival_s=record.arrival_s if record.arrival_s is not None else now_s,
                    finished_s=now_s,
                ),
                deadline_s=record.deadline_s,
            )
            reply = await self.state.run_script(
                scripts.CANCEL,
                [keys.request(request_id), keys.assigned(record.worker_id or "none")],
                [self._ttl_ms, request_id, str(record.epoch), completion.model_dump_json()],
            )
            if reply[0] != "moved":
                return _literal_cancel(reply[0])
        return "running"  # it keeps moving: leave it be


def acceptance_fields(request: InferenceRequest) -> dict[str, str]:
    """The fields :meth:`RequestLedger.accept` writes for ``request``."""
    fields = {
        "status": RequestStatus.QUEUED.value,
        "app": request.app,
        "kind": str(request.payload.kind),
        "reply_to": request.reply_to or "",
        "arrival_s": repr(request.arrival_s),
        "deadline_s": "" if request.deadline_s is None else repr(request.deadline_s),
        "request": request.model_dump_json(),
    }
    if isinstance(request.payload, LLMPayload):
        fields["prompt_tokens"] = str(request.payload.prompt_tokens)
    return fields


def _accepted(request: InferenceRequest, reply: Sequence[str]) -> Accepted:
    if reply[0] == "accepted":
        return Accepted(True)
    if reply[0] == "restoring":
        return Accepted(False, restoring=True)
    pairs = reply[1:]
    fields = dict(zip(pairs[0::2], pairs[1::2], strict=True))
    return Accepted(False, RequestRecord.from_fields(request.request_id, fields))


def _assign_outcome(item: Assign, reply: Sequence[str]) -> AssignOutcome:
    result = reply[0]
    if result == "assigned":
        return AssignOutcome("assigned", item.assignment.epoch, item.assignment.worker_id)
    if result == "answered":
        return AssignOutcome("answered")
    if result == "missing":
        return AssignOutcome("missing")
    epoch, worker = int(reply[1] or 0), reply[2] or None
    if result == "exists":
        recorded = None
        if len(reply) > 3 and reply[3]:
            recorded = Assignment.model_validate(
                {**json.loads(reply[3]), "request": item.assignment.request}
            )
        return AssignOutcome("exists", epoch, worker, recorded)
    return AssignOutcome("superseded", epoch, worker)


def _literal_start(text: str) -> StartResult:
    if text not in ("started", "running", "answered", "superseded", "missing"):
        raise ValueError(f"unexpected start result {text!r}")
    return text  # type: ignore[return-value]


def _literal_cancel(text: str) -> CancelResult:
    if text not in ("cancelled", "running", "answered", "missing"):
        raise ValueError(f"unexpected cancel result {text!r}")
    return text  # type: ignore[return-value]


def _literal_finish(text: str) -> FinishResult:
    if text not in ("finished", "duplicate", "superseded"):
        raise ValueError(f"unexpected finish result {text!r}")
    return text  # type: ignore[return-value]
