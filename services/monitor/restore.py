"""Answers and requests read back from the broker into a state store that lost them.

When the store comes back empty (a Redis restart without persistence, a flush), every
request record is gone: a client that retries a request with its id would run it again.
The broker still holds, within its retention, every answer (the answers topic), every
accepted request (the requests topics) and every assignment (the worker inbox), so the
monitor reads them from :data:`REQUEST_TTL_S <switchyard.lifecycle.REQUEST_TTL_S>` ago
(as long as a record would have lived) to their end:

- each answer is written back as a final record
  (:meth:`~switchyard.lifecycle.RequestLedger.restore_many`), where the request has no
  record again;
- each request and assignment
  (:meth:`~switchyard.lifecycle.RequestLedger.restore_requests_many`): an answered
  request's record gets what was asked (a retry with another body is a 409), and one
  accepted but not answered is recorded again, queued or assigned under its latest
  epoch, so a retry waits for its one answer and its worker's start and finish find
  their fence;
- then the answers published since this began, once more: an answer whose finish the
  loss took settles the record its request just made pending.

The four topics are read at the same time: what the records end as does not depend on
the order.

Until that is done the ledger refuses calls that name their id
(:data:`switchyard.state.keys.STATE_GENERATION`); calls with an id the ingress makes up
are new and go on.

Each read takes the topic's partitions directly (no consumer group to join, so a fresh
stack restores its empty topics at once) under a group of its own that no later restore
shares. Records of other types (streamed chunks, migrations) are skipped undecoded
(their type header).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from switchyard.bus import Bus, Envelope
from switchyard.bus.codec import TYPE_HEADER
from switchyard.contracts.base import Message
from switchyard.contracts.messages import Assignment, Completion, InferenceRequest
from switchyard.contracts.topics import (
    ANSWERS,
    CLASSIFICATION_REQUESTS,
    REQUESTS,
    WORKER_INBOX,
    Topic,
)
from switchyard.lifecycle import REQUEST_TTL_S, RequestLedger

log = logging.getLogger("switchyard.monitor")

BATCH = 500
"""Records written back per round trip to the store."""

_COMPLETION = Completion.MESSAGE_TYPE.encode()
_REQUEST = InferenceRequest.MESSAGE_TYPE.encode()
_ASSIGNMENT = Assignment.MESSAGE_TYPE.encode()


def _is_completion(envelope: Envelope) -> bool:
    return envelope.header(TYPE_HEADER) == _COMPLETION


def _is_request(envelope: Envelope) -> bool:
    return envelope.header(TYPE_HEADER) in (_REQUEST, _ASSIGNMENT)


async def restore_from_broker(
    bus: Bus,
    ledger: RequestLedger,
    *,
    stopping: asyncio.Event,
    window_s: float = REQUEST_TTL_S,
) -> int:
    """Write back every answer of the last ``window_s`` the answers topic holds, and the
    requests and assignments of that time (see the module docstring), each topic up to
    what it held when this began; returns how many answers were restored."""
    began_s = time.time()

    async def answers(batch: list[Message]) -> dict[str, int]:
        completions = [m for m in batch if isinstance(m, Completion)]
        return {"restored": await ledger.restore_many(completions)} if completions else {}

    async def requests(batch: list[Message]) -> dict[str, int]:
        asked = [m for m in batch if isinstance(m, InferenceRequest | Assignment)]
        return await ledger.restore_requests_many(asked) if asked else {}

    # The topics are read at once: the outcome does not depend on their order (an
    # answer settles a record its request made pending; a request adds itself to one
    # its answer made; a later assignment advances an earlier one).
    (read, outcomes), *asked_back = await asyncio.gather(
        _read_back(bus, ANSWERS, _is_completion, answers, began_s, window_s, stopping),
        *(
            _read_back(bus, topic, _is_request, requests, began_s, window_s, stopping)
            for topic in (REQUESTS, CLASSIFICATION_REQUESTS, WORKER_INBOX)
        ),
    )
    restored = outcomes.get("restored", 0)
    asked = 0
    for count, found in asked_back:
        asked += count
        for outcome, n in found.items():
            outcomes[outcome] = outcomes.get(outcome, 0) + n
    # An answer published since this began whose finish the loss took (the worker
    # recorded it just before): it settles the record its assignment just made pending.
    now_s = time.time()
    _, found = await _read_back(
        bus, ANSWERS, _is_completion, answers, now_s, now_s - began_s, stopping
    )
    restored += found.get("restored", 0)
    pending = outcomes.get("pending", 0)
    log.info(
        "read %d answers and %d requests and assignments back from the broker (the last "
        "%.0f s): %d answers restored, %d requests given back what was asked, %d "
        "unanswered requests recorded again",
        read,
        asked,
        window_s,
        restored,
        outcomes.get("attached", 0),
        pending,
        extra={
            "event": "answers_read",
            "restored": restored,
            "read": read,
            "requests_read": asked,
            "pending": pending,
        },
    )
    return restored


async def _read_back(
    bus: Bus,
    topic: Topic[Any],
    wanted: Callable[[Envelope], bool],
    handle: Callable[[list[Message]], Awaitable[dict[str, int]]],
    began_s: float,
    window_s: float,
    stopping: asyncio.Event,
) -> tuple[int, dict[str, int]]:
    """Hand ``topic``'s wanted records of the last ``window_s`` to ``handle`` in batches,
    up to what it held at ``began_s``; returns how many were read and the sum of what
    ``handle`` counted."""
    partitions = list(range(await bus.partitions_of(topic)))
    reader = bus.subscribe(
        topic,
        group=f"monitor-restore-{uuid.uuid4().hex[:12]}",
        partitions=partitions,
        since_s=began_s - window_s,
        stopping=stopping,
        record_filter=wanted,
    )
    read = 0
    counts: dict[str, int] = {}
    async with reader as sub:
        while not stopping.is_set():
            batch = await sub.next_batch(BATCH, timeout_s=0.5)
            messages = [d.message for d in batch]
            if messages:
                read += len(messages)
                for outcome, n in (await handle(messages)).items():
                    counts[outcome] = counts.get(outcome, 0) + n
            sub.batch_handled()
            # Done once everything the topic held when this began is handled: records
            # that keep arriving meanwhile are read too, but never waited for.
            through_s = sub.handled_through_s()
            if through_s is not None and through_s >= began_s:
                break
    return read, counts
