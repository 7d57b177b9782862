"""The monitor takes back what a live worker was sent and never received: a request its
heartbeats, sent well after the assignment, do not list and that it never started. The
worker stays in service; what it holds, started or may still be receiving is left alone.
"""

from __future__ import annotations

import time

from switchyard.contracts.messages import Heartbeat
from switchyard.contracts.topics import HEARTBEATS
from switchyard.lifecycle import Fence
from switchyard.state import keys

from services.monitor.unclaimed import UNCLAIMED_GRACE_S
from tests.service.monitor_support import (
    WORKER_TIMEOUT_S,
    ManualClock,
    Stack,
    entry,
    eventually,
    heartbeat,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)


async def test_a_request_a_live_worker_never_received_is_taken_back_and_announced(
    stack: Stack,
) -> None:
    await stack.collect_worker_events()
    monitor = await stack.monitor()

    async def restored() -> bool:  # a new store is restored (from empty topics) first
        return monitor.state_watch.known is not None

    await eventually(restored, what="the new store's generation")
    now_s = time.time()
    old_s = now_s - UNCLAIMED_GRACE_S - 1.0
    await stack.send(
        "w1",
        {"lost": old_s, "waiting": old_s, "running": old_s, "started": old_s, "young": now_s},
    )
    # "started": the worker took it in (its finish may be on its way), so it ran there.
    assert await stack.ledger.start_many([Fence("started", 0, "w1")], old_s) == ["started"]

    await stack.bus.publish(
        HEARTBEATS,
        heartbeat(
            "w1",
            1,
            sent_at_s=now_s,
            inbox_read_through_s=now_s - 0.1,
            outstanding=[entry("waiting"), entry("running", running=True)],
            queue_length=1,
            running=1,
        ),
    )

    async def announced() -> bool:
        return any(e.reason == "unclaimed" for e in stack.events)

    await eventually(announced, what="a WorkerDown unclaimed")
    (event,) = stack.events
    assert (event.worker_id, event.orphaned_request_ids) == ("w1", ["lost"])
    lost = await stack.ledger.read("lost")
    assert lost is not None
    # Taken back: the lost message could no longer start it should it turn up.
    assert (lost.status, lost.worker_id, lost.epoch) == ("assigned", "w1", 1)
    assert await stack.ledger.start_many([Fence("lost", 0, "w1")], now_s) == ["superseded"]
    for kept in ("waiting", "running", "young"):
        record = await stack.ledger.read(kept)
        assert record is not None
        assert record.epoch == 0, kept
    # The worker is alive and stays so: this is no death.
    assert (await stack.worker_hash("w1"))["status"] == "alive"
    assert monitor.unclaimed.taken_back == 1
    assert monitor.workers_declared_down == 0


async def test_a_heartbeat_that_proves_nothing_takes_nothing_back(stack: Stack) -> None:
    clock = ManualClock(1000.0)
    monitor = await stack.monitor(run=False, clock=clock)
    await stack.send("cut", {"a": 990.0, "b": 990.0})
    await stack.send("draining", {"c": 990.0})
    await stack.send("silent", {"d": 990.0})
    await stack.send("young", {"e": 999.0})
    await stack.send("behind", {"f": 990.0})
    await stack.send("unread", {"g": 990.0})

    # A list cut short (2 held, 1 listed); a worker that is draining (the drain hands its
    # waiting work over); a heartbeat too old to judge by; one sent within the grace of
    # the assignment; a worker behind on its inbox (it had read through 989 s only: "f"
    # may wait there); one that does not say how far it read.
    def beat(worker_id: str, sequence: int, **fields: object) -> Heartbeat:
        sent_at_s = fields.pop("sent_at_s", clock.now_s)
        read_s = fields.pop("inbox_read_through_s", sent_at_s)
        return heartbeat(
            worker_id, sequence, sent_at_s=sent_at_s, inbox_read_through_s=read_s, **fields
        )

    await monitor.handle_heartbeat(beat("cut", 1, outstanding=[entry("a")], outstanding_total=2))
    await monitor.handle_heartbeat(beat("draining", 1, draining=True))
    await monitor.handle_heartbeat(beat("behind", 1, inbox_read_through_s=989.0))
    await monitor.handle_heartbeat(beat("unread", 1, inbox_read_through_s=None))
    await monitor.handle_heartbeat(beat("young", 1))
    clock.now_s = 1000.0 - WORKER_TIMEOUT_S - 1.0
    await monitor.handle_heartbeat(beat("silent", 1))
    clock.now_s = 1000.0

    assert await monitor.unclaimed.sweep() == 0

    # The same workers' complete, fresh heartbeats, read through, do prove it.
    clock.now_s = 1003.0
    for worker_id in ("cut", "young", "behind", "unread"):
        await monitor.handle_heartbeat(beat(worker_id, 2))
    assert await monitor.unclaimed.sweep() == 5
    for request_id in ("a", "b", "e", "f", "g"):
        record = await stack.ledger.read(request_id)
        assert record is not None
        assert record.epoch == 1, request_id


async def test_nothing_is_taken_back_while_the_store_is_being_restored(stack: Stack) -> None:
    monitor = await stack.monitor(run=False)
    watch = monitor.state_watch
    await watch.check()
    await watch.settled()
    now_s = time.time()
    old_s = now_s - UNCLAIMED_GRACE_S - 1.0
    # What a restore writes back first: an assignment its worker finished long ago (so
    # no heartbeat lists it), its answer not yet restored.
    await stack.send("w1", {"answered-long-ago": old_s})
    await monitor.handle_heartbeat(
        heartbeat("w1", 1, sent_at_s=now_s, inbox_read_through_s=now_s - 0.1)
    )
    await stack.state.delete(keys.STATE_GENERATION)  # the store lost its data
    assert await watch.check()
    assert watch.restoring
    assert await monitor.sweep_unclaimed() == 0
    record = await stack.ledger.read("answered-long-ago")
    assert record is not None
    assert record.epoch == 0
    # Restored (its generation back), the store is swept again.
    await watch.settled()
    now_s = time.time()
    await monitor.handle_heartbeat(
        heartbeat("w1", 2, sent_at_s=now_s, inbox_read_through_s=now_s - 0.1)
    )
    assert await monitor.sweep_unclaimed() == 1
