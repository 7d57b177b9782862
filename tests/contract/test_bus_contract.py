"""One contract suite for the bus, run against the in-memory and the Kafka transport.

What a service relies on: order per key, consumer groups that share partitions, redelivery
of whatever a consumer did not finish, and dead-lettering of records that cannot be
decoded without holding back the rest of their partition.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence

import pytest
from switchyard.bus import Bus, Delivery, Envelope, Subscription
from switchyard.bus.kafka_security import KafkaSecurity, kafka_security
from switchyard.bus.partitioner import partition_for_key
from switchyard.config import load_settings
from switchyard.contracts.dead_letter import DeadLetter
from switchyard.contracts.messages import InferenceRequest
from switchyard.contracts.topics import DEAD_LETTERS, HEARTBEATS, REQUESTS, WORKER_EVENTS
from switchyard.errors import SwitchyardError

from tests.support.bus import (
    BusFactory,
    bus_factory,
    collect,
    drain_for,
    make_request,
    wait_for_assignment,
)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("kafka", marks=pytest.mark.integration),
        # A broker as managed services run them: TLS and a SCRAM user, no plaintext port.
        pytest.param("kafka-sasl-ssl", marks=pytest.mark.integration),
    ]
)
async def make_bus(request: pytest.FixtureRequest, unique_prefix: str) -> AsyncIterator[BusFactory]:
    bootstrap: str | None = None
    security: KafkaSecurity | None = None
    if request.param == "kafka":
        bootstrap = request.getfixturevalue("kafka_bootstrap")
    elif request.param == "kafka-sasl-ssl":
        settings = load_settings(request.getfixturevalue("kafka_secure_env"))
        bootstrap, security = settings.kafka_bootstrap, kafka_security(settings)
    kind = "memory" if request.param == "memory" else "kafka"
    async with bus_factory(
        kind, prefix=unique_prefix, kafka_bootstrap=bootstrap, kafka_security=security
    ) as make:
        yield make


async def test_round_trip_keeps_message_and_describes_it(make_bus: BusFactory) -> None:
    bus = make_bus()
    await bus.start()
    sent = make_request("req-1")
    meta = await bus.publish(REQUESTS, sent)
    assert meta.topic == bus.topic_name(REQUESTS)
    async with bus.subscribe(REQUESTS, group="g") as sub:
        (delivery,) = await collect(sub, 1)
    assert delivery.message == sent
    assert delivery.envelope.key == b"req-1"
    assert delivery.envelope.header("sy-type") == b"inference-request"
    assert delivery.envelope.header("sy-schema") == b"1"
    assert (delivery.envelope.partition, delivery.envelope.offset) == (meta.partition, meta.offset)


async def test_key_picks_the_partition_kafka_would(make_bus: BusFactory) -> None:
    bus = make_bus()
    await bus.start()
    for key in ("21", "worker-7", "req-abc"):
        meta = await bus.publish(REQUESTS, make_request(key))
        assert meta.partition == partition_for_key(key.encode(), 4)


async def test_order_is_kept_per_key(make_bus: BusFactory) -> None:
    bus = make_bus()
    await bus.start()
    keys = [f"worker-{i}" for i in range(5)]
    pending = [
        await bus.send(REQUESTS, make_request(f"r{seq}-{key}", seq=seq), key=key)
        for seq in range(40)
        for key in keys
    ]
    await asyncio.gather(*pending)
    async with bus.subscribe(REQUESTS, group="g") as sub:
        deliveries = await collect(sub, 200)
    by_key: dict[bytes, list[int]] = {}
    for d in deliveries:
        assert d.envelope.key is not None
        by_key.setdefault(d.envelope.key, []).append(d.message.priority)
    assert sorted(by_key) == sorted(k.encode() for k in keys)
    for sequence in by_key.values():
        assert sequence == list(range(40))


async def test_group_members_share_partitions_and_groups_each_see_everything(
    make_bus: BusFactory,
) -> None:
    first, second, other = make_bus(), make_bus(), make_bus()
    for bus in (first, second, other):
        await bus.start()
    async with (
        first.subscribe(REQUESTS, group="scheduler") as a,
        second.subscribe(REQUESTS, group="scheduler") as b,
        other.subscribe(REQUESTS, group="audit") as c,
    ):
        await wait_for_assignment([a, b], partitions=4)
        assert a.assignment().isdisjoint(b.assignment())
        await asyncio.gather(
            *[await first.send(REQUESTS, make_request(f"r{i}")) for i in range(100)]
        )
        audit = await collect(c, 100)
        got_a, got_b = await asyncio.gather(drain_for(a, 2.0), drain_for(b, 2.0))
    ids_a = {d.message.request_id for d in got_a}
    ids_b = {d.message.request_id for d in got_b}
    assert ids_a, "the first member should have received a share"
    assert ids_b, "the second member should have received a share"
    assert ids_a.isdisjoint(ids_b)
    assert ids_a | ids_b == {f"r{i}" for i in range(100)}
    assert {d.message.request_id for d in audit} == ids_a | ids_b


async def test_a_member_joining_mid_stream_makes_no_message_go_missing(
    make_bus: BusFactory,
) -> None:
    first, second, producer = make_bus(), make_bus(), make_bus()
    for bus in (first, second, producer):
        await bus.start()
    seen: list[str] = []
    stopping = asyncio.Event()

    async def record(delivery: Delivery[InferenceRequest]) -> None:
        seen.append(delivery.message.request_id)

    early = asyncio.create_task(
        first.consume(REQUESTS, group="g", handler=record, stopping=stopping)
    )
    for i in range(60):
        await producer.publish(REQUESTS, make_request(f"r{i}"))
        if i == 20:
            # Joins while the first member is waiting in a fetch: a rebalance mid-stream.
            late = asyncio.create_task(
                second.consume(REQUESTS, group="g", handler=record, stopping=stopping)
            )
        await asyncio.sleep(0.01)
    expected = {f"r{i}" for i in range(60)}
    for _ in range(600):
        if expected <= set(seen):
            break
        await asyncio.sleep(0.05)
    stopping.set()
    await asyncio.gather(early, late)
    assert expected - set(seen) == set(), "at-least-once: nothing may go missing"


async def test_consumer_that_dies_before_committing_has_its_messages_redelivered(
    make_bus: BusFactory,
) -> None:
    # Commits are held back for an hour, so nothing the first member handles gets committed.
    crashing = make_bus(commit_interval_s=3600)
    successor = make_bus()
    await crashing.start()
    await successor.start()
    await asyncio.gather(*[await crashing.send(REQUESTS, make_request(f"r{i}")) for i in range(20)])
    sub = crashing.subscribe(REQUESTS, group="worker")
    await sub.open()
    handled = await collect(sub, 10)
    await sub.abort()  # leaves the group without committing, as a killed process would
    async with successor.subscribe(REQUESTS, group="worker") as after:
        redelivered = await collect(after, 20)
    assert {d.message.request_id for d in handled} <= {d.message.request_id for d in redelivered}
    assert len({d.message.request_id for d in redelivered}) == 20


async def test_consumer_that_stops_cleanly_commits_what_it_handled(make_bus: BusFactory) -> None:
    first, second = make_bus(commit_interval_s=3600), make_bus()
    await first.start()
    await second.start()
    key = "one-partition"
    await asyncio.gather(
        *[await first.send(REQUESTS, make_request(f"r{i}", seq=i), key=key) for i in range(10)]
    )
    async with first.subscribe(REQUESTS, group="worker") as sub:
        handled = await collect(sub, 4)
    async with second.subscribe(REQUESTS, group="worker") as after:
        rest = await collect(after, 6)
    assert [d.message.priority for d in handled] == [0, 1, 2, 3]
    assert [d.message.priority for d in rest] == [4, 5, 6, 7, 8, 9]


async def test_a_body_that_raises_leaves_its_message_for_redelivery(make_bus: BusFactory) -> None:
    bus = make_bus()
    await bus.start()
    await bus.publish(REQUESTS, make_request("r-fails", seq=1), key="k")
    await bus.publish(REQUESTS, make_request("r-next", seq=2), key="k")

    async def fail_on_first() -> None:
        async with bus.subscribe(REQUESTS, group="g") as sub:
            async for _ in sub:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fail_on_first()
    async with bus.subscribe(REQUESTS, group="g") as again:
        got = await collect(again, 2)
    assert [d.message.request_id for d in got] == ["r-fails", "r-next"]


async def _take_batches(
    sub: Subscription[InferenceRequest], count: int
) -> list[Delivery[InferenceRequest]]:
    got: list[Delivery[InferenceRequest]] = []
    deadline = asyncio.get_running_loop().time() + 30
    while len(got) < count and asyncio.get_running_loop().time() < deadline:
        got.extend(await sub.next_batch(count - len(got), timeout_s=1.0))
    return got


async def test_batches_keep_order_and_commit_only_when_the_next_is_asked_for(
    make_bus: BusFactory,
) -> None:
    first, second = make_bus(commit_interval_s=3600), make_bus()
    await first.start()
    await second.start()
    key = "one-partition"
    await asyncio.gather(
        *[await first.send(REQUESTS, make_request(f"r{i}", seq=i), key=key) for i in range(10)]
    )
    async with first.subscribe(REQUESTS, group="batcher") as sub:
        handled = await _take_batches(sub, 4)
        assert [d.message.priority for d in handled] == [0, 1, 2, 3]
        with sub.handling(handled[0]):
            pass  # the trace scope of one delivery enters and leaves cleanly
    # The clean exit counted the last batch as handled: the successor starts after it.
    async with second.subscribe(REQUESTS, group="batcher") as after:
        rest = await collect(after, 6)
    assert [d.message.priority for d in rest] == [4, 5, 6, 7, 8, 9]


async def test_a_consumer_s_lag_counts_the_records_it_has_not_fetched(
    make_bus: BusFactory,
) -> None:
    producer, consumer = make_bus(), make_bus(max_batch=3)
    await producer.start()
    await consumer.start()
    key = "one-partition"
    await asyncio.gather(
        *[await producer.send(REQUESTS, make_request(f"l{i}", seq=i), key=key) for i in range(10)]
    )
    async with consumer.subscribe(REQUESTS, group="lagging") as sub:
        assert sub.lag_records() is None or sub.lag_records() == 10  # before a first fetch
        first = await sub.next_batch(3, timeout_s=10.0)
        assert len(first) == 3
        assert sub.lag_records() == 7
        assert consumer.lags() == {(REQUESTS.name, "lagging"): 7}
        rest = await _take_batches(sub, 7)
        assert len(rest) == 7
        assert sub.lag_records() == 0


async def test_a_batch_whose_body_raises_is_delivered_again(make_bus: BusFactory) -> None:
    bus = make_bus(commit_interval_s=3600)
    await bus.start()
    for i in range(3):
        await bus.publish(REQUESTS, make_request(f"r{i}", seq=i), key="k")

    async def fail_after_batch() -> None:
        async with bus.subscribe(REQUESTS, group="g") as sub:
            batch = await _take_batches(sub, 3)
            assert len(batch) == 3
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await fail_after_batch()
    async with bus.subscribe(REQUESTS, group="g") as again:
        got = await collect(again, 3)
    assert [d.message.request_id for d in got] == ["r0", "r1", "r2"]


async def test_a_key_filter_skips_other_keys_without_holding_them_back(
    make_bus: BusFactory,
) -> None:
    first, second = make_bus(commit_interval_s=3600), make_bus()
    await first.start()
    await second.start()
    for i in range(6):
        key = "mine" if i % 2 == 0 else "theirs"
        await first.publish(REQUESTS, make_request(f"r{i}", seq=i), key=key)

    def wanted(envelope: Envelope) -> bool:
        return envelope.key == b"mine"

    async with first.subscribe(REQUESTS, group="filtered", record_filter=wanted) as sub:
        got = await collect(sub, 3)
    assert [d.message.request_id for d in got] == ["r0", "r2", "r4"]
    # Skipped records read before the last delivery count as handled: the group's
    # successor does not see r1 or r3 again (r5 came after the last one read).
    await first.publish(REQUESTS, make_request("r6", seq=6), key="theirs")
    async with second.subscribe(REQUESTS, group="filtered") as after:
        rest = await collect(after, 2)
    assert [d.message.request_id for d in rest] == ["r5", "r6"]


async def _old_then_new(bus: Bus) -> float:
    """Four requests ``old*``, then three ``new*``; the wall time between them."""
    for i in range(4):
        await bus.publish(REQUESTS, make_request(f"old{i}", seq=i))
    await asyncio.sleep(0.05)
    since_s = time.time()
    await asyncio.sleep(0.05)
    for i in range(3):
        await bus.publish(REQUESTS, make_request(f"new{i}", seq=i))
    return since_s


async def test_a_reader_since_a_time_skips_what_came_before_it(make_bus: BusFactory) -> None:
    first, second = make_bus(), make_bus()
    await first.start()
    await second.start()
    since_s = await _old_then_new(first)
    # A fresh group starts at the first record of each partition appended since then.
    async with second.subscribe(REQUESTS, group="fresh", since_s=since_s) as sub:
        got = await collect(sub, 3)
        assert await drain_for(sub, 0.5) == []
    assert sorted(d.message.request_id for d in got) == ["new0", "new1", "new2"]
    # A group that committed further on keeps its place; and what comes after the
    # reader joined is read, on partitions with nothing new before it too.
    async with second.subscribe(REQUESTS, group="fresh", since_s=since_s) as again:
        await wait_for_assignment([again], 4)
        await first.publish(REQUESTS, make_request("later"))
        (later,) = await collect(again, 1)
        assert await drain_for(again, 0.5) == []
    assert later.message.request_id == "later"


async def test_a_reader_of_given_partitions_since_a_time_reads_what_came_since(
    make_bus: BusFactory,
) -> None:
    first, second = make_bus(), make_bus()
    await first.start()
    await second.start()
    since_s = await _old_then_new(first)
    every = list(range(await second.partitions_of(REQUESTS)))
    # No group rebalance, and not from the end: from each partition's first record since.
    reader = second.subscribe(REQUESTS, group="restore", partitions=every, since_s=since_s)
    async with reader as sub:
        got = await collect(sub, 3)
        assert await drain_for(sub, 0.5) == []
    assert sorted(d.message.request_id for d in got) == ["new0", "new1", "new2"]


async def _dead_letters(bus_maker: BusFactory, count: int) -> list[DeadLetter]:
    reader = bus_maker()
    await reader.start()
    async with reader.subscribe(DEAD_LETTERS, group="dlq-reader") as sub:
        return [d.message for d in await collect(sub, count)]


async def test_undecodable_records_are_dead_lettered_without_holding_back_the_partition(
    make_bus: BusFactory,
) -> None:
    bus = make_bus()
    await bus.start()
    key = b"same-partition"
    good = make_request("r-good-1")
    await bus.publish(REQUESTS, good, key=key.decode())
    bad = await bus.publish_bytes(REQUESTS, b"\xff\xfe not json", key=key)
    await bus.publish(REQUESTS, make_request("r-good-2"), key=key.decode())
    async with bus.subscribe(REQUESTS, group="g") as sub:
        got = await collect(sub, 2)
    assert [d.message.request_id for d in got] == ["r-good-1", "r-good-2"]
    (letter,) = await _dead_letters(make_bus, 1)
    assert letter.reason_kind == "bad_bytes"
    assert letter.original_value() == b"\xff\xfe not json"
    assert letter.original_key() == key
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        bad.topic,
        bad.partition,
        bad.offset,
    )
    assert letter.consumer_group == "g"


async def test_wrong_schema_version_and_invalid_fields_are_dead_lettered_with_reasons(
    make_bus: BusFactory,
) -> None:
    bus = make_bus()
    await bus.start()
    future = json.loads(make_request("r-v2").model_dump_json())
    future["schema_version"] = 2
    await bus.publish_bytes(REQUESTS, json.dumps(future).encode(), key=b"k")
    missing = json.loads(make_request("r-missing").model_dump_json())
    del missing["app"]
    await bus.publish_bytes(REQUESTS, json.dumps(missing).encode(), key=b"k")
    heartbeat_bytes = make_request("r-typed").model_dump_json().encode()
    await bus.publish_bytes(
        REQUESTS, heartbeat_bytes, key=b"k", headers=[("sy-type", b"heartbeat")]
    )
    await bus.publish(REQUESTS, make_request("r-ok"), key="k")
    async with bus.subscribe(REQUESTS, group="g") as sub:
        (ok,) = await collect(sub, 1)
    assert ok.message.request_id == "r-ok"
    letters = await _dead_letters(make_bus, 3)
    kinds = [letter.reason_kind for letter in letters]
    assert kinds == ["schema_version", "validation", "message_type"]
    assert "version 2" in letters[0].reason
    assert "app" in letters[1].reason
    assert "heartbeat" in letters[2].reason


async def test_handler_failures_retry_when_retriable_and_dead_letter_otherwise(
    make_bus: BusFactory,
) -> None:
    bus = make_bus()
    await bus.start()
    for name in ("r-flaky", "r-poison", "r-fine"):
        await bus.publish(REQUESTS, make_request(name), key="k")
    attempts: dict[str, int] = {}
    handled: list[str] = []
    stopping = asyncio.Event()

    async def handler(delivery: Delivery[InferenceRequest]) -> None:
        request_id = delivery.message.request_id
        attempts[request_id] = attempts.get(request_id, 0) + 1
        if request_id == "r-flaky" and attempts[request_id] < 3:
            raise ConnectionError("redis went away")
        if request_id == "r-poison":
            raise SwitchyardError("cannot schedule: unknown application")
        handled.append(request_id)
        if request_id == "r-fine":
            stopping.set()

    await asyncio.wait_for(bus.consume(REQUESTS, group="g", handler=handler, stopping=stopping), 30)
    assert handled == ["r-flaky", "r-fine"]
    assert attempts == {"r-flaky": 3, "r-poison": 1, "r-fine": 1}
    (letter,) = await _dead_letters(make_bus, 1)
    assert letter.reason_kind == "handler"
    assert "unknown application" in letter.reason


async def test_a_batch_handler_failure_dead_letters_only_the_message_that_causes_it(
    make_bus: BusFactory,
) -> None:
    """A poison message in a batch never stops the consumer: the batch is handled again
    one message at a time, the poison is dead-lettered (and its owner told), the rest are
    handled, and nothing is delivered again to the next member."""
    bus = make_bus()
    await bus.start()
    names = ["r-1", "r-poison", "r-3"]
    for name in names:
        await bus.publish(REQUESTS, make_request(name), key="k")
    handled: list[str] = []
    told: list[tuple[str, str]] = []

    async def handler(batch: Sequence[Delivery[InferenceRequest]]) -> None:
        ids = [d.message.request_id for d in batch]
        if "r-poison" in ids:
            raise ValueError("features overflow float32")
        handled.extend(ids)

    async def on_dead_letter(delivery: Delivery[InferenceRequest], reason: str) -> None:
        told.append((delivery.message.request_id, reason))

    async with bus.subscribe(REQUESTS, group="g") as sub:
        batch: list[Delivery[InferenceRequest]] = []
        deadline = time.monotonic() + 20
        while len(batch) < 3 and time.monotonic() < deadline:
            batch += await sub.next_batch(10, timeout_s=0.5)
        await sub.handle_batch(batch, handler, on_dead_letter=on_dead_letter)
    assert handled == ["r-1", "r-3"]
    assert told == [("r-poison", "handler failed: ValueError: features overflow float32")]
    (letter,) = await _dead_letters(make_bus, 1)
    assert letter.reason_kind == "handler"
    assert "overflow" in letter.reason
    await bus.publish(REQUESTS, make_request("r-next"), key="k")
    async with bus.subscribe(REQUESTS, group="g") as again:
        (after,) = await collect(again, 1)
    assert after.message.request_id == "r-next"


async def test_a_message_of_the_wrong_type_is_refused_at_publish(make_bus: BusFactory) -> None:
    bus = make_bus()
    await bus.start()
    with pytest.raises(TypeError, match="carries Heartbeat"):
        await bus.publish(HEARTBEATS, make_request("r1"))  # type: ignore[misc]


async def test_a_group_reads_one_topic_per_process(make_bus: BusFactory) -> None:
    """A group shared by two topics would rebalance one topic's consumer whenever the
    other's joins or leaves (a scheduler once stalled 10 s that way): refused by name."""
    bus = make_bus()
    await bus.start()
    async with bus.subscribe(REQUESTS, group="scheduler"):
        again = bus.subscribe(REQUESTS, group="scheduler")  # a second member: fine
        with pytest.raises(ValueError, match=r"consumer group 'scheduler' already reads"):
            bus.subscribe(WORKER_EVENTS, group="scheduler")
        assert again.topic is REQUESTS
