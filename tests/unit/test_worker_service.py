"""The worker service over the in-memory bus and state store: what other services see."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TypeVar

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus, MemoryTransport, Subscription
from switchyard.config import load_settings
from switchyard.contracts.base import Message
from switchyard.contracts.messages import (
    Assignment,
    ClassificationPayload,
    Completion,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    LLMResult,
    Migration,
    OutputChunk,
)
from switchyard.contracts.topics import (
    ASSIGNMENTS,
    COMPLETIONS,
    HEARTBEATS,
    MIGRATIONS,
    OUTPUT_CHUNKS,
    Topic,
)
from switchyard.perf import performance_model
from switchyard.runtime.service import ServiceContext
from switchyard.serving import TINY_LM_MODEL, ServingCatalogue
from switchyard.state import MemoryStateStore
from switchyard.telemetry import Telemetry

from services.cluster_state import assigned_key, assignment_key, request_key
from services.worker import create
from services.worker.backends.emulated_llm import EmulatedLlmBackend
from services.worker.service import CHUNK_TOKENS, WorkerService

PROFILE = "a100-80gb/llama-2-7b"
MODEL = "llama-2-7b"
M = TypeVar("M", bound=Message)
WAIT_S = 20.0  # generous: these waits end on an event, the timeout only bounds a failure


@dataclass
class Stack:
    ctx: ServiceContext
    worker: WorkerService
    state: MemoryStateStore

    async def publish(self, topic: Topic[M], message: M) -> None:
        await self.ctx.bus.publish(topic, message)


def _context(bus: Bus, state: MemoryStateStore, **settings: object) -> ServiceContext:
    values: dict[str, object] = {
        "worker_id": "w1",
        "heartbeat_interval_s": 0.05,
        "worker_profile": PROFILE,
        "worker_time_scale": 1000.0,
    }
    values.update(settings)
    return ServiceContext(
        name="worker",
        settings=load_settings({}, **values),
        bus=bus,
        state=state,
        telemetry=Telemetry(TracerProvider(), MeterProvider()),
        logger=logging.getLogger("tests.worker"),
        stopping=asyncio.Event(),
    )


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    bus = Bus(MemoryTransport())
    await bus.start()
    state = MemoryStateStore("test:")
    ctx = _context(bus, state)
    worker = await create(ctx)
    assert isinstance(worker, WorkerService)
    await worker.start()
    yield Stack(ctx, worker, state)
    ctx.stopping.set()
    await worker.drain()
    await worker.cancel_routines()
    await bus.stop()
    ctx.telemetry.shutdown()


def _llm(
    request_id: str,
    *,
    output: int = 8,
    prompt: int = 100,
    stream: bool = False,
    worker_id: str = "w1",
    epoch: int = 0,
    order: float = 0.0,
    not_before_s: float | None = None,
    model: str = MODEL,
) -> Assignment:
    now = time.time()
    request = InferenceRequest(
        request_id=request_id,
        app=model,
        payload=LLMPayload(
            model=model, prompt_tokens=prompt, max_output_tokens=output, stream=stream
        ),
        arrival_s=now - 0.01,
        reply_to="ingress-1",
    )
    return Assignment(
        request=request,
        worker_id=worker_id,
        variant=model,
        order=order,
        policy="test",
        epoch=epoch,
        assigned_at_s=now,
        not_before_s=not_before_s,
    )


async def _next(subscription: Subscription[M]) -> M:
    delivery = await subscription.next_within(WAIT_S)
    assert delivery is not None, f"nothing on {subscription.topic.name} within {WAIT_S} s"
    return delivery.message


async def _completion(subscription: Subscription[Completion]) -> Completion:
    delivery = await subscription.next_within(WAIT_S)
    assert delivery is not None, "no completion arrived"
    return delivery.message


async def test_completions_carry_an_ordered_emulated_timeline(stack: Stack) -> None:
    async with stack.ctx.bus.subscribe(COMPLETIONS, group="t-completions") as completions:
        await stack.publish(ASSIGNMENTS, _llm("r1", output=6))
        done = await _completion(completions)
    assert done.request_id == "r1"
    assert done.status is CompletionStatus.OK
    assert done.result == LLMResult(output_tokens=6, text="")
    assert done.emulated is True
    assert done.worker_id == "w1"
    assert done.worker_type == "a100-80gb"
    assert done.variant == MODEL
    assert done.reply_to == "ingress-1"
    t = done.timeline
    assert t.assigned_s is not None
    assert t.started_s is not None
    assert t.first_token_s is not None
    assert t.finished_s is not None
    assert t.arrival_s <= t.assigned_s <= t.started_s <= t.first_token_s <= t.finished_s


async def test_streamed_chunks_arrive_in_order_and_add_up(stack: Stack) -> None:
    async with (
        stack.ctx.bus.subscribe(COMPLETIONS, group="t-c") as completions,
        stack.ctx.bus.subscribe(OUTPUT_CHUNKS, group="t-chunks") as chunks,
    ):
        await stack.publish(ASSIGNMENTS, _llm("s1", output=10, stream=True))
        done = await _completion(completions)
        got: list[OutputChunk] = []
        while sum(c.tokens for c in got) < 10:
            chunk = await _next(chunks)
            assert isinstance(chunk, OutputChunk)
            got.append(chunk)
    assert done.status is CompletionStatus.OK
    assert [c.index for c in got] == list(range(len(got)))
    # At this time scale the emulation decodes several steps per wake-up, so a chunk
    # holds at least CHUNK_TOKENS tokens (the last one the rest).
    assert sum(c.tokens for c in got) == 10
    assert all(c.tokens >= CHUNK_TOKENS for c in got[:-1])
    assert all(c.emulated and c.reply_to == "ingress-1" and c.request_id == "s1" for c in got)


async def test_a_duplicate_or_stale_assignment_runs_once(stack: Stack) -> None:
    first = _llm("dup", output=3, epoch=1, order=1)
    async with stack.ctx.bus.subscribe(COMPLETIONS, group="t-dup") as completions:
        await stack.publish(ASSIGNMENTS, first)
        await stack.publish(ASSIGNMENTS, first)  # redelivered
        await stack.publish(ASSIGNMENTS, _llm("dup", output=3, epoch=0, order=1))  # stale
        # Same key (worker id), so the worker reads it after the three above.
        await stack.publish(ASSIGNMENTS, _llm("marker", output=3, order=2))
        seen: list[tuple[str, int]] = []
        while {"dup", "marker"} - {request_id for request_id, _ in seen}:
            done = await _completion(completions)
            seen.append((done.request_id, done.epoch))
        # Every assignment was read before the marker's: a second copy of "dup" would be
        # waiting, running or already completed by now.
        assert len(stack.worker.queue) == 0
        assert not stack.worker.backend.has_running()
        assert await completions.next_within(0.05) is None
    assert sorted(seen) == [("dup", 1), ("marker", 0)]
    # After a restart the in-memory memory is gone, but the claim in the state store
    # stops the redelivered assignment.
    restarted = WorkerService(stack.ctx, stack.worker.backend)
    assert not await restarted.take(first)
    assert await stack.state.exists("claim:dup:1:run")


async def test_only_our_assignments_are_taken(stack: Stack) -> None:
    assert not await stack.worker.take(_llm("other", worker_id="w2"))
    assert "other" not in stack.worker.queue


async def test_a_bad_assignment_fails_and_the_worker_goes_on(stack: Stack) -> None:
    request = InferenceRequest(
        request_id="cls",
        app="digits",
        payload=ClassificationPayload(features=[1.0, 2.0]),
        arrival_s=time.time(),
    )
    bad = Assignment(
        request=request,
        worker_id="w1",
        variant="mlp-small",
        order=0,
        policy="test",
        assigned_at_s=time.time(),
    )
    async with stack.ctx.bus.subscribe(COMPLETIONS, group="t-bad") as completions:
        await stack.publish(ASSIGNMENTS, bad)
        await stack.publish(ASSIGNMENTS, _llm("wrong-model", model="llama-2-13b"))
        await stack.publish(ASSIGNMENTS, _llm("good", output=2))
        results = {c.request_id: c for c in [await _completion(completions) for _ in range(3)]}
    assert results["cls"].status is CompletionStatus.FAILED
    assert results["cls"].error is not None
    assert "classification request" in results["cls"].error
    assert results["cls"].emulated
    assert results["wrong-model"].status is CompletionStatus.FAILED
    assert "not 'llama-2-13b'" in (results["wrong-model"].error or "")
    assert results["good"].status is CompletionStatus.OK
    assert stack.worker.alive


def _migration(
    request_id: str,
    *,
    from_worker_id: str,
    epoch: int,
    cost_s: float,
    to_worker_id: str = "w2",
    decided_at_s: float | None = None,
) -> Migration:
    return Migration(
        request_id=request_id,
        from_worker_id=from_worker_id,
        to_worker_id=to_worker_id,
        epoch=epoch,
        reason="test",
        expected_gain_s=1.0,
        cost_s=cost_s,
        decided_at_s=time.time() if decided_at_s is None else decided_at_s,
    )


async def _until_queued(worker: WorkerService, request_id: str) -> None:
    """Wait until ``worker`` has taken ``request_id`` in and it waits in its queue."""
    deadline = time.monotonic() + WAIT_S
    while request_id not in worker.queue:
        assert time.monotonic() < deadline, f"{request_id} was not taken in"
        await asyncio.sleep(0.01)


async def _heartbeat_where(subscription: Subscription[Heartbeat], test: object) -> Heartbeat:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        delivery = await subscription.next_within(WAIT_S)
        assert delivery is not None
        if test(delivery.message):  # type: ignore[operator]
            return delivery.message
    raise AssertionError("no matching heartbeat")


async def test_heartbeats_report_queue_load_and_resources(stack: Stack) -> None:
    perf = performance_model(PROFILE)
    held = _llm("held", prompt=300, output=20, not_before_s=time.time() + 3600)
    async with stack.ctx.bus.subscribe(HEARTBEATS, group="t-hb") as heartbeats:
        await stack.publish(ASSIGNMENTS, held)
        beat = await _heartbeat_where(heartbeats, lambda h: h.queue_length == 1)
    assert beat.worker_id == "w1"
    assert beat.worker_type == "a100-80gb"
    assert beat.backend == "emulated-llm"
    assert beat.emulated
    assert beat.profile == PROFILE
    assert beat.interval_s == 0.05
    assert beat.running == 0
    assert beat.utilization == 1.0  # a request waits
    assert beat.servable_models == [MODEL] == beat.resident_models
    assert beat.max_slots == perf.max_batch_slots
    assert beat.kv_capacity_tokens == perf.kv_capacity_tokens
    assert beat.kv_used_tokens == 0
    assert beat.queued_tokens == 300
    assert beat.queued_work_s == pytest.approx(perf.idle_service_s(300, 20) / 1000.0)
    assert beat.outstanding_total == 1
    assert [e.request_id for e in beat.outstanding] == ["held"]
    assert not beat.outstanding[0].running
    assert beat.capacity.gpu == perf.tensor_parallel
    assert beat.kv_cache_free_bytes == perf.kv_bytes(perf.kv_capacity_tokens)
    assert not beat.draining
    assert beat.predicted_work_s is None  # the assignment carried no prediction


async def test_heartbeats_report_held_work_as_the_scheduler_predicted_it(stack: Stack) -> None:
    """Policies compare queued work with their own predictions (as in the simulator): the
    heartbeat's ``predicted_work_s`` and listed ``remaining_s`` are the assignments'
    ``predicted_s``, while ``queued_work_s`` stays the backend's own estimate."""
    perf = performance_model(PROFILE)
    held = _llm("held", prompt=300, output=20, not_before_s=time.time() + 3600)
    held = held.model_copy(update={"predicted_s": 0.7})
    async with stack.ctx.bus.subscribe(HEARTBEATS, group="t-hb") as heartbeats:
        await stack.publish(ASSIGNMENTS, held)
        beat = await _heartbeat_where(heartbeats, lambda h: h.queue_length == 1)
    assert beat.predicted_work_s == pytest.approx(0.7)
    assert [e.remaining_s for e in beat.outstanding] == [pytest.approx(0.7)]
    assert beat.queued_work_s == pytest.approx(perf.idle_service_s(300, 20) / 1000.0)


