"""The monitor over the in-memory bus and state store: worker state from heartbeats,
dead-worker detection with orphans, completion counters, drains, two replicas."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus, MemoryBroker, MemoryTransport
from switchyard.config import Settings, load_settings
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    Heartbeat,
    LLMResult,
    QueuedEntry,
    RequestTimeline,
    WorkerDown,
)
from switchyard.contracts.topics import COMPLETIONS, HEARTBEATS, WORKER_EVENTS
from switchyard.runtime.service import ServiceContext
from switchyard.state import MemoryStateStore
from switchyard.telemetry import Telemetry

import services.monitor
from services.cluster_state import (
    CLUSTER_STATS_KEY,
    WORKERS_KEY,
    WorkerStatus,
    assigned_key,
    read_cluster,
    request_key,
    worker_key,
)
from services.monitor import MonitorService, completion_violated
from services.monitor.service import STRANDED_GRACE_S

pytestmark = pytest.mark.unit

HEARTBEAT_INTERVAL_S = 0.05
WORKER_TIMEOUT_S = 0.3
CHECK_PERIOD_S = min(HEARTBEAT_INTERVAL_S, WORKER_TIMEOUT_S / 4)


def settings() -> Settings:
    return load_settings(
        {},
        instance_id="test-monitor",
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
        worker_timeout_s=WORKER_TIMEOUT_S,
        commit_interval_s=0.05,
    )


def heartbeat(worker_id: str = "w1", sequence: int = 1, **overrides: object) -> Heartbeat:
    values: dict[str, object] = {
        "worker_id": worker_id,
        "worker_type": "emulated-llm",
        "profile": "a100-80gb/llama-2-7b",
        "sequence": sequence,
        "interval_s": HEARTBEAT_INTERVAL_S,
        "queue_length": 0,
        "queued_work_s": 0.0,
        "running": 0,
        "utilization": 0.0,
        "sent_at_s": time.time(),
    }
    values.update(overrides)
    return Heartbeat.model_validate(values)


def entry(request_id: str, *, running: bool = False) -> QueuedEntry:
    return QueuedEntry(request_id=request_id, app="chat", running=running, queued_at_s=1.0)


def completion(
    request_id: str,
    *,
    worker_id: str = "w1",
    finished_s: float = 10.0,
    deadline_s: float | None = 12.0,
    epoch: int = 0,
    status: CompletionStatus = CompletionStatus.OK,
) -> Completion:
    return Completion(
        request_id=request_id,
        app="chat",
        worker_id=worker_id,
        worker_type="emulated-llm",
        variant="llama-2-7b",
        epoch=epoch,
        status=status,
        result=LLMResult(output_tokens=5),
        timeline=RequestTimeline(arrival_s=1.0, started_s=2.0, finished_s=finished_s),
        deadline_s=deadline_s,
    )


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0, what: str = "condition"
) -> None:
    """Poll ``check`` until it holds; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


class Stack:
    """One in-memory broker and state store; monitors, a worker-side bus, a collector."""

    def __init__(self, exits: AsyncExitStack) -> None:
        self.exits = exits
        self.broker = MemoryBroker()
        self.state = MemoryStateStore(f"t{uuid.uuid4().hex[:6]}:")
        self.settings = settings()
        self.bus = self._bus()
        self.events: list[WorkerDown] = []

    def _bus(self) -> Bus:
        return Bus(MemoryTransport(self.broker), commit_interval_s=0.05, retry_initial_s=0.01)

    async def start(self) -> None:
        await self.bus.start()
        self.exits.push_async_callback(self.bus.stop)

    async def monitor(self, *, run: bool = True) -> MonitorService:
        """A monitor on this stack's broker and state; its routines run when ``run``."""
        bus = self._bus()
        telemetry = Telemetry(TracerProvider(), MeterProvider())
        ctx = ServiceContext(
            name="monitor",
            settings=self.settings,
            bus=bus,
            state=self.state,
            telemetry=telemetry,
            logger=logging.getLogger(f"tests.monitor.{uuid.uuid4().hex[:6]}"),
            stopping=asyncio.Event(),
        )
        await bus.start()
        service = await services.monitor.create(ctx)
        assert isinstance(service, MonitorService)

        async def stop() -> None:
            ctx.stopping.set()
            await service.drain()
            await bus.stop()
            telemetry.shutdown()

        self.exits.push_async_callback(stop)
        if run:
            await service.start()
        return service

    async def collect_worker_events(self) -> None:
        """Gather every WorkerDown into ``self.events`` in the background."""
        stopping = asyncio.Event()

        async def collect() -> None:
            async with self.bus.subscribe(
                WORKER_EVENTS, group="test-collector", stopping=stopping
            ) as sub:
                async for delivery in sub:
                    self.events.append(delivery.message)

        task = asyncio.create_task(collect())

        async def stop() -> None:
            stopping.set()
            await task

        self.exits.push_async_callback(stop)

    async def worker_hash(self, worker_id: str) -> dict[str, str]:
        return await self.state.hgetall(worker_key(worker_id))


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        made = Stack(exits)
        await made.start()
        yield made


