"""The monitor's test stack over the in-memory bus and state store: monitors, a
collector of WorkerDown events, heartbeats and requests as workers and the scheduler
make them."""

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
from switchyard.cluster import read_assigned
from switchyard.config import Settings, load_settings
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    QueuedEntry,
    RequestTimeline,
    WorkerDown,
)
from switchyard.contracts.topics import WORKER_EVENTS
from switchyard.lifecycle import Assign, RequestLedger
from switchyard.runtime.service import ServiceContext
from switchyard.state import MemoryStateStore, keys
from switchyard.telemetry import Telemetry

import services.monitor
from services.monitor import MonitorService

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
        "inbox_partition": 0,
        "sent_at_s": time.time(),
    }
    values.update(overrides)
    return Heartbeat.model_validate(values)


def entry(request_id: str, *, running: bool = False) -> QueuedEntry:
    return QueuedEntry(request_id=request_id, app="chat", running=running, queued_at_s=1.0)


def request(request_id: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        app="chat",
        payload=LLMPayload(model="llama-2-7b", prompt_tokens=12, max_output_tokens=8),
        arrival_s=1.0,
        reply_to="ingress-a",
    )


def assignment(request_id: str, worker_id: str, *, at_s: float, epoch: int = 0) -> Assignment:
    return Assignment(
        request=request(request_id),
        worker_id=worker_id,
        variant="llama-2-7b",
        order=1.0,
        policy="jsq",
        epoch=epoch,
        assigned_at_s=at_s,
    )


def answer(request_id: str, worker_id: str, *, epoch: int = 0) -> Completion:
    return Completion(
        request_id=request_id,
        app="chat",
        worker_id=worker_id,
        worker_type="emulated-llm",
        variant="llama-2-7b",
        epoch=epoch,
        status=CompletionStatus.OK,
        timeline=RequestTimeline(arrival_s=1.0, started_s=2.0, finished_s=3.0),
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


class ManualClock:
    """Wall seconds that move only when a test sets them."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


class Stack:
    """One in-memory broker and state store; monitors, a worker-side bus, a collector."""

    def __init__(self, exits: AsyncExitStack) -> None:
        self.exits = exits
        self.broker = MemoryBroker()
        self.state = MemoryStateStore(f"t{uuid.uuid4().hex[:6]}:")
        self.settings = settings()
        self.bus = self._bus()
        self.ledger = RequestLedger(self.state)
        self.events: list[WorkerDown] = []

    def _bus(self) -> Bus:
        return Bus(MemoryTransport(self.broker), commit_interval_s=0.05, retry_initial_s=0.01)

    async def start(self) -> None:
        await self.bus.start()
        self.exits.push_async_callback(self.bus.stop)

    async def monitor(
        self, *, run: bool = True, clock: ManualClock | None = None
    ) -> MonitorService:
        """A monitor on this stack's broker and state; its routines run when ``run``; it
        reads the time from ``clock`` when given (else the wall clock)."""
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
        if clock is None:
            made = await services.monitor.create(ctx)
            assert isinstance(made, MonitorService)
            service = made
        else:
            service = MonitorService(ctx, clock=clock)

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
        return await self.state.hgetall(keys.worker(worker_id))

    async def send(self, worker_id: str, sent: dict[str, float]) -> None:
        """Record requests (id -> when) as the scheduler does: accepted, then assigned to
        ``worker_id`` (which puts each in the worker's assigned set)."""
        for request_id, at_s in sent.items():
            assert (await self.ledger.accept(request(request_id))).accepted
            outcome = await self.ledger.assign(Assign(assignment(request_id, worker_id, at_s=at_s)))
            assert outcome.result == "assigned"

    async def assigned(self, worker_id: str) -> list[str]:
        return await read_assigned(self.state, worker_id)


@pytest.fixture(name="stack")
async def stack_fixture() -> AsyncIterator[Stack]:
    """A started :class:`Stack` (import it into a test module to use ``stack``)."""
    async with AsyncExitStack() as exits:
        made = Stack(exits)
        await made.start()
        yield made
