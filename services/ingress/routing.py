"""The loops that bring answers back to this ingress replica.

Every request carries ``reply_to`` = the accepting replica's ``instance_id``. Each
replica reads ``switchyard.completions`` and ``switchyard.output-chunks`` in its own
consumer group (``ingress-{instance_id}``, :func:`answer_group`), so every replica sees
every answer and keeps the ones addressed to it. A completion is written to its
request's record first (so ``GET /v1/requests/{id}`` on any replica, and a retry with
the same ``request_id``, see it even when the call already gave up), then handed to the
waiting call; chunks go to the waiting call only.

A replica reads only the answers appended since shortly before it started
(:data:`ANSWER_LOOKBACK_S`): no call of this process waits for an older one, the monitor
has written each into its request's record already, and a new replica (a new instance
id, so a new consumer group) must not read the topic's whole history before its first
answer.
"""

from __future__ import annotations

import asyncio

from switchyard.bus import Bus, Delivery, Subscription
from switchyard.contracts.messages import Completion
from switchyard.contracts.topics import COMPLETIONS, OUTPUT_CHUNKS
from switchyard.state.base import StateStore

from services.cluster_state import record_completion
from services.ingress.answers import AnswerRegistry

_BATCH = 256
_BATCH_WAIT_S = 0.2
ANSWER_LOOKBACK_S = 300.0
"""How long before its start a replica still reads answers from: a margin for clocks
that differ between the hosts that time-stamp records and this one."""


def answer_group(instance_id: str) -> str:
    """The consumer group of a replica's answer loops."""
    return f"ingress-{instance_id}"


async def route_completions(
    bus: Bus,
    state: StateStore,
    answers: AnswerRegistry,
    *,
    stopping: asyncio.Event,
    since_s: float | None = None,
) -> None:
    """Record and deliver the completions addressed to ``answers.instance_id`` until
    ``stopping`` is set (those appended since ``since_s``, when given).

    Completions are taken in batches and their records written concurrently, so one
    slow write does not hold back the answers behind it. A state store outage fails the
    batch: it is not committed, the routine restarts and the batch comes again.
    """
    group = answer_group(answers.instance_id)
    async with bus.subscribe(
        COMPLETIONS, group=group, stopping=stopping, since_s=since_s
    ) as subscription:
        while not stopping.is_set():
            batch = await subscription.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
            mine = [d for d in batch if answers.is_mine(d.message.reply_to)]
            if not mine:
                continue
            # Record first: once the caller has its answer, its status shows it too.
            await asyncio.gather(*(_record(subscription, d, state) for d in mine))
            for delivery in mine:
                answers.deliver(delivery.message)


async def _record(
    subscription: Subscription[Completion], delivery: Delivery[Completion], state: StateStore
) -> None:
    with subscription.handling(delivery):
        await record_completion(state, delivery.message)


async def route_chunks(
    bus: Bus, answers: AnswerRegistry, *, stopping: asyncio.Event, since_s: float | None = None
) -> None:
    """Deliver the streamed chunks addressed to ``answers.instance_id`` until
    ``stopping`` is set (those appended since ``since_s``, when given)."""
    group = answer_group(answers.instance_id)
    async with bus.subscribe(
        OUTPUT_CHUNKS, group=group, stopping=stopping, since_s=since_s
    ) as subscription:
        async for delivery in subscription:
            if answers.is_mine(delivery.message.reply_to):
                answers.deliver(delivery.message)