async def test_an_assignment_its_record_shows_superseded_or_answered_does_not_run(
    stack: Stack,
) -> None:
    # A worker restarted under its id resumes its group's unread assignments: this one
    # was re-assigned elsewhere (epoch 1 recorded) meanwhile, that one already answered.
    state = stack.ctx.state
    await state.hset(request_key("moved-on"), {"status": "assigned", "epoch": "1"})
    await state.hset(request_key("answered"), {"status": "ok", "epoch": "0"})
    await state.hset(request_key("current"), {"status": "assigned", "epoch": "0"})
    for request_id in ("moved-on", "answered"):
        assert not await stack.worker.take(_llm(request_id))
        assert request_id not in stack.worker.queue
        assert await state.get(f"claim:{request_id}:0:run") is None
    # The request's current assignment, and one nobody recorded, run.
    assert await stack.worker.take(_llm("current", not_before_s=time.time() + 3600))
    assert await stack.worker.take(_llm("unrecorded", not_before_s=time.time() + 3600))


async def test_migrating_a_waiting_request_reassigns_it_with_the_new_epoch(stack: Stack) -> None:
    held = _llm("mover", output=5, not_before_s=time.time() + 3600, epoch=2)
    async with stack.ctx.bus.subscribe(ASSIGNMENTS, group="t-observer") as assignments:
        await stack.publish(ASSIGNMENTS, held)
        assert await _next(assignments) == held
        await _until_queued(stack.worker, "mover")
        # As the scheduler recorded it when it sent the request here.
        await stack.ctx.state.zadd(assigned_key(stack.worker.worker_id), {"mover": 1.0})
        before = time.time()
        await stack.publish(
            MIGRATIONS,
            _migration("mover", from_worker_id="w1", epoch=3, cost_s=0.5, decided_at_s=before),
        )
        moved = await _next(assignments)
        after = time.time()
    assert isinstance(moved, Assignment)
    assert moved.worker_id == "w2"
    assert moved.epoch == 3
    assert moved.request == held.request
    assert moved.generated_tokens == 0
    assert moved.not_before_s is not None
    assert before + 0.5 <= moved.not_before_s <= after + 0.5
    assert "mover" not in stack.worker.queue
    # Recorded where a WorkerDown of the target would look for it, and gone from here.
    state = stack.ctx.state
    recorded = await state.get(assignment_key("mover"))
    assert recorded is not None
    assert Assignment.model_validate_json(recorded) == moved
    assert await state.hget(request_key("mover"), "worker_id") == "w2"
    assert await state.hget(request_key("mover"), "epoch") == "3"
    assert await state.zcard(assigned_key("w2")) == 1
    assert await state.zcard(assigned_key(stack.worker.worker_id)) == 0


