"""The byte-level seam under the bus: Kafka and in-memory implement these Protocols.

A transport moves :class:`OutgoingRecord` bytes to partitions and hands
:class:`Envelope` batches to group consumers. It knows nothing of message types,
validation, dead letters or tracing; :class:`switchyard.bus.Bus` does that once for
every transport.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

from switchyard.bus.records import (
    ClusterInfo,
    Envelope,
    OutgoingRecord,
    RecordMetadata,
    TopicPartition,
)

RevokeCallback = Callable[[frozenset[TopicPartition]], Awaitable[None]]
"""Called before partitions are taken from a consumer, so it can commit what it handled."""


class TransportConsumer(Protocol):
    """One member of a consumer group."""

    async def fetch(self, timeout_s: float, max_records: int) -> list[Envelope]:
        """Up to ``max_records`` records from assigned partitions, in offset order per
        partition; an empty list when nothing arrived within ``timeout_s``."""
        ...

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit, for each partition, the offset of the next record to read."""
        ...

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member owns now."""
        ...

    def caught_up_at_s(self) -> float | None:
        """The wall time of the broker's latest answer that showed this consumer had
        been given every record of every partition it owns; None when that is not so
        now, or not known (before a first fetch)."""
        ...

    def lag_records(self) -> int | None:
        """Records the partitions it owns hold beyond what it was handed, by the
        broker's latest answer, over the partitions whose position it knows; None when
        it knows none (before a first fetch)."""
        ...

    async def close(self) -> None:
        """Leave the group without committing anything further."""
        ...


class Transport(Protocol):
    """A broker connection: a producer, consumers and topic administration."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ensure_topics(self, names: Iterable[str], partitions: int) -> None:
        """Create the topics that do not exist yet; existing ones are left as they are."""
        ...

    async def delete_topics(self, names: Iterable[str]) -> None: ...

    async def send(self, record: OutgoingRecord) -> Awaitable[RecordMetadata]:
        """Queue a record; the returned awaitable resolves once the broker acknowledged it.

        Awaiting ``send`` itself only waits for room in the producer's buffer, so a caller
        may queue many records before awaiting their acknowledgements.
        """
        ...

    async def consumer(
        self,
        topics: Iterable[str],
        *,
        group: str,
        client_id: str,
        on_revoke: RevokeCallback,
        since_ms: int | None = None,
    ) -> TransportConsumer:
        """Join consumer group ``group`` on ``topics``; reading starts at the group's
        committed offsets, or at the earliest record when there are none. With
        ``since_ms`` (epoch milliseconds), never before a partition's first record
        appended at or after it: older ones are skipped, not fetched."""
        ...

    async def reader(
        self,
        topic: str,
        partitions: Sequence[int],
        *,
        group: str,
        client_id: str,
        since_ms: int | None = None,
    ) -> TransportConsumer:
        """Read ``partitions`` of ``topic`` without joining a group's rebalances (the
        reader owns them until it closes); ``group`` only keeps its committed offsets.
        Reading starts at the group's committed offset of each partition, or at its end
        when there is none (what came before was for another reader); with ``since_ms``,
        at the first record appended at or after it when that is later (the end when
        there is none). Positions are settled before this returns, so a record published
        afterwards is read."""
        ...

    async def partitions_for(self, topic: str) -> int:
        """Number of partitions of an existing topic."""
        ...

    async def cluster_info(self) -> ClusterInfo: ...
