"""The monitor over the in-memory bus and state store: worker records from heartbeats,
dead-worker detection with orphans (the request ledger's assigned sets), drains, two
replicas, the stranded sweep.

Answers are not counted here: the request ledger's finish transition counts them
(tests/contract/test_lifecycle_contract.py, and tests/unit/test_cluster_records.py for
the counters as the policies read them)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import pytest
from switchyard.cluster import WorkerStatus, read_cluster
from switchyard.contracts.messages import (
    Heartbeat,
)
from switchyard.contracts.topics import HEARTBEATS
from switchyard.lifecycle import Assign
from switchyard.state import keys

from services.monitor import MonitorService
from services.monitor.service import STRANDED_GRACE_S
from tests.service.monitor_support import (
    CHECK_PERIOD_S,
    WORKER_TIMEOUT_S,
    ManualClock,
    Stack,
    answer,
    assignment,
    entry,
    eventually,
    heartbeat,
    stack_fixture,  # noqa: F401 (the ``stack`` fixture)
)


async def test_heartbeats_become_worker_state(stack: Stack) -> None:
    await stack.monitor()
    beat = heartbeat(
        "w1", 1, queue_length=2, outstanding=[entry("r1"), entry("r2")], inbox_partition=5
    )
    before_s = time.time()
    await stack.bus.publish(HEARTBEATS, beat)

    async def written() -> bool:
        return "heartbeat" in await stack.worker_hash("w1")

    await eventually(written, what="worker:w1")
    fields = await stack.worker_hash("w1")
    assert Heartbeat.model_validate_json(fields["heartbeat"]) == beat
    assert fields["status"] == "alive"
    assert fields["sequence"] == "1"
    assert fields["profile"] == "a100-80gb/llama-2-7b"
    assert before_s <= float(fields["last_seen_s"]) <= time.time()
    assert await stack.state.zscore(keys.WORKERS, "w1") == float(fields["last_seen_s"])
    view = await read_cluster(stack.state, time.time())
    record = view.get("w1")
    assert record is not None
    assert record.status is WorkerStatus.ALIVE
    assert record.heartbeat == beat
    assert record.heartbeat.inbox_partition == 5  # where the scheduler sends its work


async def test_a_heartbeat_older_than_the_stored_one_is_ignored(stack: Stack) -> None:
    monitor = await stack.monitor(run=False)
    assert await monitor.handle_heartbeat(heartbeat("w1", 5, queue_length=5))
    assert not await monitor.handle_heartbeat(heartbeat("w1", 3, queue_length=3))
    assert not await monitor.handle_heartbeat(heartbeat("w1", 5, queue_length=5))  # redelivery
    fields = await stack.worker_hash("w1")
    assert fields["sequence"] == "5"
    assert Heartbeat.model_validate_json(fields["heartbeat"]).queue_length == 5
    assert (monitor.heartbeats_accepted, monitor.heartbeats_stale) == (1, 2)
    assert await monitor.handle_heartbeat(heartbeat("w1", 6))


async def test_a_silent_worker_is_declared_down_with_its_orphans(stack: Stack) -> None:
    await stack.collect_worker_events()
    clock = ManualClock(1000.0)
    monitor = await stack.monitor(run=False, clock=clock)
    await stack.send("w1", {"r-sent": 1.0, "r-wait": 2.0})
    beat = heartbeat(
        "w1",
        1,
        outstanding=[entry("r-run", running=True), entry("r-wait")],
        outstanding_total=2,
    )
    assert await monitor.handle_heartbeat(beat)
    # Silent for exactly the timeout: still alive; a hundredth of a second more: down.
    clock.now_s = 1000.0 + WORKER_TIMEOUT_S
    assert await monitor.check_liveness() == []
    clock.now_s = 1000.0 + WORKER_TIMEOUT_S + 0.01
    assert await monitor.check_liveness() == ["w1"]

    async def down() -> bool:
        return bool(stack.events)

    await eventually(down, what="WorkerDown")
    event = stack.events[0]
    fields = await stack.worker_hash("w1")
    assert event.worker_id == "w1"
    assert event.reason == "heartbeat-timeout"
    assert event.last_heartbeat_s == 1000.0
    assert event.detected_at_s == 1000.0 + WORKER_TIMEOUT_S + 0.01
    assert sorted(event.orphaned_request_ids) == ["r-run", "r-sent", "r-wait"]
    assert fields["status"] == "down"
    assert fields["down_reason"] == "heartbeat-timeout"
    assert await stack.assigned("w1") == []  # handed over in the event

    # It comes back: alive again, and no second WorkerDown for the old death.
    clock.now_s += 1.0
    assert await monitor.handle_heartbeat(heartbeat("w1", 2))
    fields = await stack.worker_hash("w1")
    assert fields["status"] == "alive"
    assert "down_reason" not in fields
    assert await monitor.check_liveness() == []
    await asyncio.sleep(0.1)  # a second WorkerDown would have arrived by now
    assert len(stack.events) == 1


async def test_two_monitors_publish_one_worker_down_per_death(stack: Stack) -> None:
    await stack.collect_worker_events()
    first = await stack.monitor()
    second = await stack.monitor()
    await stack.bus.publish(HEARTBEATS, heartbeat("w1", 1, outstanding=[entry("r1")]))

    async def down() -> bool:
        return bool(stack.events)

    await eventually(down, timeout_s=WORKER_TIMEOUT_S + 5, what="WorkerDown")
    # Both keep checking; give them several more rounds to publish a duplicate.
    checks = first.liveness_checks + second.liveness_checks
    await eventually(
        _more_checks(first, second, checks + 6), what="further liveness checks by both"
    )
    assert [e.worker_id for e in stack.events] == ["w1"]
    assert first.workers_declared_down + second.workers_declared_down == 1


def _more_checks(a: MonitorService, b: MonitorService, total: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return a.liveness_checks + b.liveness_checks >= total and a.liveness_checks > 2

    return check


async def test_concurrent_checks_on_one_store_declare_a_death_once(stack: Stack) -> None:
    clock = ManualClock(1000.0)
    first = await stack.monitor(run=False, clock=clock)
    second = await stack.monitor(run=False, clock=clock)
    await first.handle_heartbeat(heartbeat("w1", 1))
    clock.now_s = 1000.0 + WORKER_TIMEOUT_S + 0.01
    results = await asyncio.gather(first.check_liveness(), second.check_liveness())
    assert sorted(results) == [[], ["w1"]]
    # Nothing more to declare on later checks.
    assert await first.check_liveness() == []
    assert await second.check_liveness() == []


async def test_a_request_assigned_to_a_dead_worker_after_its_death_is_orphaned_again(
    stack: Stack,
) -> None:
    """A scheduler replica that had not yet seen the death assigned r-late to w1 after the
    WorkerDown was handled: the sweep lists it in one more WorkerDown, once; a request
    re-assigned since (r-moved) or finished (r-done) left only a stale entry and is not
    listed; an entry younger than the grace is left for the first re-assignment."""
    await stack.collect_worker_events()
    clock = ManualClock(1000.0)
    monitor = await stack.monitor(run=False, clock=clock)
    await monitor.handle_heartbeat(heartbeat("w1", 1))
    clock.now_s = 1000.0 + WORKER_TIMEOUT_S + 0.01
    assert await monitor.check_liveness() == ["w1"]
    await stack.send("w1", {"r-late": 1000.5, "r-moved": 1000.5, "r-done": 1000.5})
    # r-moved went to w2 since (a re-assignment naming no worker to replace leaves the
    # entry behind); r-done was answered without a worker's fence (the scheduler's own).
    moved = Assign(assignment("r-moved", "w2", at_s=1000.6, epoch=1), replaces_epoch=0)
    assert (await stack.ledger.assign(moved)).result == "assigned"
    assert await stack.ledger.finish_many([answer("r-done", "w1")], worker_fenced=False) == [
        "finished"
    ]
    assert await stack.assigned("w1") == ["r-done", "r-late", "r-moved"]
    # Within the grace: nothing yet.
    clock.now_s = 1000.5 + STRANDED_GRACE_S / 2
    await monitor.check_liveness()
    # Past it: one WorkerDown listing only the stranded request, and a clean set.
    clock.now_s = 1000.5 + STRANDED_GRACE_S + 0.01
    await monitor.check_liveness()
    await monitor.check_liveness()

    async def both() -> bool:
        return len(stack.events) >= 2

    await eventually(both, what="the second WorkerDown")
    await asyncio.sleep(0.1)  # a third would have arrived by now
    assert [e.orphaned_request_ids for e in stack.events] == [[], ["r-late"]]
    assert stack.events[1].worker_id == "w1"
    assert await stack.assigned("w1") == []
    assert await stack.assigned("w2") == ["r-moved"]  # untouched: w2 runs it
    assert monitor.stranded_orphaned == 1
    assert (await stack.worker_hash("w1"))["status"] == "down"


async def test_a_worker_heard_within_the_timeout_stays_alive(stack: Stack) -> None:
    clock = ManualClock(1000.0)
    monitor = await stack.monitor(run=False, clock=clock)
    await monitor.handle_heartbeat(heartbeat("w1", 1))
    clock.now_s = 1000.0 + WORKER_TIMEOUT_S
    assert await monitor.check_liveness() == []
    assert (await stack.worker_hash("w1"))["status"] == "alive"


async def test_orphans_follow_the_request_ledger_s_moves_and_answers(stack: Stack) -> None:
    """What a dead worker's WorkerDown lists is what the ledger says it still holds: a
    request moved away (even one whose old run answered late) is listed only by the
    worker it moved to, and a request it answered is listed by neither."""
    await stack.collect_worker_events()
    clock = ManualClock(1000.0)
    monitor = await stack.monitor(run=False, clock=clock)
    for wid in ("w1", "w2"):
        await monitor.handle_heartbeat(heartbeat(wid, 1))
    await stack.send("w1", {"r-moved": 1.0, "r-answered": 1.0, "r-kept": 1.0})
    move = Assign(assignment("r-moved", "w2", at_s=2.0, epoch=1), 0, "w1")
    assert (await stack.ledger.assign(move)).result == "assigned"
    # w1's run of the moved request answers late: refused, and w2 keeps it.
    assert await stack.ledger.finish_many(
        [answer("r-moved", "w1"), answer("r-answered", "w1")]
    ) == ["superseded", "finished"]
    assert await stack.assigned("w1") == ["r-kept"]
    assert await stack.assigned("w2") == ["r-moved"]

    clock.now_s = 1000.0 + WORKER_TIMEOUT_S + 0.01
    assert sorted(await monitor.check_liveness()) == ["w1", "w2"]

    async def both() -> bool:
        return len(stack.events) == 2

    await eventually(both, what="both WorkerDowns")
    orphans = {e.worker_id: e.orphaned_request_ids for e in stack.events}
    assert orphans == {"w1": ["r-kept"], "w2": ["r-moved"]}


async def test_a_drained_worker_is_announced_once_and_never_timed_out(stack: Stack) -> None:
    await stack.collect_worker_events()
    monitor = await stack.monitor()
    await stack.send("w1", {"r-in-flight": 1.0})
    # Still finishing what runs: not drained yet.
    await stack.bus.publish(
        HEARTBEATS, heartbeat("w1", 1, draining=True, running=2, outstanding_total=2)
    )
    await stack.bus.publish(HEARTBEATS, heartbeat("w1", 2, draining=True, outstanding_total=0))
    await stack.bus.publish(HEARTBEATS, heartbeat("w1", 3, draining=True, outstanding_total=0))

    async def drained() -> bool:
        return bool(stack.events) and monitor.heartbeats_accepted == 3

    await eventually(drained, what="drained WorkerDown")
    assert (await stack.worker_hash("w1"))["status"] == "drained"
    event = stack.events[0]
    assert (event.worker_id, event.reason) == ("w1", "drained")
    assert event.orphaned_request_ids == ["r-in-flight"]
    # Silent from now on: the liveness check must leave a drained worker alone.
    checks = monitor.liveness_checks

    async def timed_out_window() -> bool:
        return monitor.liveness_checks >= checks + int(WORKER_TIMEOUT_S / CHECK_PERIOD_S) + 3

    await eventually(timed_out_window, what="checks past the timeout")
    assert len(stack.events) == 1
    assert (await stack.worker_hash("w1"))["status"] == "drained"


async def test_a_drained_worker_s_waiting_requests_are_orphaned_at_once(stack: Stack) -> None:
    # The worker's last heartbeat: nothing runs, two requests still wait there.
    await stack.collect_worker_events()
    monitor = await stack.monitor(run=False)
    await stack.send("w1", {"r-sent-late": 1.0})
    last = heartbeat(
        "w1",
        7,
        draining=True,
        queue_length=2,
        outstanding=[entry("r-wait-1"), entry("r-wait-2")],
        outstanding_total=2,
    )
    assert await monitor.handle_heartbeat(last)

    async def announced() -> bool:
        return bool(stack.events)

    await eventually(announced, what="drained WorkerDown")
    assert (await stack.worker_hash("w1"))["status"] == "drained"
    event = stack.events[0]
    assert (event.worker_id, event.reason) == ("w1", "drained")
    assert event.orphaned_request_ids == ["r-sent-late", "r-wait-1", "r-wait-2"]
    assert event.held_request_ids == ["r-wait-1", "r-wait-2"]


async def test_a_draining_worker_s_waiting_requests_move_while_its_running_ones_finish(
    stack: Stack,
) -> None:
    await stack.collect_worker_events()
    clock = ManualClock(1000.0)
    monitor = await stack.monitor(run=False, clock=clock)
    await stack.send("w1", {"r-run": 1.0, "r-wait": 2.0})
    running_and_waiting = [entry("r-run", running=True), entry("r-wait")]
    for sequence in (1, 2, 3):  # told to stop at 1; still running at 2 and 3
        beat = heartbeat(
            "w1",
            sequence,
            draining=True,
            running=1,
            queue_length=1,
            outstanding=running_and_waiting,
            outstanding_total=2,
        )
        assert await monitor.handle_heartbeat(beat)

    async def announced() -> bool:
        return bool(stack.events)

    await eventually(announced, what="draining WorkerDown")
    # Announced once, naming only what waits; the worker stays alive (heartbeating),
    # and what it runs is left to finish there.
    (event,) = stack.events
    assert (event.reason, event.orphaned_request_ids) == ("draining", ["r-wait"])
    assert event.held_request_ids == ["r-wait"]
    assert (await stack.worker_hash("w1"))["status"] == "alive"
    assert await stack.assigned("w1") == ["r-run", "r-wait"]
    # Long after the timeout, still heartbeating: never declared down.
    clock.now_s = 1000.0 + 10 * WORKER_TIMEOUT_S
    assert await monitor.handle_heartbeat(
        heartbeat("w1", 4, draining=True, running=1, outstanding_total=1, sent_at_s=1010.0)
    )
    assert await monitor.check_liveness() == []
    # The last heartbeat: nothing runs, the moved request is still listed (the worker
    # never learns it moved).
    last = heartbeat(
        "w1", 5, draining=True, queue_length=1, outstanding=[entry("r-wait")], outstanding_total=1
    )
    assert await monitor.handle_heartbeat(last)

    async def drained() -> bool:
        return len(stack.events) == 2

    await eventually(drained, what="drained WorkerDown")
    final = stack.events[1]
    assert final.reason == "drained"
    assert final.held_request_ids == ["r-wait"]
    assert set(final.orphaned_request_ids) == {"r-run", "r-wait"}
    assert (await stack.worker_hash("w1"))["status"] == "drained"


async def test_a_restarted_worker_with_a_fresh_sequence_is_alive_again(stack: Stack) -> None:
    clock = ManualClock(1000.0)
    monitor = await stack.monitor(run=False, clock=clock)
    await monitor.handle_heartbeat(heartbeat("w1", 40, sent_at_s=1000.0))
    clock.now_s = 1001.0
    assert await monitor.check_liveness() == ["w1"]
    assert await monitor.handle_heartbeat(heartbeat("w1", 0, sent_at_s=1001.0))
    fields = await stack.worker_hash("w1")
    assert (fields["status"], fields["sequence"]) == ("alive", "0")


async def test_a_state_store_that_lost_its_data_is_reported_loudly(
    stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = await stack.monitor(run=False)
    watch = monitor.state_watch
    assert not await watch.check()  # a new store: restored (nothing), then marked
    await watch.settled()
    assert not await watch.check()
    # Redis restarted without persistence: everything under the prefix is gone.
    await stack.state.clear_prefix()
    with caplog.at_level(logging.ERROR):
        assert await watch.check()
    assert "lost its data" in caplog.text
    assert [r for r in caplog.records if getattr(r, "event", None) == "state_lost"]
    # Reported once, while restoring and after; a second monitor that started after the
    # loss sees nothing to report.
    assert not await watch.check()
    await watch.settled()
    assert not await watch.check()
    other = await stack.monitor(run=False)
    assert not await other.state_watch.check()
    assert watch.losses == 1
