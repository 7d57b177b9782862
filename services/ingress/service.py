"""The ingress service: the HTTP API under uvicorn, the routines that bring answers back
to it (:mod:`services.ingress.routing`: this replica leases a partition of
``switchyard.answers`` at start and names it in every request, so its answers come to it
alone), and the one that feeds admission control
(:mod:`services.ingress.load_shedding`, ``SWITCHYARD_ADMISSION=deadline``) and direct
dispatch (:mod:`services.ingress.dispatch`, ``SWITCHYARD_LLM_DISPATCH=direct``) the
monitor's worker records (``cluster_routine``).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Generator

import uvicorn
from switchyard.bus import Subscription
from switchyard.cluster import ClusterReader
from switchyard.contracts.messages import Completion, InferenceRequest, OutputChunk
from switchyard.contracts.topics import ANSWERS, requests_topic
from switchyard.errors import SwitchyardError
from switchyard.lifecycle import RequestLedger
from switchyard.policies.registry import make_llm_policy
from switchyard.runtime.inbox import Inbox
from switchyard.runtime.service import Service, ServiceContext
from switchyard.serving import ServingCatalogue
from switchyard.telemetry import Telemetry

from services.ingress.answers import AnswerRegistry
from services.ingress.api import ApiOptions, build_app
from services.ingress.dispatch import DirectDispatcher
from services.ingress.drain import Admission
from services.ingress.http_protocol import header_timeout_protocol
from services.ingress.load_shedding import AdmissionGate
from services.ingress.pipeline_admission import PipelineGate
from services.ingress.quotas import Quotas
from services.ingress.routing import answer_subscription, route_answers, sweep_overdue
from services.ingress.tenants import load_key_ring

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
        # Every answer this replica receives calibrates the gate's estimates.
        self.answers = AnswerRegistry(
            settings.instance_id, on_completion=self.gate.answered if self.gate else None
        )
        # Built once the catalogue (its models) is known, at start.
        self.pipeline_gate: PipelineGate | None = None
        self.dispatcher: DirectDispatcher | None = (
            DirectDispatcher(
                ctx.bus,
                ctx.state,
                make_llm_policy(settings.llm_policy),
                worker_timeout_s=settings.worker_timeout_s,
                model_interval_s=settings.predictor_publish_interval_s,
                meter_provider=(
                    ctx.telemetry.meter_provider if isinstance(ctx.telemetry, Telemetry) else None
                ),
            )
            if settings.llm_dispatch == "direct"
            else None
        )
        self._answers_stop = asyncio.Event()
        self.inbox: Inbox[Completion | OutputChunk] = Inbox(ctx, ANSWERS, settings.instance_id)
        self.ledger = RequestLedger(ctx.state)
        self._answer_sub: Subscription[Completion | OutputChunk] | None = None
        self._server: _EmbeddedServer | None = None
        self._socket: socket.socket | None = None
        self._port: int | None = None

    @property
    def http_port(self) -> int:
        """The port the API listens on (the bound one when ``http_port`` was 0); 0 until
        :meth:`start` has bound it."""
        return self._port or 0

    async def _publish(self, request: InferenceRequest) -> None:
        if self.dispatcher is not None:
            await self.dispatcher.publish(request)
        else:
            await self.ctx.bus.publish(requests_topic(request), request)

    async def start(self) -> None:
        settings = self.ctx.settings
        # First: a bad key configuration stops the start with a message naming it.
        keys = load_key_ring(settings)
        await self.inbox.open()
        # Reading (from the partition's end) before any request names the partition.
        self._answer_sub = answer_subscription(self.inbox, self.answers, self._answers_stop)
        await self._answer_sub.open()
        self.answers.reply_partition = self.inbox.partition
        if self.catalogue is None:
            self.catalogue = await asyncio.to_thread(
                _load_catalogue, settings.registry, settings.cache_dir
            )
        if self.gate is not None:
            self.pipeline_gate = PipelineGate(
                self.catalogue.models,
                llm_models={name: app.model for name, app in self.catalogue.llm.items()},
                slack=settings.admission_slack,
                grace_s=settings.admission_grace_s,
                worker_timeout_s=settings.worker_timeout_s,
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
            pipeline_gate=self.pipeline_gate,
            # A context built without real telemetry (tests) gets the global providers.
            telemetry=self.ctx.telemetry if isinstance(self.ctx.telemetry, Telemetry) else None,
            decisions=self.dispatcher,
            keys=keys,
            # A call's place is held at most until its answer times out, and a margin.
            quotas=Quotas(self.ctx.state, hold_s=settings.answer_timeout_s + 30)
            if keys is not None
            else None,
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
            # httptools (uvicorn's C HTTP/1.1 parser, faster than h11 on the hot path),
            # with a header-read timeout (services/ingress/http_protocol.py).
            http=header_timeout_protocol(settings.http_header_timeout_s),
            # The loop is ours (switchyard.runtime.loop: uvloop when installed); uvicorn
            # only serves on it and must not pick or set up one.
            loop="none",
            lifespan="off",
            log_config=None,
            # No line per call: at 1,000 calls/s that is 1,000 lines a second. The
            # request metrics and spans (services/ingress/telemetry.py) count them.
            access_log=False,
            timeout_graceful_shutdown=_UVICORN_GRACE_S,
            # A cap on sockets and calls: past it uvicorn answers 503 rather than letting
            # a flood of connections exhaust file descriptors and memory.
            # (uvicorn counts the connection being refused too, hence the 1.)
            limit_concurrency=settings.http_max_connections + 1,
            timeout_keep_alive=max(1, round(settings.http_keep_alive_s)),
        )
        self._server = _EmbeddedServer(config)
        self.spawn_routine("answers_routine", self.answers_routine)
        self.spawn_routine("answers_lease_routine", self.inbox.lease_routine)
        self.spawn_routine("overdue_routine", self.overdue_routine)
        self.spawn_routine("http_routine", self.http_routine)
        if self.gate is not None or self.dispatcher is not None:
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
        """Feed the admission gate and the direct dispatcher the monitor's worker
        records every ``min(0.1 s, heartbeat interval / 2)`` (the scheduler's period). A
        failed read keeps the last view: its workers age, and the gate judges them as it
        would."""
        period_s = min(0.1, self.ctx.settings.heartbeat_interval_s / 2)
        failing = False
        reader = ClusterReader(self.ctx.state)
        while not self.ctx.stopping.is_set():
            try:
                view = await reader.read(time.time())
                if self.dispatcher is not None:
                    await self.dispatcher.observe(view)
            except Exception as exc:
                if not failing:
                    self.ctx.logger.warning("the ingress cannot read the cluster state: %s", exc)
                failing = True
            else:
                failing = False
                if self.gate is not None:
                    self.gate.observe(view)
                if self.pipeline_gate is not None:
                    self.pipeline_gate.observe(view)
            await asyncio.sleep(period_s)

    async def answers_routine(self) -> None:
        """Deliver the answers and chunks of this replica's partition."""
        # The one opened at start, or, after a restart of this routine, a new one.
        sub, self._answer_sub = (
            self._answer_sub or answer_subscription(self.inbox, self.answers, self._answers_stop),
            None,
        )
        await route_answers(sub, self.inbox, self.answers, stopping=self._answers_stop)

    async def overdue_routine(self) -> None:
        """Deliver from the records the answers that did not come over the bus."""
        await sweep_overdue(self.ledger, self.answers, stopping=self._answers_stop)

    async def drain(self) -> None:
        """Announce the drain on ``/healthz``, go on taking calls for ``drain_notice_s``,
        then refuse new calls (503 with Retry-After), let the calls in flight finish (the
        runtime bounds all this with ``drain_timeout_s``), stop uvicorn, then the answer
        routines."""
        self.admission.announce_drain()
        if self.ctx.settings.drain_notice_s > 0:
            await asyncio.sleep(self.ctx.settings.drain_notice_s)
        self.admission.stop_accepting()
        try:
            await self.admission.wait_idle()
        finally:
            if self._server is not None:
                self._server.should_exit = True
            self._answers_stop.set()
        await super().drain()
        await self.inbox.close()


def _load_catalogue(registry: str | None, cache_dir: str) -> ServingCatalogue:
    from switchyard.serving.artifacts import load_catalogue

    return load_catalogue(registry, cache_dir)
