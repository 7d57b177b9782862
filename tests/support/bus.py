"""Helpers for tests that drive a bus: building buses on either transport, collecting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

from switchyard.bus import Bus, Delivery, MemoryBroker, MemoryTransport, Subscription
from switchyard.bus.middleware import BusMiddleware
from switchyard.bus.transport import Transport
from switchyard.contracts.base import Message

if TYPE_CHECKING:
    from switchyard.bus.kafka_security import KafkaSecurity
from switchyard.contracts.messages import ClassificationPayload, InferenceRequest
from switchyard.contracts.topics import ALL_TOPICS

M = TypeVar("M", bound=Message)

BusFactory = Callable[..., Bus]


@asynccontextmanager
async def bus_factory(
    kind: str,
    *,
    prefix: str,
    kafka_bootstrap: str | None = None,
    kafka_security: KafkaSecurity | None = None,
) -> AsyncIterator[BusFactory]:
    """Yield a function that makes started-later buses sharing one broker (on Kafka, with
    ``kafka_security``'s TLS and SASL when given).

    Buses made by one factory stand for separate processes on one cluster: on Kafka each
    has its own connections, in memory they share one :class:`MemoryBroker`.
    Topics under ``prefix`` are deleted at the end.
    """
    broker = MemoryBroker()
    made: list[Bus] = []

    def make(
        *,
        commit_interval_s: float = 0.05,
        middlewares: tuple[BusMiddleware, ...] = (),
        max_batch: int = 500,
    ) -> Bus:
        transport: Transport
        if kind == "kafka":
            from switchyard.bus.kafka import KafkaTransport

            assert kafka_bootstrap is not None
            transport = KafkaTransport(
                kafka_bootstrap,
                client_id=f"{prefix}test",
                heartbeat_interval_ms=300,
                security=kafka_security,
            )
        else:
            transport = MemoryTransport(broker)
        bus = Bus(
            transport,
            topic_prefix=prefix,
            partitions=4,
            commit_interval_s=commit_interval_s,
            middlewares=middlewares,
            retry_initial_s=0.01,
            retry_max_s=0.05,
            max_batch=max_batch,
        )
        made.append(bus)
        return bus

    try:
        yield make
    finally:
        for bus in made:
            await bus.stop()
        if kind == "kafka" and made:
            cleaner = made[0]
            await cleaner.start()
            await cleaner.transport.delete_topics(cleaner.topic_name(t) for t in ALL_TOPICS)
            await cleaner.stop()


async def wait_for_assignment(
    subscriptions: list[Subscription[M]], partitions: int, timeout_s: float = 30.0
) -> None:
    """Wait until the members between them own all ``partitions``, each at least one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        owned = [s.assignment() for s in subscriptions]
        total = sum(len(a) for a in owned)
        union = frozenset().union(*owned)
        if total == partitions and len(union) == partitions and all(owned):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"group never settled: {[sorted(s.assignment()) for s in subscriptions]}")


async def collect(
    subscription: Subscription[M], count: int, timeout_s: float = 30.0
) -> list[Delivery[M]]:
    """Read ``count`` deliveries (each handled, so committed later) or fail after ``timeout_s``."""
    got: list[Delivery[M]] = []
    deadline_s = time.monotonic() + timeout_s
    while len(got) < count:
        delivery = await subscription.next_within(max(0.0, deadline_s - time.monotonic()))
        if delivery is None:
            raise AssertionError(f"got {len(got)} of {count} messages in {timeout_s}s")
        got.append(delivery)
    return got


async def drain_for(subscription: Subscription[M], quiet_s: float) -> list[Delivery[M]]:
    """Everything that arrives until nothing has arrived for ``quiet_s``."""
    got: list[Delivery[M]] = []
    while (delivery := await subscription.next_within(quiet_s)) is not None:
        got.append(delivery)
    return got


def make_request(request_id: str, *, app: str = "digits", seq: int = 0) -> InferenceRequest:
    """A small valid classification request; ``seq`` rides in the priority field."""
    return InferenceRequest(
        request_id=request_id,
        app=app,
        payload=ClassificationPayload(features=[float(seq), 1.0, 2.0]),
        arrival_s=time.time(),
        priority=seq % 1000,
    )
