"""The message bus: one interface, a Kafka and an in-memory transport.

See :mod:`switchyard.bus.bus` for delivery semantics.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.bus.bus import Bus
from switchyard.bus.delivery import Delivery, RecordFilter
from switchyard.bus.memory import MemoryBroker, MemoryTransport
from switchyard.bus.middleware import BusMiddleware
from switchyard.bus.records import (
    ClusterInfo,
    Envelope,
    OutgoingRecord,
    RecordMetadata,
    TopicPartition,
)
from switchyard.bus.subscription import Subscription
from switchyard.bus.transport import Transport, TransportConsumer
from switchyard.config import Settings

__all__ = [
    "Bus",
    "BusMiddleware",
    "ClusterInfo",
    "Delivery",
    "Envelope",
    "MemoryBroker",
    "MemoryTransport",
    "OutgoingRecord",
    "RecordFilter",
    "RecordMetadata",
    "Subscription",
    "TopicPartition",
    "Transport",
    "TransportConsumer",
    "bus_from_settings",
]


def bus_from_settings(
    settings: Settings,
    *,
    middlewares: Sequence[BusMiddleware] = (),
    memory_broker: MemoryBroker | None = None,
) -> Bus:
    """The bus ``settings`` ask for: Kafka at ``kafka_bootstrap``, or in-memory.

    ``memory_broker`` lets several in-process services share one in-memory log (the
    embedded mode); it is ignored for Kafka.
    """
    transport: Transport
    if settings.bus == "kafka":
        # aiokafka only where it is used
        from switchyard.bus.kafka import KafkaTransport
        from switchyard.bus.kafka_security import kafka_security

        transport = KafkaTransport(
            settings.kafka_bootstrap,
            client_id=f"switchyard-{settings.instance_id}",
            linger_ms=settings.kafka_linger_ms,
            fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
            session_timeout_ms=settings.kafka_session_timeout_ms,
            heartbeat_interval_ms=settings.kafka_heartbeat_interval_ms,
            security=kafka_security(settings),
        )
    else:
        transport = MemoryTransport(memory_broker, default_partitions=settings.topic_partitions)
    return Bus(
        transport,
        topic_prefix=settings.topic_prefix,
        partitions=settings.topic_partitions,
        middlewares=middlewares,
        commit_interval_s=settings.commit_interval_s,
        client_id=f"switchyard-{settings.instance_id}",
        addressed_partitions=settings.addressed_partitions,
    )
