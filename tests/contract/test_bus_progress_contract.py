"""How far a reader has heard, on both transports: what the monitor judges silence by.

``Subscription.handled_through_s`` is the wall time by which every record the broker
held for the reader's partitions had been handled. It must not run ahead of a record
still in hand (a heartbeat not yet recorded would make its worker look silent), and it
must move on once everything is handled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from switchyard.contracts.topics import REQUESTS

from tests.support.bus import BusFactory, bus_factory, make_request


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.integration)])
async def make_bus(request: pytest.FixtureRequest, unique_prefix: str) -> AsyncIterator[BusFactory]:
    bootstrap = request.getfixturevalue("kafka_bootstrap") if request.param == "kafka" else None
    async with bus_factory(request.param, prefix=unique_prefix, kafka_bootstrap=bootstrap) as make:
        yield make


async def test_a_reader_hears_through_what_it_handled_and_no_further(
    make_bus: BusFactory,
) -> None:
    bus = make_bus()
    await bus.start()
    partitions = list(range(await bus.partitions_of(REQUESTS)))
    reader = bus.subscribe(REQUESTS, group="progress", partitions=partitions)
    opened_s = time.time()
    async with reader:
        assert await reader.next_within(1.5) is None
        idle_s = reader.handled_through_s()
        assert idle_s is not None
        assert idle_s >= opened_s - 0.05

        for seq in range(3):
            await bus.publish(REQUESTS, make_request(f"r{seq}", seq=seq))
        published_s = time.time()
        first = await reader.next_within(10.0)
        assert first is not None
        # One record in hand: how far the reader has heard stays where it was.
        in_hand_s = reader.handled_through_s()
        assert in_hand_s is not None
        assert in_hand_s < published_s

        seen = [first.message.request_id]
        while (delivery := await reader.next_within(1.5)) is not None:
            seen.append(delivery.message.request_id)
        assert sorted(seen) == ["r0", "r1", "r2"]
        # Everything handled, and the broker said there was no more: past the publish.
        through_s = reader.handled_through_s()
        assert through_s is not None
        assert through_s >= published_s


async def test_a_reader_busy_at_every_ask_still_hears_through_its_idle_moments(
    make_bus: BusFactory,
) -> None:
    """A steady stream (heartbeats of many workers) can find the reader with a batch in
    hand whenever it is asked: the time it had caught up between batches still counts."""
    bus = make_bus()
    await bus.start()
    partitions = list(range(await bus.partitions_of(REQUESTS)))
    reader = bus.subscribe(REQUESTS, group="progress-busy", partitions=partitions)
    async with reader:
        assert await reader.next_within(1.5) is None
        before_s = reader.handled_through_s()
        assert before_s is not None
        await bus.publish(REQUESTS, make_request("a", seq=0))
        first = await reader.next_batch(10, timeout_s=10.0)
        assert [d.message.request_id for d in first] == ["a"]
        # The next ask finishes "a" with nothing else held (an idle moment nobody asks
        # about), waits, and takes "b" once it comes.
        asking = asyncio.create_task(reader.next_batch(10, timeout_s=10.0))
        await asyncio.sleep(0.5)
        idle_s = time.time()
        await bus.publish(REQUESTS, make_request("b", seq=1))
        second = await asking
        assert [d.message.request_id for d in second] == ["b"]
        # Asked now, with "b" in hand: heard at least through the moment "a" was done.
        busy_s = reader.handled_through_s()
        assert busy_s is not None
        assert busy_s > before_s
        assert busy_s <= idle_s