async def test_heartbeats_become_worker_state(stack: Stack) -> None:
    await stack.monitor()
    beat = heartbeat("w1", 1, queue_length=2, outstanding=[entry("r1"), entry("r2")])
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
    assert await stack.state.zscore(WORKERS_KEY, "w1") == float(fields["last_seen_s"])
    view = await read_cluster(stack.state, time.time())
    record = view.get("w1")
    assert record is not None
    assert record.status is WorkerStatus.ALIVE
    assert record.heartbeat == beat


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
    await stack.monitor()
    await stack.state.zadd(assigned_key("w1"), {"r-sent": 1.0, "r-wait": 2.0})
    beat = heartbeat(
        "w1",
        1,
        outstanding=[entry("r-run", running=True), entry("r-wait")],
        outstanding_total=2,
    )
    await stack.bus.publish(HEARTBEATS, beat)

    async def down() -> bool:
        return bool(stack.events)

    await eventually(down, timeout_s=WORKER_TIMEOUT_S + 5, what="WorkerDown")
    event = stack.events[0]
    fields = await stack.worker_hash("w1")
    last_seen_s = float(fields["last_seen_s"])
    assert event.worker_id == "w1"
    assert event.reason == "heartbeat-timeout"
    assert event.last_heartbeat_s == pytest.approx(last_seen_s)
    silent_s = event.detected_at_s - last_seen_s
    # The documented window, with slack for a loaded test machine.
    assert WORKER_TIMEOUT_S <= silent_s <= WORKER_TIMEOUT_S + CHECK_PERIOD_S + 0.5
    assert sorted(event.orphaned_request_ids) == ["r-run", "r-sent", "r-wait"]
    assert fields["status"] == "down"
    assert fields["down_reason"] == "heartbeat-timeout"
    assert await stack.state.zcard(assigned_key("w1")) == 0  # handed over in the event

    # It comes back: alive again, and no second WorkerDown for the old death.
    await stack.bus.publish(HEARTBEATS, heartbeat("w1", 2))

    async def back() -> bool:
        return (await stack.worker_hash("w1")).get("status") == "alive"

    await eventually(back, what="w1 alive again")
    assert "down_reason" not in await stack.worker_hash("w1")
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
    first = await stack.monitor(run=False)
    second = await stack.monitor(run=False)
    first.clock = second.clock = lambda: 1000.0
    await first.handle_heartbeat(heartbeat("w1", 1))
    first.clock = second.clock = lambda: 1000.0 + WORKER_TIMEOUT_S + 0.01
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
    monitor = await stack.monitor(run=False)
    monitor.clock = lambda: 1000.0
    await monitor.handle_heartbeat(heartbeat("w1", 1))
    monitor.clock = lambda: 1000.0 + WORKER_TIMEOUT_S + 0.01
    assert await monitor.check_liveness() == ["w1"]
    state = stack.state
    await state.zadd(assigned_key("w1"), {"r-late": 1000.5, "r-moved": 1000.5, "r-done": 1000.5})
    await state.hset(request_key("r-late"), {"status": "assigned", "worker_id": "w1"})
    await state.hset(request_key("r-moved"), {"status": "assigned", "worker_id": "w2"})
    await state.hset(request_key("r-done"), {"status": "ok", "worker_id": "w1"})
    # Within the grace: nothing yet.
    monitor.clock = lambda: 1000.5 + STRANDED_GRACE_S / 2
    await monitor.check_liveness()
    # Past it: one WorkerDown listing only the stranded request, and a clean set.
    monitor.clock = lambda: 1000.5 + STRANDED_GRACE_S + 0.01
    await monitor.check_liveness()
    await monitor.check_liveness()

    async def both() -> bool:
        return len(stack.events) >= 2

    await eventually(both, what="the second WorkerDown")
    await asyncio.sleep(0.1)  # a third would have arrived by now
    assert [e.orphaned_request_ids for e in stack.events] == [[], ["r-late"]]
    assert stack.events[1].worker_id == "w1"
    assert await state.zcard(assigned_key("w1")) == 0
    assert monitor.stranded_orphaned == 1
    assert (await stack.worker_hash("w1"))["status"] == "down"


async def test_a_worker_heard_within_the_timeout_stays_alive(stack: Stack) -> None:
    monitor = await stack.monitor(run=False)
    monitor.clock = lambda: 1000.0
    await monitor.handle_heartbeat(heartbeat("w1", 1))
    monitor.clock = lambda: 1000.0 + WORKER_TIMEOUT_S
    assert await monitor.check_liveness() == []
    assert (await stack.worker_hash("w1"))["status"] == "alive"


