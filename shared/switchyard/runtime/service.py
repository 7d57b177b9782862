"""The service runtime: the async shell every Switchyard service runs in.

A service subclasses :class:`Service`, opens what it needs in :meth:`Service.start` and
runs its long-lived loops as supervised ``*_routine``\\ s (:meth:`Service.spawn_routine`).
:func:`run_service` does the rest: logs, telemetry, the bus and state store, the health
endpoint, signals, and a graceful drain on SIGTERM. :func:`main_for` is what a console
command calls.

Exit codes:

- 0 (:data:`EXIT_OK`): stopped by a signal and drained cleanly.
- 1 (:data:`EXIT_FAILED`): a routine failed, the bus or state store could not be reached
  at start, starting failed, or the drain outlived ``SWITCHYARD_DRAIN_TIMEOUT_S``.
- 2 (:data:`EXIT_CONFIG`): invalid ``SWITCHYARD_*`` configuration.
- 130 / 143 (128 + signal number): a second SIGINT / SIGTERM forced the stop mid-drain.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import inspect
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.config import Settings, load_settings
from switchyard.errors import ConfigError, SwitchyardError, is_retriable
from switchyard.heap import settle_heap
from switchyard.runtime.connections import StartError, backoff_s, close_connections, connect
from switchyard.runtime.health import HealthServer, ReadinessCheck
from switchyard.runtime.presence import Presence
from switchyard.runtime.status import StatusSource

if TYPE_CHECKING:
    from switchyard.bus import Bus
    from switchyard.state import StateStore
    from switchyard.telemetry import Telemetry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2

DEFAULT_CONNECT_TIMEOUT_S = 30.0
"""How long :func:`run_service` keeps trying to reach the bus and state store at start."""

# A routine that ran this long before failing had recovered: its next failure starts the
# backoff afresh instead of waiting the capped delay.
_HEALTHY_RUN_S = 10.0
_CLOSE_STEP_TIMEOUT_S = 10.0  # each of bus.stop / state.close, so a dead broker cannot hang exit
_FORCED_CLOSE_STEP_TIMEOUT_S = 1.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True, kw_only=True)
class ServiceContext:
    """What a service is given: its configuration and its connections.

    Attributes:
        name: the service's name (``monitor``, ``scheduler``, …), in logs and traces.
        settings: the validated ``SWITCHYARD_*`` configuration.
        bus: the message bus; :func:`run_service` starts and stops it.
        state: the state store; :func:`run_service` closes it.
        telemetry: tracer and meter providers; shut down (flushed) at exit.
        logger: the service's logger (``switchyard.<name>``).
        stopping: set when a stop was requested; routines finish the work in hand and
            leave once it is set.
    """

    name: str
    settings: Settings
    bus: Bus
    state: StateStore
    telemetry: Telemetry
    logger: logging.Logger
    stopping: asyncio.Event


class Service(abc.ABC):
    """Base of every service.

    Subclasses implement :meth:`start`, spawning their loops with :meth:`spawn_routine`;
    a routine should check ``self.ctx.stopping`` between units of work and return once
    it is set, after finishing the unit in hand.

    Attributes:
        ctx: the :class:`ServiceContext`.
        failure: the non-retriable exception that failed the service, or None.
        failed: set when ``failure`` is.
    """

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.failure: BaseException | None = None
        self.failed = asyncio.Event()
        self._routines: dict[str, asyncio.Task[None]] = {}

    @abc.abstractmethod
    async def start(self) -> None:
        """Subscribe and spawn routines; return once the service is serving.

        Called after the bus has started and the state store answered.
        """

    async def drain(self) -> None:
        """Stop taking new work, finish in-flight work and commit; called once on stop.

        ``ctx.stopping`` is already set. By default, waits for every routine to leave.
        Overrides that close subscriptions first should still end with
        ``await super().drain()``.
        """
        await asyncio.gather(*self._routines.values(), return_exceptions=True)

    def readiness_checks(self) -> Mapping[str, ReadinessCheck]:
        """Checks behind ``/readyz``, by name: by default, the bus and the state store answer.

        Each returns True when ready and returns False or raises when not; each is given
        2 s. Called once, after :meth:`start`.
        """

        async def bus_answers() -> bool:
            await self.ctx.bus.ping()
            return True

        async def state_answers() -> bool:
            await self.ctx.state.ping()
            return True

        return {"bus": bus_answers, "state": state_answers}

    @property
    def alive(self) -> bool:
        """False once a routine failed with a non-retriable error."""
        return self.failure is None

    def running_routines(self) -> list[str]:
        """Names of the routines that have not left yet."""
        return [name for name, task in self._routines.items() if not task.done()]

    def spawn_routine(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` (a long-running ``*_routine``) under supervision.

        - It returning ends it (normally, after it saw ``ctx.stopping``).
        - A retriable error (:func:`~switchyard.errors.is_retriable`) is logged with the
          routine's name and ``fn`` is called again after a backoff of 0.1 s doubling up
          to 5 s (afresh after a run of 10 s or more); no restart once stopping.
        - Any other exception is logged once with its traceback and fails the service:
          liveness answers 503 and :func:`run_service` drains and exits 1.

        Args:
            name: unique name, in logs and in the drain-timeout report.
            fn: the routine; called with no arguments, e.g. ``self.poll_routine``.

        Raises:
            ValueError: a routine called ``name`` already exists.
        """
        if name in self._routines:
            raise ValueError(f"routine {name!r} already exists")
        self._routines[name] = asyncio.create_task(self._supervise(name, fn), name=name)

    async def _supervise(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        log = self.ctx.logger
        stopping = self.ctx.stopping
        attempt = 0
        while not stopping.is_set():
            started_s = time.monotonic()
            try:
                await fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_retriable(exc):
                    log.exception("routine %s failed: %s", name, exc, extra={"routine": name})
                    self._fail(exc)
                    return
                if stopping.is_set():
                    log.debug("routine %s left on a retriable error while stopping: %s", name, exc)
                    return
                ran_s = time.monotonic() - started_s
                attempt = 1 if ran_s >= _HEALTHY_RUN_S else attempt + 1
                delay_s = backoff_s(attempt)
                log.warning(
                    "routine %s hit a retriable error, restarting in %.1f s: %s",
                    name,
                    delay_s,
                    exc,
                    extra={"routine": name, "attempt": attempt, "error": repr(exc)},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay_s)

    def _fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self.failed.set()

    async def cancel_routines(self) -> None:
        """Cancel every routine still running and wait for them to end."""
        for task in self._routines.values():
            task.cancel()
        await asyncio.gather(*self._routines.values(), return_exceptions=True)


ContextBuilder = Callable[[str, Settings], Awaitable[ServiceContext]]
"""Builds the :class:`ServiceContext` of service ``name``; tests inject fakes through it."""


async def build_default_context(name: str, settings: Settings) -> ServiceContext:
    """Configure logs and telemetry, and build the bus (with tracing) and the state store
    that ``settings`` ask for. Nothing is connected yet."""
    # Imported here so that importing the runtime stays cheap and tests can run it with
    # fakes without touching telemetry or the transports.
    from switchyard.bus import bus_from_settings
    from switchyard.runtime.dead_letter_tally import DeadLetterTally
    from switchyard.state import state_from_settings
    from switchyard.telemetry import (
        TracingMiddleware,
        configure_logging,
        configure_telemetry,
        observe_bus_records,
    )

    configure_logging(name, settings)
    telemetry = configure_telemetry(name, settings)
    tracing = TracingMiddleware(telemetry.tracer_provider, telemetry.meter_provider)
    state = state_from_settings(settings)
    bus = bus_from_settings(settings, middlewares=[tracing, DeadLetterTally(state)])
    observe_bus_records(telemetry.meter_provider, bus)
    return ServiceContext(
        name=name,
        settings=settings,
        bus=bus,
        state=state,
        telemetry=telemetry,
        logger=logging.getLogger(f"switchyard.{name}"),
        stopping=asyncio.Event(),
    )


ServiceFactory = Callable[[ServiceContext], "Service | Awaitable[Service]"]
"""What builds a service from its context: the class itself, or an async ``create``."""


async def run_service(
    factory: ServiceFactory,
    *,
    name: str,
    settings: Settings | None = None,
    build_context: ContextBuilder = build_default_context,
    stop: asyncio.Event | None = None,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> int:
    """Run one service until SIGTERM or SIGINT (or ``stop``), then drain it.

    In order: build the context (logs, telemetry, bus, state), start the health server
    (liveness 200, readiness 503 ``starting``, and ``/metrics`` when the telemetry has a
    Prometheus reader), connect the bus and state store
    (retrying for ``connect_timeout_s``), :meth:`Service.start`, log a ``started`` line
    with the health URL, and wait. On a stop signal or a routine failure: readiness
    turns 503 ``draining``, ``ctx.stopping`` is set, :meth:`Service.drain` gets
    ``settings.drain_timeout_s``, then the bus stops, state closes, telemetry flushes and
    the health server stops. A second signal during the drain stops at once.

    Args:
        factory: builds the service from its context: the service class, or an async
            function (awaited before the health endpoint opens).
        name: the service's name, in logs and traces.
        settings: configuration; read from the environment when None.
        build_context: builds the context; tests pass one with fakes.
        stop: set it to stop the service as SIGTERM would (for embedding and tests);
            with it, the caller handles the signals and this installs no handler.
        connect_timeout_s: how long to keep trying to reach the bus and state store.

    Returns:
        The exit code: 0 after a clean drain, 1 on failure or drain timeout, 128 + signal
        number when a second signal forced the stop.

    Example::

        class Monitor(Service):
            async def start(self) -> None:
                self.spawn_routine("heartbeat_routine", self.heartbeat_routine)

            async def heartbeat_routine(self) -> None:
                while not self.ctx.stopping.is_set():
                    ...

        sys.exit(asyncio.run(run_service(Monitor, name="monitor")))
    """
    settings = settings if settings is not None else load_settings()
    try:
        ctx = await build_context(name, settings)
    except Exception as exc:
        print(f"switchyard {name}: could not start: {exc}", file=sys.stderr)
        return EXIT_FAILED
    log = ctx.logger
    stop_requested = stop if stop is not None else asyncio.Event()
    forced = asyncio.Event()
    signals_received: list[int] = []

    def on_signal(signum: int) -> None:
        signals_received.append(signum)
        if stop_requested.is_set():
            forced.set()
        stop_requested.set()

    loop = asyncio.get_running_loop()
    installed: list[int] = []
    # With ``stop`` the embedding program owns the signals: the loop keeps one handler a
    # signal, so each embedded service would replace the program's and, once stopped,
    # remove it, and the next SIGTERM would kill the process with no drain.
    for signum in _STOP_SIGNALS if stop is None else ():
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread (or not Unix): the embedding program stops us via `stop`.
            log.debug("cannot handle signal %s here", signum)

    service: Service | None = None
    health: HealthServer | None = None
    code = EXIT_FAILED
    try:
        made = factory(ctx)
        # A factory may be a coroutine function: services that load models or train at
        # start build themselves before the health endpoint opens.
        service = built = await made if inspect.isawaitable(made) else made
        prometheus = getattr(ctx.telemetry, "prometheus", None)
        health = bound = HealthServer(
            settings.health_host,
            settings.health_port,
            alive=lambda: built.alive,
            metrics=prometheus.render if prometheus is not None else None,
            status=StatusSource(ctx.state, worker_timeout_s=settings.worker_timeout_s).document,
        )
        await health.start()
        presence = Presence(ctx.state, name, settings.instance_id, lambda: bound.url)
        started = await _start(service, health, ctx, stop_requested, connect_timeout_s)
        if started:
            async with presence.kept():
                await _first(stop_requested.wait(), service.failed.wait())
        code = await _drain(service, health, ctx, forced, signals_received)
        if started:
            await presence.withdraw()
    except StartError as exc:
        log.error("%s", exc, extra={"event": "start-failed"})
        print(f"switchyard {name}: {exc}", file=sys.stderr)
    except ConfigError as exc:  # e.g. a bad registry file, found while building
        log.error("%s", exc, extra={"event": "start-failed"})
        print(f"switchyard {name}: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    except OSError as exc:  # the health port is taken, typically
        log.error("could not start: %s", exc, extra={"event": "start-failed"})
        print(f"switchyard {name}: could not start: {exc}", file=sys.stderr)
    except Exception:  # a bug: the traceback is what its author needs
        log.exception("service failed unexpectedly", extra={"event": "crashed"})
    finally:
        if service is not None:
            await service.cancel_routines()
        step_timeout_s = _FORCED_CLOSE_STEP_TIMEOUT_S if forced.is_set() else _CLOSE_STEP_TIMEOUT_S
        await close_connections(ctx, step_timeout_s=step_timeout_s)
        if health is not None:
            await health.stop()
        # Removed last: a signal during the closing steps must not kill the process
        # before the bus has committed and telemetry has flushed.
        for installed_signum in installed:
            loop.remove_signal_handler(installed_signum)
    log.info("stopped with exit code %d", code, extra={"event": "stopped", "exit_code": code})
    return code


async def _first(*waits: Awaitable[object]) -> None:
    """Wait until the first of ``waits`` completes; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _start(
    service: Service,
    health: HealthServer,
    ctx: ServiceContext,
    stop_requested: asyncio.Event,
    connect_timeout_s: float,
) -> bool:
    """Connect and start the service; False when a stop came first (nothing to drain
    then but what start spawned)."""

    async def connect_and_start() -> None:
        await connect(ctx, connect_timeout_s)
        try:
            await service.start()
        except SwitchyardError as exc:  # expected failures get one line, bugs a traceback
            raise StartError(f"could not start: {exc}") from exc

    starting = asyncio.ensure_future(connect_and_start())
    stopped = asyncio.ensure_future(stop_requested.wait())
    try:
        await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not starting.done():
            starting.cancel()
        await asyncio.gather(stopped, return_exceptions=True)
    if starting.cancelled() or not starting.done():
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        ctx.logger.info("stop requested while starting", extra={"event": "start-aborted"})
        return False
    starting.result()  # raises what starting raised
    settle_heap()
    for check_name, check in service.readiness_checks().items():
        health.add_check(check_name, check)
    health.mark_started()
    ctx.logger.info(
        "started; health at %s",
        health.url,
        extra={"event": "started", "health_url": health.url, "health_port": health.port},
    )
    return True


async def _drain(
    service: Service,
    health: HealthServer,
    ctx: ServiceContext,
    forced: asyncio.Event,
    signals_received: list[int],
) -> int:
    """Drain within ``drain_timeout_s``; returns the exit code."""
    log = ctx.logger
    # Readiness first, so load balancers stop sending while in-flight work finishes.
    health.mark_draining()
    ctx.stopping.set()
    if service.failure is not None:
        reason = f"routine failure: {service.failure!r}"
    elif signals_received:
        reason = signal.Signals(signals_received[0]).name
    else:
        reason = "stop requested"
    timeout_s = ctx.settings.drain_timeout_s
    log.info(
        "draining (%s), up to %g s",
        reason,
        timeout_s,
        extra={"event": "draining", "reason": reason},
    )
    drain = asyncio.ensure_future(service.drain())
    force = asyncio.ensure_future(forced.wait())
    try:
        done, _ = await asyncio.wait(
            [drain, force], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        force.cancel()
        await asyncio.gather(force, return_exceptions=True)
    if drain not in done:
        stuck = service.running_routines()
        drain.cancel()
        await asyncio.gather(drain, return_exceptions=True)
        if forced.is_set():
            signum = signals_received[-1]
            log.warning(
                "stop forced by a second %s; abandoning: %s",
                signal.Signals(signum).name,
                ", ".join(stuck) or "nothing",
                extra={"event": "forced", "routines": stuck},
            )
            return 128 + signum
        log.error(
            "drain did not finish within %g s; still running: %s",
            timeout_s,
            ", ".join(stuck) or "nothing (drain itself hung)",
            extra={"event": "drain-timeout", "routines": stuck},
        )
        return EXIT_FAILED
    if (error := drain.exception()) is not None:
        log.error("drain failed", exc_info=error, extra={"event": "drain-failed"})
        return EXIT_FAILED
    if service.failure is not None:
        return EXIT_FAILED
    log.info("drained", extra={"event": "drained"})
    return EXIT_OK


def main_for(factory: ServiceFactory, *, name: str) -> None:
    """The synchronous entry point of a service process; never returns.

    Reads the configuration; when it is invalid, prints ``switchyard <name>: <message>``
    (one line per bad variable, no traceback) to stderr and exits 2. Otherwise runs
    :func:`run_service` (on uvloop when installed: :mod:`switchyard.runtime.loop`) and
    exits with its code.

    Example (``services/monitor/__main__.py``)::

        main_for(Monitor, name="monitor")
    """
    from switchyard.runtime.loop import run

    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"switchyard {name}: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    code: int
    try:
        code = run(run_service(factory, name=name, settings=settings))
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        code = 128 + int(signal.SIGINT)
    sys.exit(code)
