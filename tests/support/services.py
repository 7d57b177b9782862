"""Running services in tests: real contexts over the in-memory bus and state store."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from opentelemetry.sdk.trace.export import SpanExporter
from switchyard.bus import Bus, MemoryBroker, MemoryTransport
from switchyard.config import Settings, load_settings
from switchyard.contracts.messages import Heartbeat
from switchyard.runtime import ServiceContext
from switchyard.state import StateStore, keys
from switchyard.state.memory import MemoryStateStore
from switchyard.telemetry import TracingMiddleware, configure_telemetry


def service_settings(**overrides: object) -> Settings:
    """Settings for a service under test: memory bus and state, free health port."""
    values: dict[str, object] = {"health_port": 0, "drain_timeout_s": 5.0}
    values.update(overrides)
    return load_settings({}, **values)


async def memory_context(
    name: str,
    settings: Settings,
    broker: MemoryBroker,
    state: MemoryStateStore,
    *,
    spans: SpanExporter | None = None,
) -> ServiceContext:
    """A started bus on ``broker`` and a client of ``state``, as a service gets them;
    with ``spans``, the bus is traced as the runtime traces it and spans go there."""
    telemetry = configure_telemetry(name, settings, span_exporter=spans, install_global=False)
    middlewares = (
        [TracingMiddleware(telemetry.tracer_provider, telemetry.meter_provider)] if spans else []
    )
    bus = Bus(
        MemoryTransport(broker),
        client_id=settings.instance_id,
        commit_interval_s=0.05,
        middlewares=middlewares,
    )
    await bus.start()
    return ServiceContext(
        name=name,
        settings=settings,
        bus=bus,
        state=state.sharing(settings.state_prefix),
        telemetry=telemetry,
        logger=logging.getLogger(f"tests.{name}"),
        stopping=asyncio.Event(),
    )


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    """Wait until ``check()`` is true; fail with a clear message after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.01)


def heartbeat(
    worker_id: str,
    *,
    profile: str | None = "a100-80gb/llama-2-7b",
    models: tuple[str, ...] = ("llama-2-7b",),
    sequence: int = 1,
    waiting: int = 0,
    running: int = 0,
    queued_work_s: float = 0.0,
    worker_type: str = "a100-80gb",
) -> Heartbeat:
    """A worker's heartbeat as the monitor stores it."""
    return Heartbeat(
        worker_id=worker_id,
        worker_type=worker_type,
        sequence=sequence,
        interval_s=0.5,
        queue_length=waiting,
        queued_work_s=queued_work_s,
        running=running,
        utilization=1.0 if waiting else min(1.0, running / 8),
        servable_models=list(models),
        resident_models=list(models),
        profile=profile,
        max_slots=8,
        kv_capacity_tokens=100_000,
        sent_at_s=time.time(),
    )


async def mark_restored(state: StateStore) -> None:
    """Write the state generation as the monitor does once the answers are in the store
    (a store that no monitor watches): calls naming their request id are accepted."""
    await state.set_if_absent(keys.STATE_GENERATION, "test-generation")


async def store_worker(state: MemoryStateStore, beat: Heartbeat, status: str = "alive") -> None:
    """Write a worker record the way the monitor does."""
    now_s = time.time()
    await state.hset(
        f"worker:{beat.worker_id}",
        {"heartbeat": beat.model_dump_json(), "last_seen_s": str(now_s), "status": status},
    )
    await state.zadd("workers", {beat.worker_id: now_s})
