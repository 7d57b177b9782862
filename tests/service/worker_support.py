"""What the worker service tests share: a worker over the in-memory bus and state store
(the ``stack`` fixture), and helpers that play the scheduler and read what it sends back.

Work reaches a worker on its own partition of ``switchyard.worker-inbox`` (named in its
heartbeats), fenced through the request ledger: each test records a request and its
assignment the way the scheduler does before sending it. Answers, and a streamed
request's chunks before them, come back on the ``reply_partition`` of
``switchyard.answers`` the request names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from switchyard.bus import Bus, MemoryTransport, Subscription
from switchyard.config import load_settings
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    Migration,
    OutputChunk,
    PlacementOrder,
)
from switchyard.contracts.topics import ANSWERS, HEARTBEATS, WORKER_INBOX
from switchyard.lifecycle import Assign, RequestLedger, RequestRecord
from switchyard.runtime.service import ServiceContext
from switchyard.state import MemoryStateStore
from switchyard.telemetry import Telemetry

from services.worker import create
from services.worker.service import WorkerService

PROFILE = "a100-80gb/llama-2-7b"
MODEL = "llama-2-7b"
REPLY_PARTITION = 0
"""The partition of ``switchyard.answers`` every request here names for its answer."""
WAIT_S = 20.0  # generous: these waits end on an event, the timeout only bounds a failure

Answers = Subscription[Completion | OutputChunk]


@dataclass
class Stack:
    ctx: ServiceContext
    worker: WorkerService
    state: MemoryStateStore
    metrics: InMemoryMetricReader

    @property
    def bus(self) -> Bus:
        return self.ctx.bus

    def answers(self, group: str) -> Answers:
        return _answers(self.bus, group)

    async def send(self, assignment: Assignment, *, record: bool = True) -> None:
        """Record ``assignment`` (unless ``record`` is False) and send it to the worker."""
        if record:
            await _record(self.state, assignment)
        await _send(self.worker, assignment)


def _context(
    bus: Bus,
    state: MemoryStateStore,
    *,
    metrics: InMemoryMetricReader | None = None,
    **settings: object,
) -> ServiceContext:
    values: dict[str, object] = {
        "worker_id": "w1",
        "heartbeat_interval_s": 0.05,
        "worker_profile": PROFILE,
        "worker_time_scale": 1000.0,
    }
    values.update(settings)
    meters = MeterProvider(metric_readers=[metrics]) if metrics is not None else MeterProvider()
    return ServiceContext(
        name="worker",
        settings=load_settings({}, **values),
        bus=bus,
        state=state,
        telemetry=Telemetry(TracerProvider(), meters),
        logger=logging.getLogger("tests.worker"),
        stopping=asyncio.Event(),
    )


async def _start(worker: WorkerService) -> None:
    """Start ``worker`` and wait for a heartbeat naming its inbox partition: the scheduler
    sends a worker work only once one did (it reads its inbox from then on)."""
    bus = worker.ctx.bus
    async with bus.subscribe(HEARTBEATS, group=f"t-ready-{worker.worker_id}") as beats:
        await worker.start()
        partition = worker.inbox.partition
        await _heartbeat_where(
            beats,
            lambda h: h.worker_id == worker.worker_id and h.inbox_partition == partition,
        )


@pytest.fixture(name="stack")
async def stack_fixture() -> AsyncIterator[Stack]:
    bus = Bus(MemoryTransport())
    await bus.start()
    state = MemoryStateStore("test:")
    metrics = InMemoryMetricReader()
    ctx = _context(bus, state, metrics=metrics)
    worker = await create(ctx)
    assert isinstance(worker, WorkerService)
    await _start(worker)
    yield Stack(ctx, worker, state, metrics)
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
        reply_partition=REPLY_PARTITION,
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


async def _record(state: MemoryStateStore, assignment: Assignment) -> None:
    """Record the request and its first assignment as the scheduler does."""
    ledger = RequestLedger(state)
    await ledger.accept(assignment.request)
    outcome = await ledger.assign(Assign(assignment))
    assert outcome.result == "assigned", outcome


async def _send(worker: WorkerService, message: Assignment | Migration | PlacementOrder) -> None:
    """Send ``message`` to ``worker``'s inbox partition (as the scheduler and the
    rebalancer do)."""
    await worker.ctx.bus.publish(WORKER_INBOX, message, partition=worker.inbox.partition)


def _answers(bus: Bus, group: str) -> Answers:
    """A reader of the answers partition the requests here name (open it before the
    worker can answer: it starts at the partition's end)."""
    return bus.subscribe(ANSWERS, group=group, partitions=[REPLY_PARTITION])


async def _next(subscription: Subscription[Completion | OutputChunk]) -> Completion | OutputChunk:
    delivery = await subscription.next_within(WAIT_S)
    assert delivery is not None, f"nothing on {subscription.topic.name} within {WAIT_S} s"
    return delivery.message


async def _chunk(subscription: Answers) -> OutputChunk:
    message = await _next(subscription)
    assert isinstance(message, OutputChunk), f"an answer before any chunk: {message}"
    return message


async def _completion(subscription: Answers) -> Completion:
    """The next answer, passing over output chunks."""
    while True:
        message = await _next(subscription)
        if isinstance(message, Completion):
            return message


async def _read(state: MemoryStateStore, request_id: str) -> RequestRecord:
    record = await RequestLedger(state).read(request_id)
    assert record is not None, f"no record of {request_id}"
    return record


async def _heartbeat_where(
    subscription: Subscription[Heartbeat], test: Callable[[Heartbeat], bool]
) -> Heartbeat:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        delivery = await subscription.next_within(WAIT_S)
        assert delivery is not None
        if test(delivery.message):
            return delivery.message
    raise AssertionError("no matching heartbeat")
