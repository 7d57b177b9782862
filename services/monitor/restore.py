"""Answers read back from the broker into a state store that lost them.

When the store comes back empty (a Redis restart without persistence, a flush), every
request record is gone, answered ones included: a client that retries an answered
request with its id would run it again. The answers topic still holds every answer
published within its retention, so the monitor reads it from :data:`REQUEST_TTL_S
<switchyard.lifecycle.REQUEST_TTL_S>` ago (as long as a record would have lived) to its
end and writes each answer back as a final record
(:meth:`~switchyard.lifecycle.RequestLedger.restore_many`), where the request has no
record again. Until that is done the ledger refuses calls that name their id
(:data:`switchyard.state.keys.STATE_GENERATION`); calls with an id the ingress makes up
are new and go on.

The read takes the topic's partitions directly (no consumer group to join, so a fresh
stack restores its empty topic at once) under a group of its own that no later restore
shares. Streamed chunks are skipped undecoded (their type header).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from switchyard.bus import Bus, Envelope
from switchyard.bus.codec import TYPE_HEADER
from switchyard.contracts.messages import Completion
from switchyard.contracts.topics import ANSWERS
from switchyard.lifecycle import REQUEST_TTL_S, RequestLedger

log = logging.getLogger("switchyard.monitor")

BATCH = 500
"""Answers written back per round trip to the store."""

_COMPLETION = Completion.MESSAGE_TYPE.encode()


def _is_completion(envelope: Envelope) -> bool:
    return envelope.header(TYPE_HEADER) == _COMPLETION


async def restore_answers(
    bus: Bus,
    ledger: RequestLedger,
    *,
    stopping: asyncio.Event,
    window_s: float = REQUEST_TTL_S,
) -> int:
    """Write back every answer of the last ``window_s`` the answers topic holds, up to
    what it held when this began; returns how many records were restored."""
    began_s = time.time()
    partitions = list(range(await bus.partitions_of(ANSWERS)))
    reader = bus.subscribe(
        ANSWERS,
        group=f"monitor-restore-{uuid.uuid4().hex[:12]}",
        partitions=partitions,
        since_s=began_s - window_s,
        stopping=stopping,
        record_filter=_is_completion,
    )
    restored = read = 0
    async with reader as sub:
        while not stopping.is_set():
            batch = await sub.next_batch(BATCH, timeout_s=0.5)
            completions = [d.message for d in batch if isinstance(d.message, Completion)]
            if completions:
                read += len(completions)
                restored += await ledger.restore_many(completions)
            sub.batch_handled()
            # Done once everything the topic held when this began is handled: answers
            # that keep arriving meanwhile are read too, but never waited for.
            through_s = sub.handled_through_s()
            if through_s is not None and through_s >= began_s:
                break
    log.info(
        "read %d answers back from the answers topic (the last %.0f s), %d restored",
        read,
        window_s,
        restored,
        extra={"event": "answers_read", "restored": restored, "read": read},
    )
    return restored
