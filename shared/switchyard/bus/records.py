"""What moves through a transport: plain bytes with a key, headers and a position.

These types are the same for the Kafka and the in-memory transport, so that encoding,
validation, dead-lettering and tracing run identically over both.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of one topic."""

    topic: str
    partition: int


Headers = tuple[tuple[str, bytes], ...]
"""Message headers in order; a name may repeat, as in Kafka."""


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """A record about to be published: to ``partition`` when given (an addressed topic,
    where each destination reads a partition of its own), else to the partition its key
    hashes to."""

    topic: str
    value: bytes
    key: bytes | None = None
    headers: Headers = ()
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where the broker stored a published record."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Envelope:
    """A record as a consumer receives it.

    Attributes:
        timestamp_ms: the broker's (or memory transport's) append time, epoch milliseconds.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Headers
    timestamp_ms: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None."""
        found = None
        for key, value in self.headers:
            if key == name:
                found = value
        return found


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """What the broker says about itself (used by health checks and tests)."""

    cluster_id: str | None
    broker_ids: tuple[int, ...]
    controller_id: int | None
    topics: frozenset[str]
