"""The embedded stack: every service in one process, over the in-memory bus and state.

``switchyard up --embedded`` and ``make demo`` run this. Each service runs exactly as it
would alone (:func:`~switchyard.runtime.run_service`: its own context, routines, health
endpoint and drain), but all share one in-memory broker, one in-memory state store
(each service a separate client of it, as with Redis), one telemetry set-up and one
catalogue. Health endpoints take free ports; the ingress serves the HTTP API on the port
asked for.

Telemetry is one set-up for the process: every service's ``GET /metrics`` (on its health
port, and the ingress's on the API port too) shows the metrics of the whole process, not
of that service alone, and one request's spans all carry the resource
``service.name=switchyard-embedded`` (the consumer groups in the spans' attributes tell
the services apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, cast

from switchyard.bus import MemoryBroker, bus_from_settings
from switchyard.config import Settings
from switchyard.heap import settle_heap
from switchyard.runtime import Service, ServiceContext, run_service
from switchyard.runtime.dead_letter_tally import DeadLetterTally
from switchyard.runtime.service import ServiceFactory
from switchyard.serving.catalogue import ServingCatalogue
from switchyard.state import StateStore, keys, state_from_settings
from switchyard.state.memory import MemoryStateStore
from switchyard.telemetry import (
    Telemetry,
    TracingMiddleware,
    configure_logging,
    configure_telemetry,
    observe_bus_records,
)

from services.catalog import service_factory

log = logging.getLogger(__name__)

DEFAULT_LLM_WORKERS: tuple[str, ...] = (
    "a100-80gb/llama-2-7b",
    "a100-80gb/llama-2-7b",
    "h100-80gb/llama-2-13b",
)
"""The emulated LLM workers of the default embedded stack (performance profiles)."""

_CONTROL_SERVICES = (
    "monitor",
    "predictor",
    "estimator",
    "scheduler",
    "rebalancer",
    "placement",
    "ingress",
)
_TAKES_CATALOGUE = frozenset({"ingress", "estimator", "scheduler", "worker", "placement"})


class EmbeddedStartError(RuntimeError):
    """The embedded stack did not come up; the message says which part."""


@dataclass(frozen=True, slots=True)
class EmbeddedPlan:
    """What the embedded stack runs.

    Attributes:
        llm_workers: one emulated LLM worker per performance profile named.
        torch_workers: workers running the real torch models (classification variants
            and the tiny language model).
        model_workers: ``emulated-models`` workers serving pipeline stages (each of
            the base settings' resource vector), placed by the placement service
            (``switchyard up --embedded`` starts 2).
        http_port: the ingress HTTP API's port (0: a free one).
        prefill_workers: prefill/decode disaggregation: the first this-many LLM workers
            only prefill and the others only decode, as the simulator's
            ``--prefill-workers`` (0: every LLM worker runs both phases).
    """

    llm_workers: tuple[str, ...] = DEFAULT_LLM_WORKERS
    torch_workers: int = 1
    model_workers: int = 0
    http_port: int = 8080
    prefill_workers: int = 0

    def llm_role(self, index: int) -> Literal["mixed", "prefill", "decode"]:
        """The role of LLM worker ``index``."""
        if not self.prefill_workers:
            return "mixed"
        return "prefill" if index < self.prefill_workers else "decode"

    def worker_settings(self, base: Settings) -> list[Settings]:
        """The settings of every worker, ids ``llm-0``.., ``torch-0``.., ``models-0``.."""
        workers = [
            base.model_copy(
                update={
                    "worker_id": f"llm-{index}",
                    "instance_id": f"llm-{index}",
                    "worker_backend": "emulated-llm",
                    "worker_profile": profile,
                    "worker_role": self.llm_role(index),
                }
            )
            for index, profile in enumerate(self.llm_workers)
        ]
        workers += [
            base.model_copy(
                update={
                    "worker_id": f"torch-{index}",
                    "instance_id": f"torch-{index}",
                    "worker_backend": "torch",
                }
            )
            for index in range(self.torch_workers)
        ]
        workers += [
            base.model_copy(
                update={
                    "worker_id": f"models-{index}",
                    "instance_id": f"models-{index}",
                    "worker_backend": "emulated-models",
                }
            )
            for index in range(self.model_workers)
        ]
        return workers


@dataclass
class _Running:
    name: str
    settings: Settings
    service: list[Service] = field(default_factory=list)
    task: asyncio.Task[int] | None = None


class EmbeddedStack:
    """Every service in this process; use ``async with`` or :meth:`start`/:meth:`stop`.

    Args:
        settings: the base configuration (health ports are forced to free ones).
        plan: which workers to run and the HTTP port.
        catalogue: the applications served; loaded from ``settings`` when None.
        over_settings_transports: False (the embedded default): bus and state are forced
            to in-memory ones shared by the services. True: every service connects to the
            bus and state store ``settings`` name (Kafka and Redis) on its own, as separate
            processes would; tests and benchmarks of the real transports use this.
        telemetry: the process's telemetry (tests pass one with an in-memory span
            exporter, so spans are recorded without an OTLP endpoint); built from
            ``settings`` at start when None. The stack shuts down only one it built.
    """

    def __init__(
        self,
        settings: Settings,
        plan: EmbeddedPlan | None = None,
        catalogue: ServingCatalogue | None = None,
        *,
        over_settings_transports: bool = False,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.plan = plan if plan is not None else EmbeddedPlan()
        update: dict[str, object] = {"health_port": 0, "health_host": "127.0.0.1"}
        if not over_settings_transports:
            update.update(bus="memory", state="memory")
        self.settings = settings.model_copy(update=update)
        self.catalogue = catalogue
        self.broker = MemoryBroker(retained_bytes=self.settings.memory_bus_bytes)
        self._memory_state = MemoryStateStore(
            self.settings.state_prefix, max_keys=self.settings.memory_max_keys
        )
        # What the stack reads itself (readiness): the shared memory store, or a client.
        self.state: StateStore = (
            self._memory_state
            if self.settings.state == "memory"
            else state_from_settings(self.settings)
        )
        self.stop_event = asyncio.Event()
        self._running: list[_Running] = []
        self._telemetry: Telemetry | None = telemetry
        self._owns_telemetry = telemetry is None

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> EmbeddedStack:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, timeout_s: float = 180.0) -> None:
        """Start every service and wait until the API answers and every worker reported.

        Raises:
            EmbeddedStartError: a service exited, or the stack was not ready in time.
        """
        # A program that sent the logs to a file (`switchyard demo`) keeps them there.
        configure_logging("embedded", self.settings, keep_file=True)
        if self._telemetry is None:
            self._telemetry = configure_telemetry("switchyard-embedded", self.settings)
        if self.catalogue is None:
            from switchyard.serving.artifacts import settings_catalogue

            self.catalogue = await asyncio.to_thread(settings_catalogue, self.settings)
        for worker_settings in self.plan.worker_settings(self.settings):
            self._launch("worker", worker_settings)
        for name in _CONTROL_SERVICES:
            update: dict[str, object] = {"instance_id": f"{name}-0"}
            if name == "ingress":
                update["http_port"] = self.plan.http_port
            self._launch(name, self.settings.model_copy(update=update))
        await self._wait_ready(timeout_s)
        settle_heap()  # every service is up: what they built stays (see settle_heap)

    async def stop(self) -> int:
        """Stop every service (drained like SIGTERM) and return the worst exit code."""
        self.stop_event.set()
        codes = await asyncio.gather(
            *(r.task for r in self._running if r.task is not None), return_exceptions=True
        )
        if self._telemetry is not None and self._owns_telemetry:
            self._telemetry.shutdown()
        if self.state is not self._memory_state:
            await self.state.close()
        worst = 0
        for running, code in zip(self._running, codes, strict=True):
            if isinstance(code, BaseException):
                log.error("service %s crashed: %r", running.name, code)
                worst = max(worst, 1)
            else:
                worst = max(worst, code)
        return worst

    # -- what runs -----------------------------------------------------------------------

    def metrics(self) -> str:
        """The process's metrics, the Prometheus text every service's ``/metrics`` (on its
        health port) serves."""
        assert self._telemetry is not None
        assert self._telemetry.prometheus is not None
        return self._telemetry.prometheus.render()

    def service(self, name: str) -> Service:
        """The running service called ``name`` (the first, for workers)."""
        for running in self._running:
            if running.name == name and running.service:
                return running.service[0]
        raise KeyError(f"no running service {name!r}")

    def workers(self) -> list[Service]:
        return [r.service[0] for r in self._running if r.name == "worker" and r.service]

    @property
    def url(self) -> str:
        """The base URL of the HTTP API."""
        port = getattr(self.service("ingress"), "http_port", None)
        if not isinstance(port, int) or port <= 0:
            raise EmbeddedStartError("the ingress has not bound its port yet")
        return f"http://127.0.0.1:{port}"

    def _launch(self, name: str, settings: Settings) -> None:
        factory = service_factory(name)
        if name in _TAKES_CATALOGUE:
            # These services' create() also takes the catalogue: load it once for all.
            takes_catalogue = cast("Callable[..., Service | Awaitable[Service]]", factory)
            catalogue = self.catalogue

            def factory(ctx: ServiceContext) -> Service | Awaitable[Service]:
                return takes_catalogue(ctx, catalogue=catalogue)

        running = _Running(name, settings)
        capture = _capturing(factory, running.service)
        running.task = asyncio.create_task(
            run_service(
                capture,
                name=name,
                settings=settings,
                build_context=self._context_builder(),
                stop=self.stop_event,
            ),
            name=f"embedded-{settings.instance_id}",
        )
        self._running.append(running)

    def _context_builder(self) -> _ContextBuilder:
        return _ContextBuilder(self)

    async def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        expected = len(self.plan.llm_workers) + self.plan.torch_workers + self.plan.model_workers
        while True:
            for running in self._running:
                if running.task is not None and running.task.done():
                    code = running.task.result() if not running.task.cancelled() else -1
                    await self.stop()
                    raise EmbeddedStartError(
                        f"service {running.name} ({running.settings.instance_id}) exited "
                        f"with code {code} while the stack was starting"
                    )
            registered = await self.state.zcard(keys.WORKERS)
            # The monitor's answers restore is done (on a new store: at once), so calls
            # that name their request id are accepted.
            restored = await self.state.get(keys.STATE_GENERATION) is not None
            port = None
            with contextlib.suppress(KeyError):
                port = getattr(self.service("ingress"), "http_port", None)
            if registered >= expected and restored and isinstance(port, int) and port > 0:
                return
            if time.monotonic() > deadline:
                await self.stop()
                raise EmbeddedStartError(
                    f"the embedded stack was not ready within {timeout_s:g} s "
                    f"({registered} of {expected} workers reported; API port {port}; "
                    f"answers restored: {restored})"
                )
            await asyncio.sleep(0.05)


def _capturing(factory: ServiceFactory, into: list[Service]) -> ServiceFactory:
    async def build(ctx: ServiceContext) -> Service:
        made = factory(ctx)
        service = await made if inspect.isawaitable(made) else made
        assert isinstance(service, Service)
        into.append(service)
        return service

    return build


class _ContextBuilder:
    """Builds each service's context over the stack's shared broker, state and telemetry."""

    def __init__(self, stack: EmbeddedStack) -> None:
        self._stack = stack

    async def __call__(self, name: str, settings: Settings) -> ServiceContext:
        stack = self._stack
        telemetry = stack._telemetry
        assert telemetry is not None
        tracing = TracingMiddleware(telemetry.tracer_provider, telemetry.meter_provider)
        state: StateStore = (
            stack._memory_state.sharing(settings.state_prefix)
            if settings.state == "memory"
            else state_from_settings(settings)
        )
        bus = bus_from_settings(
            settings,
            middlewares=[tracing, DeadLetterTally(state)],
            memory_broker=stack.broker,
        )
        observe_bus_records(telemetry.meter_provider, bus)
        return ServiceContext(
            name=name,
            settings=settings,
            bus=bus,
            state=state,
            telemetry=_shared_view(telemetry),
            logger=logging.getLogger(f"switchyard.{name}"),
            stopping=asyncio.Event(),
        )


def _shared_view(telemetry: Telemetry) -> Telemetry:
    """The stack's telemetry as one service sees it: the same providers, which that
    service's exit leaves running; the stack shuts them down once, after every service."""
    return Telemetry(
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
        exporting_to=telemetry.exporting_to,
        owns_providers=False,
        prometheus=telemetry.prometheus,
    )


async def run_embedded(
    settings: Settings, plan: EmbeddedPlan, *, over_settings_transports: bool = False
) -> int:
    """Run the embedded stack until SIGINT/SIGTERM; returns the exit code."""
    import signal

    stack = EmbeddedStack(settings, plan, over_settings_transports=over_settings_transports)
    loop = asyncio.get_running_loop()
    try:
        await stack.start()
    except EmbeddedStartError as exc:
        print(f"switchyard up: {exc}")
        return 1
    where = (
        "in-memory bus and state"
        if not over_settings_transports
        else (f"bus {stack.settings.bus}, state {stack.settings.state}")
    )
    print(
        f"switchyard: embedded stack up ({where}); HTTP API at {stack.url} "
        f"(OpenAPI: {stack.url}/openapi.json)",
        flush=True,
    )
    print(
        "  emulated LLM workers (a performance model, not measurements): "
        + ", ".join(plan.llm_workers)
    )
    print(f"  torch workers: {plan.torch_workers}; Ctrl-C stops")
    stopped = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stopped.set)
    await stopped.wait()
    return await stack.stop()
