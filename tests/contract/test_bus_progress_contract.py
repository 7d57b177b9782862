"""How far a reader has heard, on both transports: what the monitor judges silence by.

``Subscription.handled_through_s`` is the wall time by which every record the broker
held for the reader's partitions had been handled. It must not run ahead of a record
still in hand (a heartbeat not yet recorded would make its worker look silent), and it
must move on once everything is handled.
"""

from __future__ import annotations

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
