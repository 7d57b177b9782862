"""The in-memory transport: Kafka's semantics inside one process.

Used by the embedded default (every service in one process) and by the fast test tier.
It keeps what the services rely on: partitions chosen by key hash (Kafka's murmur2),
per-partition order, consumer groups that split partitions between their members,
committed offsets per group, and redelivery from the last committed offset when a member
leaves without committing.

Retention: each partition keeps its latest ``retained_bytes`` of record values (None:
every record, for the life of the broker), as a Kafka topic keeps its latest by
``retention.bytes``; offsets keep counting. A reader whose position fell behind what is
kept resumes at the oldest record kept, as a Kafka consumer does with
``auto.offset.reset=earliest``: the records in between are lost to it. The embedded stack
keeps far more than its consumers ever lag (``SWITCHYARD_MEMORY_BUS_BYTES``), so that its
memory stays bounded over a long run.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import time
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from switchyard.bus.partitioner import partition_for_key
from switchyard.bus.records import (
    ClusterInfo,
    Envelope,
    OutgoingRecord,
    RecordMetadata,
    TopicPartition,
)
from switchyard.bus.transport import RevokeCallback
from switchyard.errors import TransportError


class _Log:
    """One partition: the records kept, and the offset of the first of them."""

    __slots__ = ("base", "bytes", "records")

    def __init__(self) -> None:
        self.base = 0
        self.bytes = 0  # of the values kept
        self.records: list[Envelope] = []

    @property
    def end(self) -> int:
        """The offset the next record gets."""
        return self.base + len(self.records)

    def read(self, start: int, count: int) -> tuple[int, list[Envelope]]:
        """Up to ``count`` records from ``start`` (the oldest kept when ``start`` was
        dropped), and the offset they begin at."""
        first = max(start, self.base)
        index = first - self.base
        return first, self.records[index : index + count]

    def append(self, envelope: Envelope, retained_bytes: int | None) -> None:
        self.records.append(envelope)
        self.bytes += len(envelope.value)
        # Amortised: once twice the retention is held, drop the oldest half at once.
        if retained_bytes is not None and self.bytes > 2 * retained_bytes:
            dropped = 0
            while self.bytes > retained_bytes and dropped < len(self.records) - 1:
                self.bytes -= len(self.records[dropped].value)
                dropped += 1
            del self.records[:dropped]
            self.base += dropped


@dataclass(eq=False)
class _Member:
    member_id: str
    topics: frozenset[str]
    on_revoke: RevokeCallback
    since_ms: int | None = None
    positions: dict[TopicPartition, int] = field(default_factory=dict)
    waiter: asyncio.Future[None] | None = None
    """Set while the member waits in :meth:`MemoryBroker.fetch` for a record."""


@dataclass
class _Group:
    members: dict[str, _Member] = field(default_factory=dict)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class MemoryBroker:
    """The shared log: topics, partitions and consumer groups.

    Several :class:`MemoryTransport` objects may share one broker, as separate services
    in one process share one Kafka cluster.
    """

    def __init__(self, retained_bytes: int | None = None) -> None:
        self.retained_bytes = retained_bytes
        self._partitions: dict[str, list[_Log]] = {}
        self._groups: dict[str, _Group] = {}
        # Who waits for a record of each partition: an append wakes only those, not every
        # consumer of the process (the embedded stack has a dozen).
        self._waiting: dict[TopicPartition, set[_Member]] = {}
        self._round_robin = itertools.count()
        self._member_ids = itertools.count(1)

    # -- topics ----------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int) -> None:
        if name not in self._partitions:
            self._partitions[name] = [_Log() for _ in range(partitions)]

    def delete_topic(self, name: str) -> None:
        self._partitions.pop(name, None)

    def partition_count(self, name: str) -> int:
        try:
            return len(self._partitions[name])
        except KeyError:
            raise TransportError(f"unknown topic {name!r}", retriable=False) from None

    def topics(self) -> frozenset[str]:
        return frozenset(self._partitions)

    def append(self, record: OutgoingRecord, default_partitions: int) -> RecordMetadata:
        self.create_topic(record.topic, default_partitions)
        partitions = self._partitions[record.topic]
        if record.partition is not None:
            if not 0 <= record.partition < len(partitions):
                raise TransportError(
                    f"topic {record.topic!r} has no partition {record.partition} "
                    f"(it has {len(partitions)})",
                    retriable=False,
                )
            index = record.partition
        elif record.key is None:
            index = next(self._round_robin) % len(partitions)
        else:
            index = partition_for_key(record.key, len(partitions))
        log = partitions[index]
        offset = log.end
        log.append(
            Envelope(
                topic=record.topic,
                partition=index,
                offset=offset,
                key=record.key,
                value=record.value,
                headers=record.headers,
                timestamp_ms=int(time.time() * 1000),
            ),
            self.retained_bytes,
        )
        waiting = self._waiting.get(TopicPartition(record.topic, index))
        if waiting:
            for member in waiting:
                _wake_member(member)
        return RecordMetadata(record.topic, index, offset)

    def _wake(self) -> None:
        """Wake every waiting member (their partitions may have changed)."""
        for waiting in self._waiting.values():
            for member in waiting:
                _wake_member(member)

    # -- groups ----------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        topics: frozenset[str],
        on_revoke: RevokeCallback,
        since_ms: int | None = None,
    ) -> _Member:
        group = self._groups.setdefault(group_id, _Group())
        member = _Member(f"member-{next(self._member_ids)}", topics, on_revoke, since_ms)
        async with group.lock:
            group.members[member.member_id] = member
            await self._rebalance(group)
        return member

    async def leave(self, group_id: str, member: _Member) -> None:
        group = self._groups[group_id]
        async with group.lock:
            if group.members.pop(member.member_id, None) is not None:
                member.positions.clear()
                await self._rebalance(group)

    def read(
        self, group_id: str, topic: str, partitions: Sequence[int], since_ms: int | None = None
    ) -> _Member:
        """A reader of fixed ``partitions`` of ``topic``: outside the group's members (no
        rebalance moves them), starting at the group's committed offsets or the end (with
        ``since_ms``: at its first record since then, when that is later)."""
        group = self._groups.setdefault(group_id, _Group())
        reader = _Member(f"reader-{next(self._member_ids)}", frozenset({topic}), _no_revoke)
        logs = self._partitions.get(topic, [])
        for partition in partitions:
            if not 0 <= partition < len(logs):
                raise TransportError(
                    f"topic {topic!r} has no partition {partition} (it has {len(logs)})",
                    retriable=False,
                )
            tp = TopicPartition(topic, partition)
            committed = group.committed.get(tp)
            if since_ms is None:
                start = logs[partition].end if committed is None else committed
            else:
                start = max(committed or 0, self._first_since(tp, since_ms))
            reader.positions[tp] = start
        return reader

    async def _rebalance(self, group: _Group) -> None:
        """Spread the partitions of the group's topics round-robin over its members."""
        wanted: dict[str, set[TopicPartition]] = {m: set() for m in group.members}
        for topic in sorted(set().union(*(m.topics for m in group.members.values()))):
            subscribers = sorted(m for m, member in group.members.items() if topic in member.topics)
            for index in range(len(self._partitions.get(topic, []))):
                wanted[subscribers[index % len(subscribers)]].add(TopicPartition(topic, index))
        for member_id, member in group.members.items():
            lost = frozenset(tp for tp in member.positions if tp not in wanted[member_id])
            if lost:
                await member.on_revoke(lost)
                for tp in lost:
                    del member.positions[tp]
        for member_id, member in group.members.items():
            for tp in wanted[member_id]:
                if tp not in member.positions:
                    start = group.committed.get(tp, 0)
                    if member.since_ms is not None:
                        start = max(start, self._first_since(tp, member.since_ms))
                    member.positions[tp] = start
        self._wake()

    def _first_since(self, tp: TopicPartition, since_ms: int) -> int:
        """The offset of ``tp``'s first record appended at or after ``since_ms`` (its
        end when there is none); append times never decrease within a partition."""
        logs = self._partitions.get(tp.topic)
        if logs is None:
            return 0
        log = logs[tp.partition]
        found = bisect.bisect_left(log.records, since_ms, key=lambda e: e.timestamp_ms)
        return log.base + found

    def commit(self, group_id: str, member: _Member, offsets: Mapping[TopicPartition, int]) -> None:
        group = self._groups[group_id]
        for tp, offset in offsets.items():
            if tp in member.positions:  # a member may commit only what it owns
                group.committed[tp] = offset

    async def fetch(self, member: _Member, timeout_s: float, max_records: int) -> list[Envelope]:
        records = self._take(member, max_records)
        if records or timeout_s <= 0:
            return records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            member.waiter = waiter
            watched = list(member.positions)
            for tp in watched:
                self._waiting.setdefault(tp, set()).add(member)
            timer = loop.call_at(deadline, _wake_member, member)
            try:
                await waiter
            finally:
                timer.cancel()
                member.waiter = None
                for tp in watched:
                    waiting = self._waiting.get(tp)
                    if waiting is not None:
                        waiting.discard(member)
            records = self._take(member, max_records)
            if records or loop.time() >= deadline:
                return records

    def lag(self, member: _Member) -> int:
        """Records ``member``'s partitions hold beyond its positions."""
        lag = 0
        for tp, position in member.positions.items():
            log = self._partitions.get(tp.topic)
            if log is not None:
                lag += max(0, log[tp.partition].end - position)
        return lag

    def behind(self, member: _Member) -> bool:
        """Whether ``member`` has records still to read."""
        for tp, position in member.positions.items():
            log = self._partitions.get(tp.topic)
            if log is not None and position < log[tp.partition].end:
                return True
        return False

    def _take(self, member: _Member, max_records: int) -> list[Envelope]:
        taken: list[Envelope] = []
        for tp in sorted(member.positions):
            log = self._partitions.get(tp.topic)
            if log is None:
                continue
            start, batch = log[tp.partition].read(member.positions[tp], max_records - len(taken))
            if batch:
                taken.extend(batch)
                member.positions[tp] = start + len(batch)
            if len(taken) >= max_records:
                break
        return taken