class _NoAssignmentRecords(MemoryStateStore):
    """A state store that cannot write assignment records (an outage, as a move sees it)."""

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        if key.startswith("assignment:"):
            raise ConnectionError("the state store is down (test)")
        await super().set(key, value, ttl_s=ttl_s)


async def test_a_move_that_cannot_be_recorded_does_not_happen(stack: Stack) -> None:
    bus = stack.ctx.bus
    ctx = _context(bus, _NoAssignmentRecords("t-stuck:"), worker_id="stuck")
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=1000.0))
    await worker.start()
    try:
        async with (
            bus.subscribe(ASSIGNMENTS, group="t-obs-stuck") as assignments,
            bus.subscribe(COMPLETIONS, group="t-done-stuck") as completions,
        ):
            held = _llm("stays", output=5, worker_id="stuck", not_before_s=time.time() + 0.3)
            await bus.publish(ASSIGNMENTS, held)
            await _next(assignments)
            await _until_queued(worker, "stays")
            moved = await worker.migrate(
                _migration("stays", from_worker_id="stuck", epoch=1, cost_s=0.1)
            )
            # Unrecorded, the move would leave the request on neither worker's books:
            # it stays, nothing is sent to w2, and it runs here when its time comes.
            assert moved is False
            assert "stays" in worker.queue
            done = await _completion(completions)
            assert await assignments.next_within(0.2) is None
    finally:
        ctx.stopping.set()
        await worker.drain()
        await worker.cancel_routines()
    assert (done.request_id, done.worker_id, done.epoch) == ("stays", "stuck", 0)
    assert done.status is CompletionStatus.OK


