"""The in-memory bus keeps the latest bytes of each partition, not all of them: offsets
go on counting, and a reader that fell behind what is kept resumes at the oldest kept
(Kafka's ``auto.offset.reset=earliest``), so the embedded stack's memory stays bounded."""

from __future__ import annotations

from switchyard.bus.memory import MemoryBroker
from switchyard.bus.records import OutgoingRecord, TopicPartition


def publish(broker: MemoryBroker, count: int, start: int = 0) -> list[int]:
    return [
        broker.append(OutgoingRecord("t", str(i).encode(), partition=0), 1).offset
        for i in range(start, start + count)
    ]


async def test_a_partition_keeps_its_latest_records_and_offsets_go_on() -> None:
    broker = MemoryBroker(retained_bytes=4_000)
    broker.create_topic("t", 1)
    offsets = publish(broker, 5_000)
    assert offsets == list(range(5_000))
    log = broker._partitions["t"][0]
    # Values of 3 or 4 bytes: between the retention and twice it.
    assert 4_000 <= log.bytes <= 8_000
    assert log.bytes == sum(len(e.value) for e in log.records)
    assert log.end == 5_000
    assert log.records[-1].value == b"4999"


async def test_a_reader_that_fell_behind_resumes_at_the_oldest_record_kept() -> None:
    broker = MemoryBroker(retained_bytes=4_000)
    broker.create_topic("t", 1)
    behind = broker.read("g", "t", [0])  # at offset 0, then left behind
    publish(broker, 3_000)
    first = await broker.fetch(behind, 0, 10)
    kept = broker._partitions["t"][0].base
    assert kept > 0
    assert [e.offset for e in first] == list(range(kept, kept + 10))
    assert behind.positions[TopicPartition("t", 0)] == kept + 10


async def test_without_a_bound_every_record_is_kept() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 1)
    publish(broker, 3_000)
    assert len(broker._partitions["t"][0].records) == 3_000