def _wake_member(member: _Member) -> None:
    waiter = member.waiter
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


async def _no_revoke(partitions: frozenset[TopicPartition]) -> None:
    return None


class _MemoryConsumer:
    def __init__(
        self, broker: MemoryBroker, group_id: str, member: _Member, *, joined: bool = True
    ) -> None:
        self._broker = broker
        self._group_id = group_id
        self._member = member
        self._joined = joined
        self._closed = False

    async def fetch(self, timeout_s: float, max_records: int) -> list[Envelope]:
        if self._closed:
            raise TransportError("consumer is closed", retriable=False)
        return await self._broker.fetch(self._member, timeout_s, max_records)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._broker.commit(self._group_id, self._member, offsets)

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._member.positions)

    def caught_up_at_s(self) -> float | None:
        # In process, the broker's answer is now: caught up when every position is at
        # its partition's end.
        if self._broker.behind(self._member):
            return None
        return time.time()

    def lag_records(self) -> int | None:
        return self._broker.lag(self._member)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._joined:
                await self._broker.leave(self._group_id, self._member)
            else:
                self._member.positions.clear()


class MemoryTransport:
    """A :class:`~switchyard.bus.transport.Transport` over a :class:`MemoryBroker`."""

    def __init__(self, broker: MemoryBroker | None = None, *, default_partitions: int = 4) -> None:
        self.broker = broker if broker is not None else MemoryBroker()
        self._default_partitions = default_partitions

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def ensure_topics(self, names: Iterable[str], partitions: int) -> None:
        for name in names:
            self.broker.create_topic(name, partitions)

    async def delete_topics(self, names: Iterable[str]) -> None:
        for name in names:
            self.broker.delete_topic(name)

    async def send(self, record: OutgoingRecord) -> Awaitable[RecordMetadata]:
        done: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        done.set_result(self.broker.append(record, self._default_partitions))
        return done

    async def consumer(
        self,
        topics: Iterable[str],
        *,
        group: str,
        client_id: str,
        on_revoke: RevokeCallback,
        since_ms: int | None = None,
    ) -> _MemoryConsumer:
        member = await self.broker.join(group, frozenset(topics), on_revoke, since_ms)
        return _MemoryConsumer(self.broker, group, member)

    async def reader(
        self,
        topic: str,
        partitions: Sequence[int],
        *,
        group: str,
        client_id: str,
        since_ms: int | None = None,
    ) -> _MemoryConsumer:
        return _MemoryConsumer(
            self.broker, group, self.broker.read(group, topic, partitions, since_ms), joined=False
        )

    async def partitions_for(self, topic: str) -> int:
        return self.broker.partition_count(topic)

    async def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            cluster_id="memory", broker_ids=(0,), controller_id=0, topics=self.broker.topics()
        )
