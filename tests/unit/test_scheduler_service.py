"""The scheduler service over the in-memory bus: joins, placements, duplicates, failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Literal

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from switchyard.bus import MemoryBroker
from switchyard.contracts.messages import (
    Assignment,
    InferenceRequest,
    LLMPayload,
    ServiceTimePrediction,
    WorkerDown,
)
from switchyard.contracts.topics import ASSIGNMENTS, PREDICTIONS, REQUESTS, WORKER_EVENTS
from switchyard.policies.registry import make_llm_policy
from switchyard.selection.registry import make_window_scheduler
from switchyard.serving.catalogue import DEFAULT_LLM_APPLICATIONS, ServingCatalogue
from switchyard.state.memory import MemoryStateStore

from services.scheduler import SchedulerService
from tests.support.services import (
    eventually,
    heartbeat,
    memory_context,
    service_settings,
    store_worker,
)

DownReason = Literal["heartbeat-timeout", "draining", "drained", "failed"]

CATALOGUE = ServingCatalogue(
    llm={app.name: app for app in DEFAULT_LLM_APPLICATIONS}, classification={}
)


def llm_request(request_id: str, prompt_tokens: int = 100) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="llama-2-7b",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=prompt_tokens, max_output_tokens=50),
        arrival_s=time.time(),
        reply_to="ingress-0",
    )


class Stack:
    def __init__(
        self, policy: str, wait_s: float = 0.2, spans: InMemorySpanExporter | None = None
    ) -> None:
        self.broker = MemoryBroker()
        self.state = MemoryStateStore()
        self.policy = policy
        self.wait_s = wait_s
        self.spans = spans
        self.service: SchedulerService | None = None

    async def start(self) -> SchedulerService:
        settings = service_settings(llm_policy=self.policy, prediction_wait_s=self.wait_s)
        ctx = await memory_context("scheduler", settings, self.broker, self.state, spans=self.spans)
        self.client = (
            await memory_context("client", settings, self.broker, self.state, spans=self.spans)
        ).bus
        self.service = SchedulerService(
            ctx, CATALOGUE, make_llm_policy(self.policy), make_window_scheduler("lo-edf")
        )
        await self.service.start()
        return self.service

    async def stop(self) -> None:
        if self.service is None or self.service.ctx.stopping.is_set():
            return
        self.service.ctx.stopping.set()
        await asyncio.wait_for(self.service.drain(), 10)

    async def worker_down(
        self,
        worker_id: str,
        orphans: list[str],
        *,
        reason: DownReason = "heartbeat-timeout",
        held: list[str] | None = None,
    ) -> None:
        """Publish the monitor's verdict that ``worker_id`` is gone (or going), listing
        ``orphans`` and, for a drain, what it ``held`` waiting."""
        await self.client.publish(
            WORKER_EVENTS,
            WorkerDown(
                worker_id=worker_id,
                reason=reason,
                detected_at_s=time.time(),
                orphaned_request_ids=orphans,
                held_request_ids=held,
            ),
        )

    async def assignments(self, count: int) -> list[Assignment]:
        got: list[Assignment] = []
        async with self.client.subscribe(ASSIGNMENTS, group="test-worker") as sub:
            while len(got) < count:
                delivery = await sub.next_within(10.0)
                assert delivery is not None, f"only {len(got)} of {count} assignments came"
                got.append(delivery.message)
        return got


@pytest.fixture
async def jsq() -> AsyncIterator[Stack]:
    stack = Stack("jsq")
    yield stack
    await stack.stop()


async def test_requests_go_to_the_least_loaded_worker_that_serves_their_model(jsq: Stack) -> None:
    await store_worker(jsq.state, heartbeat("busy", waiting=5, running=8))
    await store_worker(jsq.state, heartbeat("idle"))
    await store_worker(jsq.state, heartbeat("other-model", models=("llama-2-13b",)))
    await jsq.start()
    await jsq.client.publish(REQUESTS, llm_request("r1"))
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "idle"
    assert assignment.variant == "llama-2-7b"
    assert assignment.policy == "jsq"
    # The decision is recorded before it is published.
    status = await jsq.state.hgetall("request:r1")
    assert status["status"] == "assigned"
    assert status["worker_id"] == "idle"
    assert await jsq.state.zscore("worker:idle:assigned", "r1") is not None


async def test_a_burst_between_heartbeats_is_spread_by_local_accounting(jsq: Stack) -> None:
    await store_worker(jsq.state, heartbeat("a"))
    await store_worker(jsq.state, heartbeat("b"))
    await jsq.start()
    for i in range(6):
        await jsq.client.publish(REQUESTS, llm_request(f"r{i}"))
    got = await jsq.assignments(6)
    by_worker = {w: sum(1 for a in got if a.worker_id == w) for w in ("a", "b")}
    assert by_worker == {"a": 3, "b": 3}


async def test_a_request_delivered_twice_gets_the_same_assignment_again(jsq: Stack) -> None:
    await store_worker(jsq.state, heartbeat("a"))
    await store_worker(jsq.state, heartbeat("b"))
    service = await jsq.start()
    request = llm_request("dup")
    async with jsq.client.subscribe(ASSIGNMENTS, group="test-worker") as sub:
        await jsq.client.publish(REQUESTS, request)
        first = await sub.next_within(10.0)
        # Delivered again (a redelivery after a crash): the recorded decision is re-sent.
        await jsq.client.publish(REQUESTS, request)
        await jsq.client.publish(REQUESTS, llm_request("after"))
        again = await sub.next_within(10.0)
        after = await sub.next_within(10.0)
    assert first is not None
    assert again is not None
    assert after is not None
    assert again.message.message_id == first.message.message_id
    assert after.message.request.request_id == "after"
    assert service.decided == 2


async def test_gaps_joins_each_request_with_its_prediction() -> None:
    stack = Stack("gaps", wait_s=2.0)
    await store_worker(stack.state, heartbeat("a"))
    service = await stack.start()
    request = llm_request("p1")
    prediction = ServiceTimePrediction(
        request_id="p1",
        predicted_s=3.0,
        calibrated_s=3.5,
        by_worker_type_s={"a100-80gb/llama-2-7b": 3.5},
        raw_by_worker_type_s={"a100-80gb/llama-2-7b": 3.0},
        predictor="linear",
        predicted_at_s=time.time(),
    )
    await stack.client.publish(REQUESTS, request)
    await asyncio.sleep(0.05)  # the prediction arrives after the request, within the wait
    await stack.client.publish(PREDICTIONS, prediction)
    (assignment,) = await stack.assignments(1)
    assert assignment.predicted_s == pytest.approx(3.5)
    assert service.decided == 1
    await stack.stop()


async def test_without_a_prediction_gaps_decides_after_the_bounded_wait() -> None:
    stack = Stack("gaps", wait_s=0.1)
    await store_worker(stack.state, heartbeat("a"))
    await stack.start()
    started = time.monotonic()
    await stack.client.publish(REQUESTS, llm_request("blind"))
    (assignment,) = await stack.assignments(1)
    assert assignment.predicted_s is None
    assert time.monotonic() - started < 5.0
    await stack.stop()


async def test_a_dead_workers_unfinished_requests_are_reassigned_with_a_new_epoch(
    jsq: Stack,
) -> None:
    await store_worker(jsq.state, heartbeat("doomed"))
    await jsq.start()
    await jsq.client.publish(REQUESTS, llm_request("orphan"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await store_worker(jsq.state, heartbeat("doomed", sequence=2), status="down")
    await store_worker(jsq.state, heartbeat("survivor"))
    await asyncio.sleep(0.3)  # a cluster refresh sees the new worker
    await jsq.worker_down("doomed", ["orphan", "unknown-request"], reason="heartbeat-timeout")
    (again,) = await jsq.assignments(1)
    assert again.request.request_id == "orphan"
    assert again.worker_id == "survivor"
    assert again.epoch == 1


async def test_a_request_sent_to_a_worker_after_the_monitor_listed_its_orphans_moves_too(
    jsq: Stack,
) -> None:
    await store_worker(jsq.state, heartbeat("doomed"))
    await jsq.start()
    await jsq.client.publish(REQUESTS, llm_request("late"))
    (first,) = await jsq.assignments(1)
    assert first.worker_id == "doomed"
    await store_worker(jsq.state, heartbeat("doomed", sequence=2), status="down")
    await store_worker(jsq.state, heartbeat("survivor"))
    await asyncio.sleep(0.3)
    # The monitor's list missed it: it was assigned after the monitor looked.
    await jsq.worker_down("doomed", [], reason="heartbeat-timeout")
    (again,) = await jsq.assignments(1)
    assert again.request.request_id == "late"
    assert again.worker_id == "survivor"
    assert again.epoch == 1


async def _leaving_takes(
    jsq: Stack, request_ids: tuple[str, str], *, status: str
) -> SchedulerService:
    """Both requests are assigned to worker ``leaving``, which takes both in (its run
    claims), then drains (recorded ``status``) while worker ``staying`` joins."""
    await store_worker(jsq.state, heartbeat("leaving"))
    service = await jsq.start()
    for request_id in request_ids:
        await jsq.client.publish(REQUESTS, llm_request(request_id))
    got = await jsq.assignments(2)
    assert {a.worker_id for a in got} == {"leaving"}
    for request_id in request_ids:
        await jsq.state.set(f"claim:{request_id}:0:run", "leaving")
    draining = heartbeat("leaving", sequence=2).model_copy(update={"draining": True})
    await store_worker(jsq.state, draining, status=status)
    await store_worker(jsq.state, heartbeat("staying"))
    await asyncio.sleep(0.3)
    return service


async def test_a_drained_worker_s_finished_request_is_not_run_again(jsq: Stack) -> None:
    # It ran the first to the end while draining; its last, draining heartbeat lists
    # only the second; the first's completion is still on its way.
    await _leaving_takes(jsq, ("finished-there", "still-waiting"), status="drained")
    await jsq.worker_down(
        "leaving", ["finished-there", "still-waiting"], reason="drained", held=["still-waiting"]
    )
    (moved,) = await jsq.assignments(1)
    assert moved.request.request_id == "still-waiting"
    assert moved.worker_id == "staying"
    assert moved.epoch == 1
    assert jsq.service is not None
    assert jsq.service.reassigned == 1


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
    await jsq.client.publish(REQUESTS, llm_request("after"))
    (after,) = await jsq.assignments(1)
    assert after.request.request_id == "after"
    await asyncio.sleep(0.2)
    assert service.reassigned == 1


async def test_a_re_assignment_continues_the_request_s_trace() -> None:
    spans = InMemorySpanExporter()
    stack = Stack("jsq", spans=spans)
    try:
        await store_worker(stack.state, heartbeat("doomed"))
        await stack.start()
        await stack.client.publish(REQUESTS, llm_request("traced"))  # a trace of its own
        await stack.assignments(1)
        await store_worker(stack.state, heartbeat("doomed", sequence=2), status="down")
        await store_worker(stack.state, heartbeat("survivor"))
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
    assignments = produced("assignments")
    parents = [s.parent.span_id for s in assignments if s.parent is not None]
    assert parents.count(reassign.context.span_id) == 1
    assert {s.context.trace_id for s in assignments} == {request_sent.context.trace_id}


async def test_a_request_for_a_model_nobody_serves_waits_for_a_worker(jsq: Stack) -> None:
    service = await jsq.start()
    await jsq.client.publish(REQUESTS, llm_request("early"))

    async def parked() -> bool:
        return len(service._unplaced) == 1

    await eventually(parked)
    await store_worker(jsq.state, heartbeat("late"))
    (assignment,) = await jsq.assignments(1)
    assert assignment.worker_id == "late"
