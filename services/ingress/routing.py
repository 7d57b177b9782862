"""The loops that bring answers back to this ingress replica.

Every request carries ``reply_to`` (this replica's instance id) and ``reply_partition``
(the partition of ``switchyard.answers`` this replica leased at start). Workers publish
each answer, and a streamed request's chunks before it, to that partition, after the
answer is recorded in the request ledger; :func:`route_answers` reads the partition and
hands each to the call waiting for it. Nothing is written here: the record has the
answer already, so ``GET /v1/requests/{id}`` on any replica, and a retry with the same
``request_id``, see it even when the call gave up.

An answer that cannot reach its replica over the bus (its publish failed for good, or
this replica lost its partition while frozen) is still in its record:
:func:`sweep_overdue` looks up the records of calls waiting longer than
:data:`OVERDUE_S` every :data:`OVERDUE_S` and delivers the answers found there, so no
call waits past its answer by more than that.
"""

from __future__ import annotations

import asyncio
import contextlib

from switchyard.bus import Subscription
from switchyard.contracts.messages import Completion, OutputChunk
from switchyard.lifecycle import RequestLedger
from switchyard.runtime.inbox import Inbox

from services.ingress.answers import AnswerRegistry

_BATCH = 256
_BATCH_WAIT_S = 0.2
OVERDUE_S = 5.0
"""How long a call waits before its request's record is also looked at (and then how
often)."""


def answer_group(instance_id: str) -> str:
    """The consumer group keeping the offsets of a replica's answer partition."""
    return f"ingress-{instance_id}"


def answer_subscription(
    inbox: Inbox[Completion | OutputChunk], answers: AnswerRegistry, stopping: asyncio.Event
) -> Subscription[Completion | OutputChunk]:
    """A reader of this replica's answer partition (open it before the partition is
    named in any request: it reads from the partition's end)."""
    return inbox.subscribe(group=answer_group(answers.instance_id), stopping=stopping)


async def route_answers(
    subscription: Subscription[Completion | OutputChunk],
    inbox: Inbox[Completion | OutputChunk],
    answers: AnswerRegistry,
    *,
    stopping: asyncio.Event,
) -> None:
    """Deliver the answers and chunks ``subscription`` reads until ``stopping``."""
    generation = inbox.generation
    async with subscription:
        while not stopping.is_set():
            batch = await subscription.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
            inbox.check(generation)
            for delivery in batch:
                # Its CONSUMER span, the last of the request's trace.
                with subscription.handling(delivery):
                    answers.deliver(delivery.message)


async def sweep_overdue(
    ledger: RequestLedger, answers: AnswerRegistry, *, stopping: asyncio.Event
) -> None:
    """Deliver, from their records, the answers of calls waiting longer than
    :data:`OVERDUE_S` (see the module docstring)."""
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), OVERDUE_S)
        overdue = answers.overdue(OVERDUE_S)
        if not overdue:
            continue
        records = await asyncio.gather(*(ledger.read(rid) for rid in overdue))
        for record in records:
            if record is not None and record.final and (completion := record.completion):
                answers.deliver(completion)
