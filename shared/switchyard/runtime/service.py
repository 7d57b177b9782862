"""The service runtime: the async shell every Switchyard service runs in.

A service subclasses :class:`Service`, opens what it needs in :meth:`Service.start` and
runs its long-lived loops as supervised ``*_routine``\\ s. :func:`run_service` does the
rest: configuration, logs, telemetry, the bus and state store, the health endpoint,
signals, and a graceful drain on SIGTERM.

Exit codes: 0 after a clean drain; 1 when the service failed, could not connect, or did
not drain within ``SWITCHYARD_DRAIN_TIMEOUT_S``; 2 on bad configuration; 128 + signal
number when a second signal forced the stop.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.config import Settings, load_settings
from switchyard.errors import ConfigError, SwitchyardError, is_retriable
from switchyard.runtime.health import HealthServer, ReadinessCheck

if TYPE_CHECKING:
    from switchyard.bus import Bus
    from switchyard.state import StateStore
    from switchyard.telemetry import Telemetry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2

_CONNECT_TIMEOUT_S = 30.0
_BACKOFF_INITIAL_S = 0.1
_BACKOFF_MAX_S = 5.0
_HEALTHY_RUN_S = 30.0  # a routine that ran this long before failing starts its backoff afresh


@dataclass(frozen=True, kw_only=True)
class ServiceContext:
    """What a service is given: its configuration and its connections."""

    name: str
    settings: Settings
    bus: Bus
    state: StateStore
    telemetry: Telemetry
    logger: logging.Logger
    stopping: asyncio.Event


class Service(abc.ABC):
    """Base of every service. Subclasses implement :meth:`start`; routines they spawn
    should leave once ``ctx.stopping`` is set, after finishing the work in hand."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        self._routines: dict[str, asyncio.Task[None]] = {}

    @abc.abstractmethod
    async def start(self) -> None:
        """Open subscriptions and spawn routines; return once the service is serving."""

    async def drain(self) -> None:
        """Finish in-flight work: by default, wait for every routine to leave."""
        if self._routines:
            await asyncio.gather(*self._routines.values(), return_exceptions=True)

    def readiness_checks(self) -> Mapping[str, ReadinessCheck]:
        """Checks behind ``/readyz``: by default, the bus and the state store answer."""

        async def bus_answers() -> bool:
            await self.ctx.bus.ping()
            return True

        async def state_answers() -> bool:
            await self.ctx.state.ping()
            return True

        return {"bus": bus_answers, "state": state_answers}

    def running_routines(self) -> list[str]:
        return [name for name, task in self._routines.items() if not task.done()]

    def spawn_routine(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` until it returns or the service stops, restarting it after
        retriable errors (with capped exponential backoff) and failing the service on
        any other error."""
        if name in self._routines:
            raise ValueError(f"routine {name!r} already exists")
        self._routines[name] = asyncio.create_task(self._supervise(name, fn), name=name)

    async def _supervise(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        log = self.ctx.logger
        attempt = 0
        while not self.ctx.stopping.is_set():
            started_s = time.monotonic()
            try:
                await fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_retriable(exc):
                    log.exception("routine %s failed", name, extra={"routine": name})
                    self._fail(exc)
                    return
                attempt = 1 if time.monotonic() - started_s > _HEALTHY_RUN_S else attempt + 1
                delay_s = min(_BACKOFF_MAX_S, _BACKOFF_INITIAL_S * 2 ** (attempt - 1))
                log.warning(
                    "routine %s hit a retriable error, restarting in %.1fs: %s",
                    name,
                    delay_s,
                    exc,
                    extra={"routine": name, "attempt": attempt},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.ctx.stopping.wait(), delay_s)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self.failed.set()

    async def cancel_routines(self) -> None:
        for task in self._routines.values():
            task.cancel()
        await asyncio.gather(*self._routines.values(), return_exceptions=True)


ContextBuilder = Callable[[str, Settings], Awaitable[ServiceContext]]


async def build_default_context(name: str, settings: Settings) -> ServiceContext:
    """Logs, telemetry, the bus (with tracing) and the state store that ``settings`` ask for."""
    from switchyard.bus import bus_from_settings
    from switchyard.state import state_from_settings
    from switchyard.telemetry import TracingMiddleware, configure_logging, configure_telemetry

    configure_logging(name, settings)
    telemetry = configure_telemetry(name, settings)
    tracing = TracingMiddleware(telemetry.tracer_provider, telemetry.meter_provider)
    return ServiceContext(
        name=name,
        settings=settings,
        bus=bus_from_settings(settings, middlewares=[tracing]),
        state=state_from_settings(settings),
        telemetry=telemetry,
        logger=logging.getLogger(f"switchyard.{name}"),
        stopping=asyncio.Event(),
    )


async def _connect(ctx: ServiceContext) -> None:
    """Start the bus and reach the state store, retrying for a while: the broker may
    still be starting when the service does."""
    deadline_s = time.monotonic() + _CONNECT_TIMEOUT_S
    attempt = 0
    while True:
        attempt += 1
        try:
            await ctx.bus.start()
            await ctx.state.ping()
            return
        except SwitchyardError as exc:
            if not exc.retriable or time.monotonic() >= deadline_s:
                raise
            ctx.logger.warning("waiting for the bus and state store: %s", exc)
            await asyncio.sleep(min(_BACKOFF_MAX_S, _BACKOFF_INITIAL_S * 2 ** (attempt - 1)))


async def run_service(
    factory: Callable[[ServiceContext], Service],
    *,
    name: str,
    settings: Settings | None = None,
    build_context: ContextBuilder = build_default_context,
    stop: asyncio.Event | None = None,
) -> int:
    """Run one service until SIGTERM or SIGINT (or ``stop`` is set), then drain it;
    returns the exit code. ``stop`` lets an embedding program stop services it runs.

    Example::

        class Monitor(Service):
            async def start(self) -> None:
                self.spawn_routine("heartbeat_routine", self.heartbeat_routine)

        sys.exit(asyncio.run(run_service(Monitor, name="monitor")))
    """
    settings = settings if settings is not None else load_settings()
    ctx = await build_context(name, settings)
    log = ctx.logger
    try:
        await _connect(ctx)
    except SwitchyardError as exc:
        log.error("could not start: %s", exc)
        print(f"switchyard {name}: could not start: {exc}", file=sys.stderr)
        await _close(ctx)
        return EXIT_FAILED

    service = factory(ctx)
    health = HealthServer(
        settings.health_host,
        settings.health_port,
        alive=lambda: service.failure is None,
        checks=service.readiness_checks(),
    )
    stop_signal: list[int] = []
    stop_requested = stop if stop is not None else asyncio.Event()
    forced = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        stop_signal.append(signum)
        if stop_requested.is_set():
            forced.set()
        stop_requested.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    code = EXIT_OK
    try:
        await health.start()
        await service.start()
        log.info(
            "started",
            extra={"event": "started", "health_url": health.url, "health_port": health.port},
        )
        waiters = [
            asyncio.ensure_future(stop_requested.wait()),
            asyncio.ensure_future(service.failed.wait()),
        ]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        code = await _drain(service, health, ctx, forced, stop_signal)
    except SwitchyardError as exc:
        log.error("failed: %s", exc)
        code = EXIT_FAILED
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await service.cancel_routines()
        await _close(ctx)
        await health.stop()
    return code


async def _drain(
    service: Service,
    health: HealthServer,
    ctx: ServiceContext,
    forced: asyncio.Event,
    stop_signal: list[int],
) -> int:
    log = ctx.logger
    health.draining = True
    ctx.stopping.set()
    reason = (
        "failure"
        if service.failure is not None
        else f"signal {stop_signal[0] if stop_signal else '?'}"
    )
    log.info("draining", extra={"event": "draining", "reason": reason})
    drain = asyncio.ensure_future(service.drain())
    force = asyncio.ensure_future(forced.wait())
    done, _ = await asyncio.wait(
        [drain, force], timeout=ctx.settings.drain_timeout_s, return_when=asyncio.FIRST_COMPLETED
    )
    force.cancel()
    if drain not in done:
        drain.cancel()
        stuck = service.running_routines()
        if forced.is_set():
            log.warning(
                "stop forced by a second signal", extra={"event": "forced", "routines": stuck}
            )
            return 128 + stop_signal[-1]
        log.error(
            "drain did not finish within %.1fs; still running: %s",
            ctx.settings.drain_timeout_s,
            ", ".join(stuck) or "nothing",
            extra={"event": "drain-timeout", "routines": stuck},
        )
        return EXIT_FAILED
    if service.failure is not None:
        return EXIT_FAILED
    log.info("stopped", extra={"event": "stopped"})
    return EXIT_OK


async def _close(ctx: ServiceContext) -> None:
    with contextlib.suppress(Exception):
        await ctx.bus.stop()
    with contextlib.suppress(Exception):
        await ctx.state.close()
    ctx.telemetry.shutdown()


def main_for(factory: Callable[[ServiceContext], Service], *, name: str) -> None:
    """The synchronous entry point of a service process: never returns."""
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"switchyard {name}: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    sys.exit(asyncio.run(run_service(factory, name=name, settings=settings)))
