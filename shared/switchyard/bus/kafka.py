"""The Kafka transport, on aiokafka.

The producer waits for every in-sync replica (``acks=all``) and is idempotent, so a
retried send never writes a record twice. Consumers never auto-commit: the bus commits
the offsets of messages whose handlers finished, and commits them again, for the
partitions being taken away, when the group rebalances.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Generator, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

from switchyard.bus.kafka_security import KafkaSecurity, why_not_connected
from switchyard.bus.records import (
    ClusterInfo,
    Envelope,
    OutgoingRecord,
    RecordMetadata,
    TopicPartition,
)
from switchyard.bus.transport import RevokeCallback
from switchyard.errors import TransportError

log = logging.getLogger(__name__)


class _RevokeListener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Passes revocations on to the bus before the partitions change hands; with
    ``since_ms``, moves each assigned partition's start past its older records."""

    def __init__(self, on_revoke: RevokeCallback, since_ms: int | None = None) -> None:
        self._on_revoke = on_revoke
        self._since_ms = since_ms
        self.consumer: AIOKafkaConsumer | None = None

    async def on_partitions_revoked(self, revoked: Iterable[KafkaTopicPartition]) -> None:
        partitions = frozenset(TopicPartition(tp.topic, tp.partition) for tp in revoked)
        if partitions:
            await self._on_revoke(partitions)

    async def on_partitions_assigned(self, assigned: Iterable[KafkaTopicPartition]) -> None:
        consumer, since_ms = self.consumer, self._since_ms
        partitions = list(assigned)
        if consumer is None or since_ms is None or not partitions:
            return
        # Paused first, before anything is awaited: the fetcher must not read from the
        # committed (or earliest) offset while the start is being looked up.
        consumer.pause(*partitions)
        try:
            # The first record at or after since_ms (record timestamps), or the end when
            # there is none; the group's committed offset when that is later.
            found = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
            missing = [tp for tp in partitions if found.get(tp) is None]
            ends = await consumer.end_offsets(missing) if missing else {}
            for tp in partitions:
                hit = found.get(tp)
                start = hit.offset if hit is not None else ends[tp]
                committed = await consumer.committed(tp)
                if committed is None or committed < start:
                    consumer.seek(tp, start)
        finally:
            consumer.resume(*partitions)


class _KafkaConsumer:
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        bootstrap: str,
        positions: Mapping[KafkaTopicPartition, int] | None = None,
    ) -> None:
        self._consumer = consumer
        self._bootstrap = bootstrap
        self._raw_assignment: set[KafkaTopicPartition] = set()
        self._assignment: frozenset[TopicPartition] = frozenset()
        # The next offset handed out, per partition: a reader's start, then each batch's
        # last record + 1 (what caught_up_at_s compares with the high watermark).
        self._next: dict[KafkaTopicPartition, int] = dict(positions or {})

    async def fetch(self, timeout_s: float, max_records: int) -> list[Envelope]:
        try:
            batches = await self._consumer.getmany(
                timeout_ms=int(timeout_s * 1000), max_records=max_records
            )
        except KafkaError as exc:
            raise TransportError(f"fetch from Kafka at {self._bootstrap} failed: {exc}") from exc
        records: list[Envelope] = []
        for tp, batch in batches.items():
            if batch:
                self._next[tp] = batch[-1].offset + 1
            for r in batch:
                records.append(
                    Envelope(
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=r.offset,
                        key=r.key,
                        value=r.value if r.value is not None else b"",
                        headers=tuple(r.headers or ()),
                        timestamp_ms=r.timestamp,
                    )
                )
        return records

    def caught_up_at_s(self) -> float | None:
        # Per partition: the last fetch answer's time, when its high watermark shows
        # nothing beyond what was handed out (aiokafka's prefetched records included).
        consumer = self._consumer
        oldest_ms: int | None = None
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            polled_ms = consumer.last_poll_timestamp(tp)
            handed_out = self._next.get(tp)
            if highwater is None or polled_ms is None or handed_out is None:
                return None
            if handed_out < highwater:
                return None
            oldest_ms = polled_ms if oldest_ms is None else min(oldest_ms, polled_ms)
        return None if oldest_ms is None else oldest_ms / 1000.0

    def lag_records(self) -> int | None:
        # Over the partitions whose position is known here: those it handed records
        # from, and empty ones (high watermark 0). A partition it has handed nothing from
        # yet is being fetched for the first time; it counts once it has.
        consumer = self._consumer
        lag: int | None = None
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            handed_out = self._next.get(tp, 0 if highwater == 0 else None)
            if highwater is None or handed_out is None:
                continue
            lag = (lag or 0) + max(0, highwater - handed_out)
        return lag

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        try:
            await self._consumer.commit(
                {KafkaTopicPartition(tp.topic, tp.partition): o for tp, o in offsets.items()}
            )
        except KafkaError as exc:
            raise TransportError(f"commit to Kafka at {self._bootstrap} failed: {exc}") from exc

    def assignment(self) -> frozenset[TopicPartition]:
        # Asked once per handled message: convert aiokafka's set only when it changed.
        raw = self._consumer.assignment()
        if raw != self._raw_assignment:
            # A partition (re)gained in a rebalance starts at its committed offset: what
            # was handed out of it before says nothing about it now. (A reader's first
            # look keeps the start positions it was made with.)
            if self._raw_assignment:
                kept = self._raw_assignment & raw
                self._next = {tp: o for tp, o in self._next.items() if tp in kept}
            self._raw_assignment = set(raw)
            self._assignment = frozenset(TopicPartition(tp.topic, tp.partition) for tp in raw)
        return self._assignment

    async def close(self) -> None:
        await self._consumer.stop()