async def test_completions_count_once_with_violations(stack: Stack) -> None:
    monitor = await stack.monitor()
    await stack.state.zadd(assigned_key("w1"), {"r1": 1.0, "r2": 1.0, "r3": 1.0})
    done = [
        completion("r1", finished_s=10.0, deadline_s=12.0),  # met
        completion("r2", finished_s=13.0, deadline_s=12.0),  # violated
        completion("r2", finished_s=13.0, deadline_s=12.0),  # redelivered
        completion("r3", finished_s=20.0, deadline_s=None),  # no SLO
    ]
    for message in done:
        await stack.bus.publish(COMPLETIONS, message)

    async def handled() -> bool:
        return monitor.completions_counted + monitor.completions_duplicate == len(done)

    await eventually(handled, what="every completion handled")
    assert (monitor.completions_counted, monitor.completions_duplicate) == (3, 1)
    stats = await stack.state.hgetall(CLUSTER_STATS_KEY)
    assert (stats["completed"], stats["violated"]) == ("3", "1")
    assert float(stats["recent_violation_rate"]) == pytest.approx(1 / 3)
    assert stats["recent_window"] == "3"
    fields = await stack.worker_hash("w1")
    assert (fields["completed"], fields["violated"]) == ("3", "1")
    assert await stack.state.zcard(assigned_key("w1")) == 0
    view = await read_cluster(stack.state, time.time())
    assert view.recent_violation_rate == pytest.approx(1 / 3)


async def test_the_answer_reaches_the_request_record_when_its_ingress_is_gone(
    stack: Stack,
) -> None:
    monitor = await stack.monitor(run=False)
    # Accepted by an ingress replica that has since been scaled away: nobody else
    # would write the answer, and retries on other replicas poll this record.
    await stack.state.hset(
        "request:r1", {"status": "assigned", "reply_to": "ingress-gone", "worker_id": "w1"}
    )
    done = completion("r1", epoch=1)
    assert await monitor.handle_completion(done)
    record = await stack.state.hgetall("request:r1")
    assert (record["status"], record["reply_to"]) == ("ok", "ingress-gone")
    assert Completion.model_validate_json(record["completion"]) == done
    # A stale copy from an earlier epoch does not replace it.
    await monitor.handle_completion(completion("r1", epoch=0, worker_id="w2"))
    assert (await stack.state.hgetall("request:r1"))["worker_id"] == "w1"


async def test_a_migrated_request_leaves_every_assigned_set(stack: Stack) -> None:
    monitor = await stack.monitor(run=False)
    for wid in ("w1", "w2"):
        await monitor.handle_heartbeat(heartbeat(wid, 1))
    await stack.state.zadd(assigned_key("w1"), {"r1": 1.0, "keep": 1.0})
    await stack.state.zadd(assigned_key("w2"), {"r1": 2.0})
    assert await monitor.handle_completion(completion("r1", worker_id="w2", epoch=1))
    assert await stack.state.zscore(assigned_key("w1"), "r1") is None
    assert await stack.state.zscore(assigned_key("w2"), "r1") is None
    assert await stack.state.zscore(assigned_key("w1"), "keep") == 1.0
    # Epoch 0, but the scheduler recorded another worker for it: that set is cleaned too.
    await stack.state.zadd(assigned_key("w2"), {"r2": 3.0})
    await stack.state.hset("request:r2", {"worker_id": "w2", "status": "assigned"})
    assert await monitor.handle_completion(completion("r2", worker_id="w1"))
    assert await stack.state.zcard(assigned_key("w2")) == 0


def test_violation_rule() -> None:
    assert not completion_violated(completion("a", finished_s=12.0, deadline_s=12.0))
    assert completion_violated(completion("a", finished_s=12.5, deadline_s=12.0))
    assert not completion_violated(completion("a", deadline_s=None))
    expired = completion("a", finished_s=1.0, deadline_s=12.0, status=CompletionStatus.EXPIRED)
    assert completion_violated(expired)


async def test_a_drained_worker_is_announced_once_and_never_timed_out(stack: Stack) -> None:
    await stack.collect_worker_events()
    monitor = await stack.monitor()
    await stack.state.zadd(assigned_key("w1"), {"r-in-flight": 1.0})
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
    await stack.state.zadd(assigned_key("w1"), {"r-sent-late": 1.0})
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
    monitor = await stack.monitor(run=False)
    monitor.clock = lambda: 1000.0
    await stack.state.zadd(assigned_key("w1"), {"r-run": 1.0, "r-wait": 2.0})
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
    assert await stack.state.zcard(assigned_key("w1")) == 2
    # Long after the timeout, still heartbeating: never declared down.
    monitor.clock = lambda: 1000.0 + 10 * WORKER_TIMEOUT_S
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
    monitor = await stack.monitor(run=False)
    monitor.clock = lambda: 1000.0
    await monitor.handle_heartbeat(heartbeat("w1", 40, sent_at_s=1000.0))
    monitor.clock = lambda: 1001.0
    assert await monitor.check_liveness() == ["w1"]
    assert await monitor.handle_heartbeat(heartbeat("w1", 0, sent_at_s=1001.0))
    fields = await stack.worker_hash("w1")
    assert (fields["status"], fields["sequence"]) == ("alive", "0")
