"""Re-assignments in the scheduler service over the in-memory bus: a dead or draining
worker's unfinished requests move to another worker under a new epoch, by one scheduler
replica of several, never one a drained worker finished, and in the request's own trace.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.bus import Bus, MemoryTransport
from switchyard.contracts.topics import WORKER_EVENTS
from switchyard.lifecycle import Fence, scripts
from switchyard.state.base import Script
from switchyard.state.memory import MemoryStateStore

from services.scheduler import SchedulerService
from tests.service.scheduler_support import (
    Stack,
    jsq_fixture,  # noqa: F401 (the ``jsq`` fixture)
    llm_request,
    worker_down,
)
from tests.support.services import eventually, store_worker


async def test_a_dead_workers_unfinished_requests_are_reassigned_with_a_new_epoch(
    jsq: Stack,
) -> None:
    await jsq.worker("doomed")
    await jsq.start()
    await jsq.submit(llm_request("orphan"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await jsq.worker("doomed", sequence=2, status="down")
    await jsq.worker("survivor")
    await asyncio.sleep(0.3)  # a cluster refresh sees the new worker
    await jsq.worker_down("doomed", ["orphan", "unknown-request"], reason="heartbeat-timeout")
    (again,) = await jsq.assignments(1)  # on the survivor's partition
    assert again.request.request_id == "orphan"
    assert again.worker_id == "survivor"
    assert again.epoch == 1
    record = await jsq.record("orphan")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "survivor", 1)
    assert await jsq.assigned_to("survivor", "orphan")
    assert not await jsq.assigned_to("doomed", "orphan")
    # A listed id without a record is left alone: nothing is made up for it.
    assert await jsq.ledger.read("unknown-request") is None
    await _reassigned(jsq.service, 1)


async def test_a_request_sent_to_a_worker_after_the_monitor_listed_its_orphans_moves_too(
    jsq: Stack,
) -> None:
    await jsq.worker("doomed")
    await jsq.start()
    await jsq.submit(llm_request("late"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await jsq.worker("doomed", sequence=2, status="down")
    await jsq.worker("survivor")
    await asyncio.sleep(0.3)
    # The monitor's list missed it: it was assigned after the monitor looked (the
    # ledger's assigned set of the worker still names it).
    await jsq.worker_down("doomed", [], reason="heartbeat-timeout")
    (again,) = await jsq.assignments(1)
    assert again.request.request_id == "late"
    assert again.worker_id == "survivor"
    assert again.epoch == 1


async def test_a_live_workers_unclaimed_request_is_reassigned_and_the_worker_kept(
    jsq: Stack,
) -> None:
    await jsq.worker("only")
    await jsq.start()
    for request_id in ("lost", "arrived"):
        await jsq.submit(llm_request(request_id))
    assert {a.worker_id for a in await jsq.assignments(2)} == {"only"}
    # The monitor found "lost" unlisted by the worker's later heartbeats and took it back
    # (epoch 0 -> 1); the worker is alive, and the only one serving the model.
    assert await jsq.ledger.disown_many("only", ["lost"], time.time()) == ["lost"]
    await jsq.worker_down("only", ["lost"], reason="unclaimed")

    (again,) = await jsq.assignments(1)
    assert (again.request.request_id, again.worker_id, again.epoch) == ("lost", "only", 2)
    record = await jsq.record("lost")
    assert (record.status, record.worker_id, record.epoch) == ("assigned", "only", 2)
    # Only the listed request moved, and the worker still gets new work.
    assert (await jsq.record("arrived")).epoch == 0
    await jsq.submit(llm_request("next"))
    (later,) = await jsq.assignments(1)
    assert (later.request.request_id, later.worker_id) == ("next", "only")


async def test_of_several_scheduler_replicas_one_moves_each_request(
    jsq: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    await jsq.worker("doomed")
    first_replica = await jsq.start()
    second_replica = await jsq.start()
    await jsq.submit(llm_request("contested"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await jsq.worker("doomed", sequence=2, status="down")
    await jsq.worker("survivor")
    await asyncio.sleep(0.3)  # both replicas' cluster refreshes see the survivor

    # Both replicas handle the same WorkerDown at once (a redelivery after a rebalance),
    # and both read the record before either records its re-assignment: the ledger's
    # compare-and-set on the epoch and worker they replace lets one through.
    monitor = Bus(MemoryTransport())
    await monitor.start()
    try:
        async with monitor.subscribe(WORKER_EVENTS, group="replicas") as sub:
            await monitor.publish(
                WORKER_EVENTS, worker_down("doomed", ["contested"], "heartbeat-timeout", None)
            )
            delivery = await sub.next_within(10.0)
    finally:
        await monitor.stop()
    assert delivery is not None

    both_deciding = asyncio.Barrier(2)
    run_script_many = MemoryStateStore.run_script_many

    async def assign_together(
        self: MemoryStateStore,
        script: Script,
        calls: Sequence[tuple[Sequence[str], Sequence[str]]],
    ) -> list[list[str]]:
        # A re-assignment names the epoch it replaces (argument 5 of the script).
        if script is scripts.ASSIGN and any(args[4] for _, args in calls):
            await both_deciding.wait()
        return await run_script_many(self, script, calls)

    monkeypatch.setattr(MemoryStateStore, "run_script_many", assign_together)
    await asyncio.wait_for(
        asyncio.gather(
            first_replica.reassigner.on_worker_down(delivery),
            second_replica.reassigner.on_worker_down(delivery),
        ),
        10,
    )
    monkeypatch.undo()

    assert sorted([first_replica.reassigned, second_replica.reassigned]) == [0, 1]
    record = await jsq.record("contested")
    assert (record.worker_id, record.epoch) == ("survivor", 1)
    moved = record.assignment
    assert moved is not None
    # One re-assignment was sent. (The replicas' group rebalanced when the second
    # joined, so one may have read the request again and re-sent its recorded decision:
    # the same message, never a second decision.)
    decisions = {first.message_id, moved.message_id}
    (sent,) = [a for a in await jsq.assignments_until(moved.message_id) if a.epoch == 1]
    assert sent == moved
    assert sent.worker_id == "survivor"
    assert {a.message_id for a in await jsq.sent_meanwhile()} <= decisions


async def _leaving_takes(
    jsq: Stack, request_ids: tuple[str, str], *, status: str
) -> SchedulerService:
    """Both requests are assigned to worker ``leaving``, which takes both in (starts them
    in the ledger), then drains (recorded ``status``) while worker ``staying`` joins."""
    await jsq.worker("leaving")
    service = await jsq.start()
    for request_id in request_ids:
        await jsq.submit(llm_request(request_id))
    got = await jsq.assignments(2)
    assert {a.worker_id for a in got} == {"leaving"}
    started = await jsq.ledger.start_many(
        [Fence(request_id, 0, "leaving") for request_id in request_ids], time.time()
    )
    assert started == ["started", "started"]
    draining = jsq.beat("leaving", sequence=2).model_copy(update={"draining": True})
    await store_worker(jsq.state, draining, status=status)
    await jsq.worker("staying")
    await asyncio.sleep(0.3)
    return service


async def _reassigned(service: SchedulerService, count: int) -> None:
    """Wait until ``service`` has counted ``count`` re-assignments (it counts them once
    their sends are confirmed, which may be just after the worker has them)."""

    async def counted() -> bool:
        return service.reassigned == count

    await eventually(counted)


async def test_a_drained_worker_s_finished_request_is_not_run_again(jsq: Stack) -> None:
    # It ran the first to the end while draining; its last, draining heartbeat lists
    # only the second; the first's answer is still on its way.
    service = await _leaving_takes(jsq, ("finished-there", "still-waiting"), status="drained")
    await jsq.worker_down(
        "leaving", ["finished-there", "still-waiting"], reason="drained", held=["still-waiting"]
    )
    (moved,) = await jsq.assignments(1)
    assert moved.request.request_id == "still-waiting"
    assert moved.worker_id == "staying"
    assert moved.epoch == 1
    await _reassigned(service, 1)
    record = await jsq.record("finished-there")
    assert (record.status, record.worker_id, record.epoch) == ("running", "leaving", 0)


async def test_a_draining_worker_hands_over_what_waits_and_keeps_what_runs(jsq: Stack) -> None:
    # Told to stop: it heartbeats "draining" (still alive) and finishes what runs; the
    # monitor names what only waits there.
    service = await _leaving_takes(jsq, ("runs-there", "waits-there"), status="alive")
    await jsq.worker_down("leaving", ["waits-there"], reason="draining", held=["waits-there"])
    (moved,) = await jsq.assignments(1)
    assert (moved.request.request_id, moved.worker_id, moved.epoch) == ("waits-there", "staying", 1)
    # Its last heartbeat still lists the moved request (it never learns of the move) and
    # its assigned set still names the one that ran there: neither is decided again.
    await jsq.worker_down(
        "leaving", ["runs-there", "waits-there"], reason="drained", held=["waits-there"]
    )
    await jsq.submit(llm_request("after"))
    (after,) = await jsq.assignments(1)
    assert after.request.request_id == "after"
    await asyncio.sleep(0.2)
    assert service.reassigned == 1
    assert await jsq.sent_meanwhile() == []
    assert (await jsq.record("runs-there")).worker_id == "leaving"
    assert (await jsq.record("waits-there")).epoch == 1


async def test_a_re_assignment_continues_the_request_s_trace() -> None:
    spans = InMemorySpanExporter()
    stack = Stack("jsq", spans=spans)
    try:
        await stack.worker("doomed")
        await stack.start()
        await stack.submit(llm_request("traced"))  # a trace of its own
        await stack.assignments(1)
        await stack.worker("doomed", sequence=2, status="down")
        await stack.worker("survivor")
        await asyncio.sleep(0.3)
        await stack.worker_down("doomed", ["traced"])  # another trace
        (again,) = await stack.assignments(1)
    finally:
        await stack.stop()
    assert (again.worker_id, again.epoch) == ("survivor", 1)

    finished = spans.get_finished_spans()

    def produced(topic: str) -> list[ReadableSpan]:
        return [
            s
            for s in finished
            if s.kind is SpanKind.PRODUCER
            and str((s.attributes or {}).get("messaging.destination.name", "")).endswith(topic)
        ]

    (request_sent,) = produced("requests")
    (down_sent,) = produced("worker-events")
    (reassign,) = [s for s in finished if s.name == "scheduler reassign"]
    # In the request's trace, not the WorkerDown's; linked to the WorkerDown's.
    assert reassign.context.trace_id == request_sent.context.trace_id
    assert [link.context.trace_id for link in reassign.links] == [down_sent.context.trace_id]
    assert (reassign.attributes or {}).get("switchyard.epoch") == 1
    # The new assignment is published inside it, so the worker's spans follow on; both
    # decisions are in the request's trace.
    assignments = produced("worker-inbox")
    assert len(assignments) == 2
    parents = [s.parent.span_id for s in assignments if s.parent is not None]
    assert parents.count(reassign.context.span_id) == 1
    assert {s.context.trace_id for s in assignments} == {request_sent.context.trace_id}