class _Acknowledgement:
    """Awaits the broker's acknowledgement of one record.

    A plain awaitable rather than a task: one is made per published message, and a task
    per message would cost more than the send itself.
    """

    __slots__ = ("_sent", "_topic", "_transport")

    def __init__(self, sent: asyncio.Future[Any], transport: KafkaTransport, topic: str) -> None:
        self._sent = sent
        self._transport = transport
        self._topic = topic

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        try:
            meta = yield from self._sent.__await__()
        except KafkaError as exc:
            raise self._transport._fail(f"publishing to {self._topic}", exc) from exc
        return RecordMetadata(meta.topic, meta.partition, meta.offset)


class KafkaTransport:
    """A :class:`~switchyard.bus.transport.Transport` over a Kafka cluster.

    Args:
        bootstrap: ``host:port[,host:port]`` of the brokers.
        client_id: prefix of the producer's and consumers' client ids (shown by the broker).
        linger_ms: how long the producer waits to batch records; 0 sends at once.
        heartbeat_interval_ms / session_timeout_ms: group membership timing; a consumer
            that dies without leaving loses its partitions after ``session_timeout_ms``.
        fetch_max_wait_ms: how long a fetch waits on the broker for new records.
        security: TLS and SASL (:mod:`switchyard.bus.kafka_security`); plaintext when
            not given.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "switchyard",
        linger_ms: int = 0,
        max_batch_bytes: int = 256 * 1024,
        request_timeout_ms: int = 30_000,
        session_timeout_ms: int = 6_000,
        heartbeat_interval_ms: int = 1_000,
        fetch_max_wait_ms: int = 500,
        security: KafkaSecurity | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        # TLS and SASL options, the same for every client (the TLS context made once).
        self._security_settings = security or KafkaSecurity()
        self._security = self._security_settings.client_options()
        self._client_id = client_id
        self._linger_ms = linger_ms
        self._max_batch_bytes = max_batch_bytes
        self._request_timeout_ms = request_timeout_ms
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    def _fail(self, what: str, exc: BaseException) -> TransportError:
        return TransportError(
            f"{what} on Kafka at {self.bootstrap} failed: {exc or type(exc).__name__}"
        )

    async def start(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self._client_id}-producer",
            acks="all",
            enable_idempotence=True,
            linger_ms=self._linger_ms,
            max_batch_size=self._max_batch_bytes,
            request_timeout_ms=self._request_timeout_ms,
            **self._security,
        )
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            client_id=f"{self._client_id}-admin",
            request_timeout_ms=self._request_timeout_ms,
            **self._security,
        )
        try:
            await producer.start()
            await admin.start()
        except (KafkaError, OSError) as exc:
            await producer.stop()
            await admin.close()
            cause = await why_not_connected(self.bootstrap, self._security_settings)
            if cause is not None:
                raise TransportError(
                    f"connecting to Kafka at {self.bootstrap} failed: {cause}", retriable=False
                ) from None
            raise self._fail("connecting", exc) from exc
        self._producer, self._admin = producer, admin

    async def stop(self) -> None:
        producer, admin = self._producer, self._admin
        self._producer = self._admin = None
        if producer is not None:
            await producer.stop()  # flushes records still queued
        if admin is not None:
            await admin.close()

    def _require_started(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        if self._producer is None or self._admin is None:
            raise TransportError("Kafka transport is not started", retriable=False)
        return self._producer, self._admin

    async def ensure_topics(self, names: Iterable[str], partitions: int) -> None:
        _, admin = self._require_started()
        wanted = sorted(set(names))
        try:
            existing = set(await admin.list_topics())
            missing = [n for n in wanted if n not in existing]
            if not missing:
                return
            brokers = (await admin.describe_cluster())["brokers"]
            replication = max(1, min(3, len(brokers)))
            response = await admin.create_topics(
                [
                    NewTopic(n, num_partitions=partitions, replication_factor=replication)
                    for n in missing
                ]
            )
        except KafkaError as exc:
            raise self._fail("creating topics", exc) from exc
        for name, code, *rest in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):
                message = rest[0] if rest else ""
                raise TransportError(f"creating topic {name!r} failed: error {code} {message}")
        await self._wait_for_metadata(missing)

    async def _wait_for_metadata(self, names: list[str]) -> None:
        # A freshly created topic may take a moment to have leaders; producing before that
        # only costs retries, but consumers joining a group need its partition count.
        producer, _ = self._require_started()
        for name in names:
            for _ in range(50):
                if producer.client.cluster.partitions_for_topic(name):
                    break
                await producer.client.force_metadata_update()
                await asyncio.sleep(0.05)

    async def delete_topics(self, names: Iterable[str]) -> None:
        _, admin = self._require_started()
        try:
            await admin.delete_topics(list(names))
        except UnknownTopicOrPartitionError:
            return
        except KafkaError as exc:
            raise self._fail("deleting topics", exc) from exc

    async def send(self, record: OutgoingRecord) -> Awaitable[RecordMetadata]:
        producer, _ = self._require_started()
        try:
            sent = await producer.send(
                record.topic,
                value=record.value,
                key=record.key,
                headers=list(record.headers),
                partition=record.partition,
            )
        except KafkaError as exc:
            raise self._fail(f"publishing to {record.topic}", exc) from exc
        return _Acknowledgement(sent, self, record.topic)

    async def consumer(
        self,
        topics: Iterable[str],
        *,
        group: str,
        client_id: str,
        on_revoke: RevokeCallback,
        since_ms: int | None = None,
    ) -> _KafkaConsumer:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=client_id,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **self._security,
            session_timeout_ms=self._session_timeout_ms,
            heartbeat_interval_ms=self._heartbeat_interval_ms,
            fetch_max_wait_ms=self._fetch_max_wait_ms,
            request_timeout_ms=self._request_timeout_ms,
        )
        listener = _RevokeListener(on_revoke, since_ms)
        listener.consumer = consumer
        consumer.subscribe(topics=list(topics), listener=listener)
        try:
            await consumer.start()
        except (KafkaError, OSError) as exc:
            await consumer.stop()
            raise self._fail(f"joining group {group!r}", exc) from exc
        return _KafkaConsumer(consumer, self.bootstrap)

    async def reader(
        self,
        topic: str,
        partitions: Sequence[int],
        *,
        group: str,
        client_id: str,
        since_ms: int | None = None,
    ) -> _KafkaConsumer:
        # A group id for committed offsets only: assign() never joins the group, so no
        # rebalance ever moves these partitions or stalls this reader.
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=client_id,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            fetch_max_wait_ms=self._fetch_max_wait_ms,
            request_timeout_ms=self._request_timeout_ms,
            **self._security,
        )
        assigned = [KafkaTopicPartition(topic, p) for p in partitions]
        positions: dict[KafkaTopicPartition, int] = {}
        try:
            await consumer.start()
            consumer.assign(assigned)
            starts: dict[KafkaTopicPartition, int] = {}
            if since_ms is not None:
                # The first record since then, the end where there is none: looked up for
                # every partition at once (seek_to_end waits a fetch cycle per partition).
                found = await consumer.offsets_for_times(dict.fromkeys(assigned, since_ms))
                missing = [tp for tp in assigned if found.get(tp) is None]
                ends = await consumer.end_offsets(missing) if missing else {}
                for tp in assigned:
                    hit = found.get(tp)
                    starts[tp] = hit.offset if hit is not None else ends[tp]
            for tp in assigned:
                # Settled now, not at the first fetch: a destination announces itself
                # (a heartbeat naming its partition) only once it reads from here on.
                committed = await consumer.committed(tp)
                if since_ms is not None:
                    if committed is None or committed < starts[tp]:
                        consumer.seek(tp, starts[tp])
                elif committed is None:
                    await consumer.seek_to_end(tp)
                positions[tp] = await consumer.position(tp)
        except (KafkaError, OSError) as exc:
            await consumer.stop()
            raise self._fail(f"reading {topic} partitions {list(partitions)}", exc) from exc
        return _KafkaConsumer(consumer, self.bootstrap, positions)

    async def partitions_for(self, topic: str) -> int:
        producer, _ = self._require_started()
        partitions = await producer.partitions_for(topic)
        return len(partitions)

    async def cluster_info(self) -> ClusterInfo:
        _, admin = self._require_started()
        try:
            cluster = await admin.describe_cluster()
            topics = await admin.list_topics()
        except KafkaError as exc:
            raise self._fail("describing the cluster", exc) from exc
        return ClusterInfo(
            cluster_id=cluster.get("cluster_id"),
            broker_ids=tuple(sorted(int(b["node_id"]) for b in cluster["brokers"])),
            controller_id=cluster.get("controller_id"),
            topics=frozenset(topics),
        )