async def test_migrating_a_running_request_moves_its_tokens_and_kv(stack: Stack) -> None:
    perf = performance_model(PROFILE)
    # A slow emulation (time scale 1) so the request is still running when it moves.
    slow = EmulatedLlmBackend(perf, time_scale=1.0)
    bus = stack.ctx.bus
    ctx = _context(bus, stack.state, worker_id="slow")
    worker = WorkerService(ctx, slow)
    await worker.start()
    try:
        async with (
            bus.subscribe(ASSIGNMENTS, group="t-obs2") as assignments,
            bus.subscribe(OUTPUT_CHUNKS, group="t-chunks2") as chunks,
        ):
            await bus.publish(
                ASSIGNMENTS, _llm("runner", output=2000, prompt=500, stream=True, worker_id="slow")
            )
            await _next(assignments)
            await _next(chunks)  # it has generated tokens
            await bus.publish(
                MIGRATIONS,
                _migration("runner", from_worker_id="slow", epoch=1, cost_s=9.0),
            )
            moved = await _next(assignments)
    finally:
        ctx.stopping.set()
        await worker.drain()
    assert isinstance(moved, Assignment)
    assert moved.worker_id == "w2"
    assert moved.epoch == 1
    assert moved.generated_tokens >= CHUNK_TOKENS
    assert moved.not_before_s is not None
    transfer_s = perf.kv_transfer_s(500 + moved.generated_tokens)
    assert moved.not_before_s - moved.assigned_at_s == pytest.approx(transfer_s, abs=1e-5)
    assert not slow.has_running()


