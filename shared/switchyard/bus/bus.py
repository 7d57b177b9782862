"""The bus: typed publish and group consumption over any transport.

Encoding, validation, dead-lettering, middleware (tracing) and the commit policy live
in the bus, once, so the Kafka and in-memory transports behave the same: :class:`Bus`
(here) publishes and opens subscriptions; a :class:`~switchyard.bus.subscription.Subscription`
reads, decodes, hands over and commits; :mod:`switchyard.bus.dead_letters` builds the
record of a message given up on.

Delivery is at-least-once and ordered per key. A message's offset is committed only
after its handler returned (or after it was dead-lettered), in batches every
``commit_interval_s`` and whenever partitions are taken away or the subscription
closes; so a consumer that dies loses nothing, and its successor may see a few messages
again. Handlers therefore have to be idempotent (keyed by request id).

Example::

    bus = Bus(MemoryTransport())
    await bus.start()
    await bus.publish(REQUESTS, request)
    async with bus.subscribe(REQUESTS, group="scheduler") as sub:
        async for delivery in sub:
            await schedule(delivery.message)  # committed once this body completes
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from switchyard.bus import codec
from switchyard.bus.dead_letters import dead_letter_of
from switchyard.bus.delivery import Delivery, RecordFilter
from switchyard.bus.middleware import BusMiddleware, enter_all
from switchyard.bus.records import ClusterInfo, Envelope, OutgoingRecord, RecordMetadata
from switchyard.bus.subscription import Backoff, Subscription
from switchyard.bus.transport import Transport
from switchyard.contracts.base import Message
from switchyard.contracts.topics import ALL_TOPICS, DEAD_LETTERS, Topic
from switchyard.errors import is_retriable

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


class Bus:
    """Typed publishing and consumer-group subscriptions over a :class:`Transport`.

    Args:
        transport: the Kafka or in-memory transport.
        topic_prefix: prepended to every topic name (several stacks on one cluster).
        partitions: partition count of the topics the bus creates.
        middlewares: wrap every publish and every handled message, outermost first.
        commit_interval_s: how often handled offsets are committed.
        client_id: names this process's producer and consumers on the broker.
        addressed_partitions: partition count of the addressed topics the bus creates
            (one partition per destination: the most workers, or ingress replicas, that
            each read a partition of their own).
    """

    def __init__(
        self,
        transport: Transport,
        *,
        topic_prefix: str = "",
        partitions: int = 4,
        middlewares: Sequence[BusMiddleware] = (),
        commit_interval_s: float = 0.2,
        client_id: str = "switchyard",
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        max_batch: int = 500,
        addressed_partitions: int = 64,
    ) -> None:
        self.transport = transport
        self.topic_prefix = topic_prefix
        self.partitions = partitions
        self.middlewares = tuple(middlewares)
        self.commit_interval_s = commit_interval_s
        self.client_id = client_id
        self.backoff = Backoff(retry_initial_s, retry_max_s)
        self.max_batch = max_batch
        self.addressed_partitions = addressed_partitions
        self._ensured: set[str] = set()
        self._subscriptions: set[Subscription[Any]] = set()
        # Consumer group -> the topic it reads in this process (group members only).
        self._group_topics: dict[str, str] = {}
        self._started = False
        self.record_counts: Counter[tuple[str, str, str]] = Counter()
        """Records read, by (topic, group, outcome): ``decoded`` (validated into a
        message), ``skipped`` (passed over by a key filter, never decoded) and
        ``dead_lettered``; plain counts, exported as ``switchyard.bus.records``."""

    def lags(self) -> dict[tuple[str, str], int]:
        """Consumer lag in records by (topic, group), over this bus's open subscriptions
        whose lag is known."""
        lags: dict[tuple[str, str], int] = {}
        for subscription in list(self._subscriptions):
            lag = subscription.lag_records()
            if lag is not None:
                key = (subscription.topic.name, subscription.group)
                lags[key] = lags.get(key, 0) + lag
        return lags

    def topic_name(self, topic: Topic[Any]) -> str:
        """The topic's name on the broker, with this bus's prefix."""
        return self.topic_prefix + topic.name

    async def start(self) -> None:
        """Connect and create every Switchyard topic that does not exist yet."""
        if self._started:
            return
        await self.transport.start()
        self._started = True
        try:
            await self.ensure_topics(ALL_TOPICS)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close open subscriptions (committing what they handled), then disconnect."""
        for subscription in list(self._subscriptions):
            await subscription.close()
        if self._started:
            self._started = False
            await self.transport.stop()

    async def __aenter__(self) -> Bus:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def ensure_topics(self, topics: Iterable[Topic[Any]]) -> None:
        missing = [t for t in topics if self.topic_name(t) not in self._ensured]
        for addressed in (False, True):
            names = [self.topic_name(t) for t in missing if t.addressed is addressed]
            if names:
                count = self.addressed_partitions if addressed else self.partitions
                await self.transport.ensure_topics(names, count)
                self._ensured.update(names)

    async def partitions_of(self, topic: Topic[Any]) -> int:
        """How many partitions ``topic`` has on the broker (it may predate this
        deployment's setting)."""
        await self.ensure_topics([topic])
        return await self.transport.partitions_for(self.topic_name(topic))

    async def ping(self) -> ClusterInfo:
        """What the broker says about itself; raises a retriable error when it is unreachable."""
        return await self.transport.cluster_info()

    # -- publishing ------------------------------------------------------------------

    async def send(
        self,
        topic: Topic[M],
        message: M,
        *,
        key: str | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Awaitable[RecordMetadata]:
        """Queue ``message``; the result resolves when the broker acknowledged it.

        Use this to have many messages in flight at once; use :meth:`publish` to wait
        for each. ``key`` defaults to the topic's key for the message (e.g. request id).
        ``partition``: the destination's partition of an addressed topic (required
        there: a message without one would reach a reader it is not for).
        """
        if not isinstance(message, topic.message_types):
            raise TypeError(
                f"{topic.name} carries {topic.type_names}, not {type(message).__name__}"
            )
        if topic.addressed and partition is None:
            raise ValueError(f"{topic.name} is addressed: name the destination's partition")
        value, header_list = codec.encode(message)
        if headers:
            header_list.extend(headers.items())
        name = self.topic_name(topic)
        record_key = (key if key is not None else topic.key_of(message)).encode()
        with enter_all(
            mw.publishing(name, message.MESSAGE_TYPE, header_list) for mw in self.middlewares
        ):
            record = OutgoingRecord(name, value, record_key, tuple(header_list), partition)
            return await self.transport.send(record)

    async def publish(
        self,
        topic: Topic[M],
        message: M,
        *,
        key: str | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> RecordMetadata:
        """Publish ``message`` and wait until the broker stored it (acks=all on Kafka)."""
        return await (
            await self.send(topic, message, key=key, headers=headers, partition=partition)
        )

    async def publish_bytes(
        self,
        topic: Topic[Any],
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> RecordMetadata:
        """Publish raw bytes as they are: for replaying dead letters and for tests."""
        record = OutgoingRecord(self.topic_name(topic), value, key, tuple(headers), partition)
        return await (await self.transport.send(record))

    # -- consuming -------------------------------------------------------------------

    def subscribe(
        self,
        topic: Topic[M],
        *,
        group: str,
        stopping: asyncio.Event | None = None,
        record_filter: RecordFilter | None = None,
        since_s: float | None = None,
        partitions: Sequence[int] | None = None,
    ) -> Subscription[M]:
        """A subscription to ``topic`` as a member of consumer group ``group``.

        Members of one group share the topic's partitions; each group sees every message.
        Iteration ends once ``stopping`` is set (after the message in hand is finished).
        With ``record_filter``, records it rejects are skipped before decoding (and count
        as handled). With ``since_s`` (wall time), each partition is read from its first
        message appended at or after it (record timestamps) when the group committed an
        earlier offset or none; what follows is read whatever its timestamp, so a
        producer whose clock lags loses nothing once reading began.

        With ``partitions`` (an addressed topic's destination reading its own), the
        subscription reads exactly those partitions and joins no group rebalance;
        ``group`` keeps their committed offsets, and a group without any starts at the
        partitions' ends (what came before was for an earlier owner).

        Raises:
            ValueError: ``group`` already reads another topic through this bus. Kafka
                rebalances a group whenever any of its members joins or leaves, so a
                group shared by two topics stalls one whenever the other's consumer
                comes or goes: each topic gets a group of its own.
        """
        if partitions is None:
            bound = self._group_topics.setdefault(group, topic.name)
            if bound != topic.name:
                raise ValueError(
                    f"consumer group {group!r} already reads {bound!r} here; give "
                    f"{topic.name!r} a group of its own (one group per topic)"
                )
        return Subscription(
            self,
            topic,
            group=group,
            stopping=stopping,
            record_filter=record_filter,
            since_s=since_s,
            partitions=partitions,
        )

    async def consume(
        self,
        topic: Topic[M],
        *,
        group: str,
        handler: Callable[[Delivery[M]], Awaitable[None]],
        stopping: asyncio.Event,
        record_filter: RecordFilter | None = None,
        partitions: Sequence[int] | None = None,
        subscription: Subscription[M] | None = None,
    ) -> None:
        """Run ``handler`` on each message until ``stopping`` is set, then drain and return.
        With ``subscription`` (from :meth:`subscribe`, maybe opened already: reading
        before the service announces itself), that one is consumed and closed.

        A retriable failure (broker or Redis outage) is retried with backoff for as long
        as it takes, keeping the message's place; a non-retriable one sends the message to
        the dead-letter topic with the error, and consumption goes on.
        """
        if subscription is None:
            subscription = self.subscribe(
                topic,
                group=group,
                stopping=stopping,
                record_filter=record_filter,
                partitions=partitions,
            )
        try:
            async with subscription:
                async for delivery in subscription:
                    await subscription.handle(delivery, handler)
        except Exception as exc:
            if not (stopping.is_set() and is_retriable(exc)):
                raise
            # Stopped while an outage kept a message from being handled: it stays
            # uncommitted and is delivered again to whoever consumes next.
            log.warning("stopped with an unhandled message on %s: %s", topic.name, exc)

    async def _dead_letter(self, envelope: Envelope, group: str, kind: str, reason: str) -> None:
        letter = dead_letter_of(envelope, group, kind, reason)
        await self.publish(DEAD_LETTERS, letter)
        log.warning(
            "dead-lettered %s[%d]@%d: %s",
            envelope.topic,
            envelope.partition,
            envelope.offset,
            reason,
            extra={"reason_kind": kind, "consumer_group": group},
        )
        for mw in self.middlewares:
            mw.dead_lettered(envelope, group, kind)
