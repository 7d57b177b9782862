"""A request's record: its status and what each step of its life left there.

``request:{id}`` (hash, :data:`REQUEST_TTL_S` after its last change) holds:

===================  =================================================================
field                written by (transition)
===================  =================================================================
``status``           every transition: ``queued`` (accept), ``assigned`` (assign),
                     ``running`` (start), then the answer's status: ``ok``, ``failed``,
                     ``expired`` or ``cancelled`` (finish)
``app``, ``kind``    accept: the application, ``llm`` or ``classification``
``reply_to``         accept: the ingress replica waiting for the answer
``arrival_s``        accept (wall seconds)
``deadline_s``       accept (empty when none)
``prompt_tokens``    accept (LLM requests)
``request``          accept: the ``InferenceRequest`` JSON (a retry re-publishes it)
``epoch``            assign: the fencing token; each (re)assignment and move adds one
``worker_id``        assign: the worker it was sent to
``decision``         assign: the ``Assignment`` JSON without its request
``traceparent``,     assign: the trace context of the decision, so a re-assignment
``tracestate``       continues the request's trace
``started_s``        start
``completion``       finish: the ``Completion`` JSON
``superseded_runs``  finish: answers refused because the request had been given to
                     another worker or epoch (runs that should not have happened)
``restored``         restore: ``1`` on a record rebuilt from the broker after the store
                     lost its data: from its answer (then its request, where the
                     requests topics or the worker inbox still hold it), or, for one
                     not answered, from its request and latest assignment
===================  =================================================================
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from pydantic import ValidationError

from switchyard.contracts.messages import Assignment, Completion, CompletionStatus, InferenceRequest

REQUEST_TTL_S = 3600.0
"""How long a request's record (and its answer, for retries with the same id and for
``GET /v1/requests/{id}``) is kept after its last change."""


class RequestStatus(StrEnum):
    """Where a request is in its life (the ``status`` field)."""

    QUEUED = "queued"
    """Accepted by the ingress, not yet decided."""
    ASSIGNED = "assigned"
    """Sent to ``worker_id`` under ``epoch``; not started there yet."""
    RUNNING = "running"
    """Started on ``worker_id`` under ``epoch``."""
    OK = "ok"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        """Whether the request has its answer (nothing moves it any more)."""
        return self.value in FINAL_STATUSES


FINAL_STATUSES = frozenset(status.value for status in CompletionStatus)
"""The statuses of a request that has its answer: a completion's status."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What the state store knows about one request (a parsed ``request:{id}``)."""

    request_id: str
    status: str
    app: str = ""
    kind: str = ""
    reply_to: str | None = None
    arrival_s: float | None = None
    deadline_s: float | None = None
    prompt_tokens: int | None = None
    epoch: int = 0
    worker_id: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    started_s: float | None = None
    superseded_runs: int = 0
    fields: Mapping[str, str] | None = None

    @property
    def final(self) -> bool:
        """Whether the request has its answer."""
        return self.status in FINAL_STATUSES

    @property
    def request(self) -> InferenceRequest | None:
        """The request as accepted (None when the record does not hold it)."""
        raw = (self.fields or {}).get("request")
        if not raw:
            return None
        with contextlib.suppress(ValidationError):
            return InferenceRequest.model_validate_json(raw)
        return None

    @property
    def completion(self) -> Completion | None:
        """The answer (None before it came; an unreadable one reads as none)."""
        raw = (self.fields or {}).get("completion")
        if not raw:
            return None
        with contextlib.suppress(ValidationError):
            return Completion.model_validate_json(raw)
        return None

    @property
    def assignment(self) -> Assignment | None:
        """The latest assignment (None before the first, or when unreadable)."""
        fields = self.fields or {}
        decision, request = fields.get("decision"), self.request
        if not decision or request is None:
            return None
        with contextlib.suppress(ValidationError, ValueError):
            return Assignment.model_validate({**json.loads(decision), "request": request})
        return None

    def trace_carrier(self) -> dict[str, str]:
        """``traceparent``/``tracestate`` of the latest decision (empty when none)."""
        carrier = {}
        if self.traceparent:
            carrier["traceparent"] = self.traceparent
            if self.tracestate:
                carrier["tracestate"] = self.tracestate
        return carrier

    @classmethod
    def from_fields(cls, request_id: str, fields: Mapping[str, str]) -> RequestRecord:
        """The record of a ``request:{id}`` hash; fields that do not parse read as absent."""
        return cls(
            request_id=request_id,
            status=fields.get("status", RequestStatus.QUEUED.value),
            app=fields.get("app", ""),
            kind=fields.get("kind", ""),
            reply_to=fields.get("reply_to") or None,
            arrival_s=_float(fields.get("arrival_s")),
            deadline_s=_float(fields.get("deadline_s")),
            prompt_tokens=_int(fields.get("prompt_tokens")),
            epoch=_int(fields.get("epoch")) or 0,
            worker_id=fields.get("worker_id") or None,
            traceparent=fields.get("traceparent") or None,
            tracestate=fields.get("tracestate") or None,
            started_s=_float(fields.get("started_s")),
            superseded_runs=_int(fields.get("superseded_runs")) or 0,
            fields=dict(fields),
        )


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
