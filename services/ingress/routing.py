"""The loops that bring answers back to this ingress replica.

Every request carries ``reply_to`` = the accepting replica's ``instance_id``. Each
replica reads ``switchyard.completions`` and ``switchyard.output-chunks`` in its own
consumer group (``ingress-{instance_id}``, :func:`answer_group`), so every replica sees
every answer and keeps the ones addressed to it. A completion is written to its
request's record first (so ``GET /v1/requests/{id}`` on any replica, and a retry with
the same ``request_id``, see it even when the call already gave up), then handed to the
waiting call; chunks go to the waiting call only.
"""

from __future__ import annotations

import asyncio

from switchyard.bus import Bus, Delivery
from switchyard.contracts.messages import Completion
from switchyard.contracts.topics import COMPLETIONS, OUTPUT_CHUNKS
from switchyard.state.base import StateStore

from services.ingress import records
from services.ingress.answers import AnswerRegistry


def answer_group(instance_id: str) -> str:
    """The consumer group of a replica's answer loops."""
    return f"ingress-{instance_id}"


async def route_completions(
    bus: Bus, state: StateStore, answers: AnswerRegistry, *, stopping: asyncio.Event
) -> None:
    """Record and deliver the completions addressed to ``answers.instance_id`` until
    ``stopping`` is set. A state store outage is retried (the bus's handler policy) and
    holds the completion's place."""

    async def on_completion(delivery: Delivery[Completion]) -> None:
        completion = delivery.message
        # Record first: once the caller has its answer, its status shows it too.
        await records.write_completion(state, completion)
        answers.deliver(completion)

    group = answer_group(answers.instance_id)
    async with bus.subscribe(COMPLETIONS, group=group, stopping=stopping) as subscription:
        async for delivery in subscription:
            if answers.is_mine(delivery.message.reply_to):
                await subscription.handle(delivery, on_completion)


async def route_chunks(bus: Bus, answers: AnswerRegistry, *, stopping: asyncio.Event) -> None:
    """Deliver the streamed chunks addressed to ``answers.instance_id`` until
    ``stopping`` is set."""
    group = answer_group(answers.instance_id)
    async with bus.subscribe(OUTPUT_CHUNKS, group=group, stopping=stopping) as subscription:
        async for delivery in subscription:
            if answers.is_mine(delivery.message.reply_to):
                answers.deliver(delivery.message)
