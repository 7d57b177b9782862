"""The fakes the runtime's tests run services on: a bus, a state store and telemetry
that record what they were asked, a log capture, and the harness that builds a service
context of them."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import pytest
from switchyard.config import Settings, load_settings
from switchyard.errors import TransportError
from switchyard.runtime import (
    ServiceContext,
)

if TYPE_CHECKING:
    from switchyard.bus import Bus
    from switchyard.state import StateStore
    from switchyard.telemetry import Telemetry

WAIT_S = 10.0


class FakeBus:
    """Stands in for :class:`~switchyard.bus.Bus`: start may fail, ping may fail."""

    def __init__(self, *, start_failures: int = 0, error: Exception | None = None) -> None:
        self.start_failures = start_failures
        self.error = error or TransportError("connecting on Kafka at 127.0.0.1:1 failed")
        self.start_calls = 0
        self.started = False
        self.stopped = False
        self.reachable = True

    async def start(self) -> None:
        self.start_calls += 1
        if self.start_failures != 0:
            self.start_failures -= 1
            raise self.error
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def ping(self) -> None:
        if not self.reachable:
            raise TransportError("broker down")


class FakeState:
    def __init__(self, *, error: Exception | None = None) -> None:
        self.error = error
        self.closed = False

    async def ping(self) -> None:
        if self.error is not None:
            raise self.error

    async def close(self) -> None:
        self.closed = True


class FakeTelemetry:
    def __init__(self) -> None:
        self.shutdowns = 0

    def shutdown(self) -> None:
        self.shutdowns += 1


class Records(logging.Handler):
    """Collects the log records of one test's service logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.arrived = asyncio.Event()  # only the event loop's thread logs here

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.arrived.set()

    def with_event(self, event: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "event", None) == event]

    async def wait_for(self, event: str) -> logging.LogRecord:
        async with asyncio.timeout(WAIT_S):
            while not self.with_event(event):
                self.arrived.clear()
                await self.arrived.wait()
        return self.with_event(event)[0]


def log_field(record: logging.LogRecord, name: str) -> Any:
    """A field the runtime logged with ``extra=``."""
    return record.__dict__[name]


class Harness:
    """Fakes, a ``build_context`` that injects them, and the records of the service's log."""

    def __init__(self, *, bus: FakeBus | None = None, state: FakeState | None = None) -> None:
        self.bus = bus or FakeBus()
        self.state = state or FakeState()
        self.telemetry = FakeTelemetry()
        self.logger = logging.getLogger(f"tests.runtime.{uuid.uuid4().hex[:8]}")
        self.logger.setLevel(logging.DEBUG)
        self.log = Records()
        self.logger.addHandler(self.log)

    async def build_context(self, name: str, settings: Settings) -> ServiceContext:
        return ServiceContext(
            name=name,
            settings=settings,
            bus=cast("Bus", self.bus),
            state=cast("StateStore", self.state),
            telemetry=cast("Telemetry", self.telemetry),
            logger=self.logger,
            stopping=asyncio.Event(),
        )

    def close(self) -> None:
        self.logger.removeHandler(self.log)


@pytest.fixture(name="harness")
def harness_fixture() -> Iterator[Harness]:
    made = Harness()
    yield made
    made.close()


def settings_for(**overrides: object) -> Settings:
    values: dict[str, object] = {"health_port": 0, "drain_timeout_s": 5.0}
    values.update(overrides)
    return load_settings({}, **values)
