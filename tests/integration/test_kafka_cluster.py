"""The integration tier talks to a real Kafka broker: its metadata proves it."""

from __future__ import annotations

import pytest
from switchyard.bus import bus_from_settings
from switchyard.config import load_settings
from switchyard.contracts.topics import ALL_TOPICS


async def test_bus_reads_the_real_brokers_cluster_metadata(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    settings = load_settings(
        {},
        bus="kafka",
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=unique_prefix,
        topic_partitions=3,
        addressed_partitions=5,
    )
    bus = bus_from_settings(settings)
    await bus.start()
    try:
        info = await bus.ping()
        # A KRaft cluster id is a base64 UUID of 22 characters; the in-memory bus says "memory".
        assert info.cluster_id is not None
        assert len(info.cluster_id) == 22
        assert info.broker_ids
        assert info.controller_id in info.broker_ids
        names = {bus.topic_name(t) for t in ALL_TOPICS}
        assert names <= info.topics
        # Keyed topics get the configured count; addressed ones a partition per
        # destination (worker inboxes, ingress answers).
        for topic in ALL_TOPICS:
            expected = 5 if topic.addressed else 3
            assert await bus.transport.partitions_for(bus.topic_name(topic)) == expected
    finally:
        await bus.transport.delete_topics(bus.topic_name(t) for t in ALL_TOPICS)
        await bus.stop()


async def test_an_unreachable_broker_is_a_retriable_error_naming_the_address() -> None:
    settings = load_settings({}, bus="kafka", kafka_bootstrap="127.0.0.1:1")
    bus = bus_from_settings(settings)
    with pytest.raises(Exception, match=r"127\.0\.0\.1:1") as caught:
        await bus.start()
    assert getattr(caught.value, "retriable", False)