async def test_draining_finishes_running_work_and_says_so(stack: Stack) -> None:
    bus = stack.ctx.bus
    async with (
        bus.subscribe(COMPLETIONS, group="t-drain") as completions,
        bus.subscribe(HEARTBEATS, group="t-drain-hb") as heartbeats,
        bus.subscribe(OUTPUT_CHUNKS, group="t-drain-chunks") as chunks,
    ):
        await stack.publish(ASSIGNMENTS, _llm("last", output=200, stream=True))
        await _next(chunks)  # running now
        stack.ctx.stopping.set()
        await stack.worker.drain()
        done = await _completion(completions)
        final = await _heartbeat_where(heartbeats, lambda h: h.draining)
    assert done.request_id == "last"
    assert done.status is CompletionStatus.OK
    assert done.result == LLMResult(output_tokens=200, text="")
    assert final.running == 0


async def test_a_draining_worker_heartbeats_until_what_runs_is_done(stack: Stack) -> None:
    # A slower emulation (time scale 10): the long request runs for about half a second,
    # ten heartbeat intervals, so a worker silent while draining would look dead.
    bus = stack.ctx.bus
    ctx = _context(bus, stack.state, worker_id="leaving")
    worker = WorkerService(ctx, EmulatedLlmBackend(performance_model(PROFILE), time_scale=10.0))
    await worker.start()

    def mine(beat: Heartbeat) -> bool:
        return beat.worker_id == "leaving"

    try:
        async with (
            bus.subscribe(COMPLETIONS, group="t-leave") as completions,
            bus.subscribe(HEARTBEATS, group="t-leave-hb") as heartbeats,
            bus.subscribe(OUTPUT_CHUNKS, group="t-leave-chunks") as chunks,
        ):
            await bus.publish(
                ASSIGNMENTS, _llm("long", output=400, stream=True, worker_id="leaving")
            )
            await _next(chunks)  # running now
            later = _llm("later", worker_id="leaving", not_before_s=time.time() + 3600)
            await bus.publish(ASSIGNMENTS, later)
            await _heartbeat_where(heartbeats, lambda h: mine(h) and h.queue_length == 1)
            ctx.stopping.set()
            draining = asyncio.create_task(worker.drain())
            beats = [await _heartbeat_where(heartbeats, lambda h: mine(h) and h.draining)]
            while beats[-1].running:
                beats.append(await _heartbeat_where(heartbeats, mine))
            done = await _completion(completions)
            await draining
            assert await completions.next_within(0.2) is None  # "later" never ran here
    finally:
        ctx.stopping.set()
        await worker.cancel_routines()
    first, last = beats[0], beats[-1]
    # At once: what runs and what only waits, for the waiting to move now.
    assert [(e.request_id, e.running) for e in first.outstanding] == [
        ("long", True),
        ("later", False),
    ]
    # Every interval while the long request ran, each saying draining.
    assert len(beats) >= 4, [b.running for b in beats]
    assert all(b.draining for b in beats)
    assert [b.sequence for b in beats] == sorted({b.sequence for b in beats})
    # The last: nothing runs, and what still waits is listed for re-assignment.
    assert last.running == 0
    assert [(e.request_id, e.running) for e in last.outstanding] == [("later", False)]
    assert (done.request_id, done.status) == ("long", CompletionStatus.OK)


async def test_a_torch_worker_serves_the_tiny_language_model() -> None:
    bus = Bus(MemoryTransport())
    await bus.start()
    ctx = _context(
        bus, MemoryStateStore("t:"), worker_backend="torch", worker_device="cpu", worker_id="t1"
    )
    worker = await create(ctx, ServingCatalogue(llm={}, classification={}))
    await worker.start()
    try:
        async with bus.subscribe(COMPLETIONS, group="t-torch") as completions:
            await bus.publish(
                ASSIGNMENTS, _llm("tiny", model=TINY_LM_MODEL, output=5, worker_id="t1")
            )
            done = await _completion(completions)
    finally:
        ctx.stopping.set()
        await worker.drain()
        await bus.stop()
        ctx.telemetry.shutdown()
    assert done.status is CompletionStatus.OK
    assert not done.emulated
    assert done.worker_type == "cpu"
    assert isinstance(done.result, LLMResult)
    assert done.result.output_tokens == 5
    assert done.result.text is not None
    assert done.result.text != ""
