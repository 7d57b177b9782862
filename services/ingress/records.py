"""The request records the ingress keeps in the state store, so any replica can answer
``GET /v1/requests/{id}`` and a retried ``request_id`` finds its earlier answer.

Keys (after the store's prefix):

- ``request:{id}`` (hash, TTL :data:`REQUEST_TTL_S`): written on acceptance with
  ``app``, ``kind`` (``llm`` / ``classification``), ``status`` = ``queued``,
  ``reply_to`` (the accepting replica), ``arrival_s``, ``deadline_s`` (empty when
  none) and, for LLM requests, ``prompt_tokens``. When the completion comes back the
  replica named in ``reply_to`` and the monitor add ``status`` (the completion's),
  ``worker_id`` and ``completion`` (``Completion.model_dump_json()``;
  :func:`~services.cluster_state.record_completion`): the monitor's copy keeps the
  answer when that replica is gone. The scheduler sets ``status`` to ``assigned`` in
  between.
- ``claim:{id}:ingress`` (string, same TTL, via ``set_if_absent``): taken by the call
  that accepts a client-chosen ``request_id`` (value: ``{instance_id}/{call id}``); a
  retry that finds it taken does not publish the request again, unless the claim is
  orphaned (no record appeared within a second) and it wins :func:`take_over`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from pydantic import ValidationError
from switchyard.contracts.messages import Completion, InferenceRequest, LLMPayload
from switchyard.state.base import StateStore

from services.cluster_state import REQUEST_TTL_S, request_key

QUEUED = "queued"


def claim_key(request_id: str) -> str:
    return f"claim:{request_id}:ingress"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What the state store knows about one request."""

    request_id: str
    app: str
    kind: str
    status: str
    reply_to: str | None
    arrival_s: float | None
    deadline_s: float | None
    prompt_tokens: int | None
    worker_id: str | None
    completion: Completion | None

    @classmethod
    def from_fields(cls, request_id: str, fields: dict[str, str]) -> RequestRecord:
        completion = None
        if raw := fields.get("completion"):
            # A record we cannot read is reported without its answer rather than failing.
            with contextlib.suppress(ValidationError):
                completion = Completion.model_validate_json(raw)
        return cls(
            request_id=request_id,
            app=fields.get("app", ""),
            kind=fields.get("kind", ""),
            status=fields.get("status", QUEUED),
            reply_to=fields.get("reply_to") or None,
            arrival_s=_float(fields.get("arrival_s")),
            deadline_s=_float(fields.get("deadline_s")),
            prompt_tokens=_int(fields.get("prompt_tokens")),
            worker_id=fields.get("worker_id") or None,
            completion=completion,
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


async def claim(state: StateStore, request_id: str, owner: str) -> bool:
    """Claim a client-chosen request id for ``owner`` (one call); True when this call is
    the first to use it."""
    return await state.set_if_absent(claim_key(request_id), owner, ttl_s=REQUEST_TTL_S)


async def take_over(state: StateStore, request_id: str, owner: str) -> bool:
    """Take an orphaned claim (claimed, but its request was never recorded: the claimant
    failed and could not release it) for ``owner``; True when this call got it. Atomic:
    of several calls taking over the same claim, one wins."""
    current = await state.get(claim_key(request_id))
    return await state.compare_and_set(claim_key(request_id), current, owner, ttl_s=REQUEST_TTL_S)


async def write_accepted(state: StateStore, request: InferenceRequest) -> None:
    """Record an accepted request as ``queued`` (before it is published)."""
    fields = {
        "app": request.app,
        "kind": str(request.payload.kind),
        "status": QUEUED,
        "reply_to": request.reply_to or "",
        "arrival_s": repr(request.arrival_s),
        "deadline_s": "" if request.deadline_s is None else repr(request.deadline_s),
    }
    if isinstance(request.payload, LLMPayload):
        fields["prompt_tokens"] = str(request.payload.prompt_tokens)
    key = request_key(request.request_id)
    await state.hset(key, fields)
    await state.expire(key, REQUEST_TTL_S)


async def forget(state: StateStore, request_id: str) -> None:
    """Drop the record and claim of a request that could not be published, so that a
    retry with the same id runs it."""
    await state.delete(request_key(request_id), claim_key(request_id))


async def read(state: StateStore, request_id: str) -> RequestRecord | None:
    """The record of ``request_id``; None when there is none (unknown or expired)."""
    fields = await state.hgetall(request_key(request_id))
    if not fields:
        return None
    return RequestRecord.from_fields(request_id, fields)
