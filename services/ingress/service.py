"""The ingress service: the HTTP API under uvicorn, and the routines that bring answers
back to it (:mod:`services.ingress.routing`: every request carries ``reply_to`` = this
replica's ``instance_id``; each replica reads every answer in its own consumer group
``ingress-{instance_id}`` and keeps those addressed to it), and the one that feeds
admission control the monitor's worker records (``cluster_routine``, when
``SWITCHYARD_ADMISSION=deadline``; :mod:`services.ingress.admission_policy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Generator

import uvicorn
from switchyard.contracts.messages import InferenceRequest
from switchyard.contracts.topics import REQUESTS
from switchyard.errors import SwitchyardError
from switchyard.runtime.service import Service, ServiceContext
from switchyard.serving import ServingCatalogue
from switchyard.telemetry import Telemetry

from services.cluster_state import read_cluster
from services.ingress.admission import Admission
from services.ingress.admission_policy import AdmissionGate
from services.ingress.answers import AnswerRegistry
from services.ingress.api import ApiOptions, build_app
from services.ingress.routing import ANSWER_LOOKBACK_S, route_chunks, route_completions

_START_TIMEOUT_S = 10.0
# The API has drained its calls before uvicorn is told to stop; this only bounds
# connections that stay open idle (keep-alive).
_UVICORN_GRACE_S = 2


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handling: the service runtime owns SIGTERM and
    SIGINT and drains the ingress itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class IngressService(Service):
    """The ingress: accepts HTTP calls, publishes requests, returns their answers.

    Args:
        ctx: the service context (settings: ``http_host``, ``http_port``,
            ``max_body_bytes``, ``answer_timeout_s``, ``instance_id``, ``admission``,
            ``admission_slack``, ``admission_grace_s``, ``worker_timeout_s``,
            ``heartbeat_interval_s``).
        catalogue: what is served; loaded from ``settings.registry`` at start when None.
    """

    def __init__(self, ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> None:
        super().__init__(ctx)
        self.catalogue = catalogue
        self.answers = AnswerRegistry(ctx.settings.instance_id)
        self.admission = Admission()
        settings = ctx.settings
        self.gate: AdmissionGate | None = (
            AdmissionGate(
                slack=settings.admission_slack,
                grace_s=settings.admission_grace_s,
                worker_timeout_s=settings.worker_timeout_s,
            )
            if settings.admission == "deadline"
            else None
        )
        self._answers_stop = asyncio.Event()
        self._answers_since_s: float | None = None
        self._server: _EmbeddedServer | None = None
        self._socket: socket.socket | None = None
        self._port: int | None = None

    @property
    def http_port(self) -> int:
        """The port the API listens on (the bound one when ``http_port`` was 0); 0 until
        :meth:`start` has bound it."""
        return self._port or 0

    async def _publish(self, request: InferenceRequest) -> None:
        await self.ctx.bus.publish(REQUESTS, request)

    async def start(self) -> None:
        settings = self.ctx.settings
        if self.catalogue is None:
            self.catalogue = await asyncio.to_thread(
                _load_catalogue, settings.registry, settings.cache_dir
            )
        app = build_app(
            self.catalogue,
            self._publish,
            self.answers,
            self.ctx.state,
            options=ApiOptions(
                max_body_bytes=settings.max_body_bytes,
                answer_timeout_s=settings.answer_timeout_s,
                llm_time_scale=settings.worker_time_scale,
            ),
            admission=self.admission,
            gate=self.gate,
            # A context built without real telemetry (tests) gets the global providers.
            telemetry=self.ctx.telemetry if isinstance(self.ctx.telemetry, Telemetry) else None,
        )
        # Bind here rather than in uvicorn: a taken port is then an OSError naming it,
        # not uvicorn's sys.exit, and port 0 tells us the port it got.
        try:
            family = socket.AF_INET6 if ":" in settings.http_host else socket.AF_INET
            sock = socket.create_server((settings.http_host, settings.http_port), family=family)
        except OSError as exc:
            raise SwitchyardError(
                f"cannot listen on {settings.http_host}:{settings.http_port}: {exc}"
            ) from exc
        self._socket = sock
        self._port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=_UVICORN_GRACE_S,
        )
        self._server = _EmbeddedServer(config)
        # Answers from before this process started wait for no call here (see routing).
        self._answers_since_s = time.time() - ANSWER_LOOKBACK_S
        self.spawn_routine("completions_routine", self.completions_routine)
        self.spawn_routine("chunks_routine", self.chunks_routine)
        self.spawn_routine("http_routine", self.http_routine)
        if self.gate is not None:
            self.spawn_routine("cluster_routine", self.cluster_routine)
        deadline = asyncio.get_running_loop().time() + _START_TIMEOUT_S
        while not self._server.started:
            if self.failed.is_set() or "http_routine" not in self.running_routines():
                raise SwitchyardError(f"the HTTP server did not start: {self.failure!r}")
            if asyncio.get_running_loop().time() > deadline:
                raise SwitchyardError(
                    f"the HTTP server did not start within {_START_TIMEOUT_S:g} s"
                )
            await asyncio.sleep(0.01)
        self.ctx.logger.info(
            "ingress listening on %s:%d",
            settings.http_host,
            self._port,
            extra={"event": "listening", "http_port": self._port},
        )

    async def http_routine(self) -> None:
        """uvicorn, until the drain tells it to stop."""
        assert self._server is not None
        assert self._socket is not None
        try:
            await self._server.serve(sockets=[self._socket])
        except Exception as exc:
            # Not retriable: the listening socket is gone with the server.
            raise SwitchyardError(f"the HTTP server failed: {exc}", retriable=False) from exc

    async def cluster_routine(self) -> None:
        """Feed the admission gate the monitor's worker records every
        ``min(0.1 s, heartbeat interval / 2)`` (the scheduler's period). A failed read
        keeps the last view: its workers age, and the gate judges them as it would."""
        assert self.gate is not None
        period_s = min(0.1, self.ctx.settings.heartbeat_interval_s / 2)
        failing = False
        while not self.ctx.stopping.is_set():
            try:
                view = await read_cluster(self.ctx.state, time.time())
            except Exception as exc:
                if not failing:
                    self.ctx.logger.warning(
                        "admission control cannot read the cluster state: %s", exc
                    )
                failing = True
            else:
                failing = False
                self.gate.observe(view)
            await asyncio.sleep(period_s)

    async def completions_routine(self) -> None:
        """Record and deliver the completions addressed to this replica."""
        await route_completions(
            self.ctx.bus,
            self.ctx.state,
            self.answers,
            stopping=self._answers_stop,
            since_s=self._answers_since_s,
        )

    async def chunks_routine(self) -> None:
        """Deliver the streamed chunks addressed to this replica."""
        await route_chunks(
            self.ctx.bus, self.answers, stopping=self._answers_stop, since_s=self._answers_since_s
        )

    async def drain(self) -> None:
        """Refuse new calls (503 with Retry-After), let the calls in flight finish (the
        runtime bounds this with ``drain_timeout_s``), stop uvicorn, then the answer
        routines."""
        self.admission.stop_accepting()
        try:
            await self.admission.wait_idle()
        finally:
            if self._server is not None:
                self._server.should_exit = True
            self._answers_stop.set()
        await super().drain()


def _load_catalogue(registry: str | None, cache_dir: str) -> ServingCatalogue:
    from switchyard.serving.artifacts import load_catalogue

    return load_catalogue(registry, cache_dir)
