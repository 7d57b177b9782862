"""A small HTTP/1.1 server for liveness and readiness probes.

No framework: every service serves these, and some (the monitor) must start fast, so
this is a few dozen lines on :func:`asyncio.start_server`.

- ``GET /healthz`` (liveness): 200 ``{"status": "ok"}`` while the event loop runs and
  the service has not failed; 503 ``{"status": "failed"}`` once a routine crashed.
- ``GET /readyz`` (readiness): 503 ``{"status": "starting"}`` until the service has
  started; then 200 when every registered check passes, with each check's result, or
  503 naming the failing checks; and 503 ``{"status": "draining"}`` from the moment a
  stop began, so load balancers and Kubernetes stop routing to the process.
- ``GET /status`` (when the server was given a ``status`` source): the stack at a glance,
  as :mod:`switchyard.runtime.status` documents it (every service serves the same one:
  it is read from the shared records), JSON; 503 when the state store does not answer.
- ``GET /metrics`` (when the server was given a ``metrics`` source): the Prometheus text
  exposition (format 0.0.4, ``text/plain; version=0.0.4; charset=utf-8``) of the
  process's metrics, answered whatever the readiness, draining included. In the embedded
  stack every service shares one meter provider, so each service's ``/metrics`` shows
  the whole process.

Anything else: 404 for another path (``/metrics`` too, without a source), 405 for
another method, 400 for a request that is not HTTP, too large, or incomplete, 408 when
the request does not arrive in time. Every response but ``/metrics`` is JSON, and every
response closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[bool]]
"""An async callable: True when ready; False or an exception when not."""

DEFAULT_CHECK_TIMEOUT_S = 2.0

_MAX_REQUEST_BYTES = 8192  # a probe's request is a few hundred bytes
_READ_TIMEOUT_S = 5.0
_MAX_ERROR_CHARS = 200
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    503: "Service Unavailable",
}
_PATHS = ("/healthz", "/readyz")
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

StatusReader = Callable[[], Awaitable[dict[str, object]]]
"""Returns the status document (e.g. ``switchyard.runtime.status.StatusSource.document``)."""

MetricsSource = Callable[[], str]
"""Returns the Prometheus text of the process's metrics (e.g.
``PrometheusMetricReader.render``)."""


@dataclass(frozen=True)
class _Text:
    """A plain-text response body."""

    text: str
    content_type: str


@dataclass(frozen=True)
class _Check:
    name: str
    fn: ReadinessCheck
    timeout_s: float


class HealthServer:
    """Serves ``/healthz`` and ``/readyz`` (and ``/metrics``) on ``host:port``.

    Args:
        host: address to bind, e.g. ``127.0.0.1`` or ``0.0.0.0``.
        port: port to bind; 0 picks a free one (read it from :attr:`port` after
            :meth:`start`).
        alive: returns False once the service has failed (liveness then answers 503).
        checks: named readiness checks, each given ``check_timeout_s``; more can be added
            with :meth:`add_check`. A check counts as failing when it returns False,
            raises, or outlives its timeout.
        check_timeout_s: the timeout of the checks passed in ``checks``.
        metrics: renders the Prometheus text served on ``GET /metrics``; None: no
            ``/metrics`` (404).
        status: builds the document served on ``GET /status``; None: no ``/status``.

    Readiness answers 503 ``starting`` until :meth:`mark_started` and 503 ``draining``
    after :meth:`mark_draining`.

    Example::

        server = HealthServer("127.0.0.1", 0, alive=lambda: True, checks={"bus": ping_bus})
        await server.start()
        server.mark_started()
        print(server.url + "/readyz")
        ...
        await server.stop()
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        alive: Callable[[], bool] = lambda: True,
        checks: Mapping[str, ReadinessCheck] | None = None,
        check_timeout_s: float = DEFAULT_CHECK_TIMEOUT_S,
        metrics: MetricsSource | None = None,
        status: StatusReader | None = None,
    ) -> None:
        self.host = host
        self._metrics = metrics
        self._status = status
        self.requested_port = port
        self._alive = alive
        self._checks: dict[str, _Check] = {}
        for name, fn in (checks or {}).items():
            self.add_check(name, fn, timeout_s=check_timeout_s)
        self.started = False
        self.draining = False
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def add_check(
        self, name: str, fn: ReadinessCheck, *, timeout_s: float = DEFAULT_CHECK_TIMEOUT_S
    ) -> None:
        """Register (or replace) the readiness check ``name``, bounded by ``timeout_s``."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s of check {name!r} must be positive, got {timeout_s}")
        self._checks[name] = _Check(name, fn, timeout_s)

    def mark_started(self) -> None:
        """The service has started: readiness now runs the checks."""
        self.started = True

    def mark_draining(self) -> None:
        """A stop began: readiness answers 503 ``draining`` from now on."""
        self.draining = True

    @property
    def port(self) -> int:
        """The bound port (the free one picked when the requested port was 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("health server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Bind and start serving. Raises OSError when the address is taken."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.requested_port, limit=_MAX_REQUEST_BYTES
        )

    async def stop(self) -> None:
        """Stop listening and end the connections still being answered."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Python 3.11's wait_closed does not wait for open connections: end them here so
        # no handler task outlives the event loop.
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        try:
            method = "GET"
            body: dict[str, object] | _Text
            try:
                method, status, body = await self._answer(reader)
            except Exception:  # a probe must never take the service down
                log.exception("health endpoint failed")
                status, body = 503, {"status": "error"}
            if isinstance(body, _Text):
                payload, content_type = body.text.encode("utf-8"), body.content_type
            else:
                payload, content_type = json.dumps(body).encode(), "application/json"
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Content-Length: {len(payload)}\r\n"
                "Cache-Control: no-store\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            with contextlib.suppress(OSError):
                writer.write(head if method == "HEAD" else head + payload)
                await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)

    async def _answer(
        self, reader: asyncio.StreamReader
    ) -> tuple[str, int, dict[str, object] | _Text]:
        """Read one request; returns (method, status, JSON body or text)."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        except TimeoutError:
            return "GET", 408, {"error": f"no complete request within {_READ_TIMEOUT_S:g} s"}
        except asyncio.LimitOverrunError:
            return "GET", 400, {"error": f"request head over {_MAX_REQUEST_BYTES} bytes"}
        except asyncio.IncompleteReadError:
            return "GET", 400, {"error": "incomplete request"}
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[0].isalpha():
            return "GET", 400, {"error": "malformed request line"}
        method, target = parts[0], parts[1].split("?", 1)[0]
        await self._skip_body(reader, lines[1:])
        paths = list(_PATHS)
        if self._metrics is not None:
            paths.append("/metrics")
        if self._status is not None:
            paths.append("/status")
        if target not in paths:
            return method, 404, {"error": f"no such path {target}; try {', '.join(paths)}"}
        if method not in ("GET", "HEAD"):
            return method, 405, {"error": f"{method} not allowed; use GET"}
        if target == "/metrics" and self._metrics is not None:
            return method, 200, _Text(self._metrics(), METRICS_CONTENT_TYPE)
        if target == "/status" and self._status is not None:
            try:
                document = await asyncio.wait_for(self._status(), DEFAULT_CHECK_TIMEOUT_S)
            except Exception as exc:
                reason = str(exc)[:_MAX_ERROR_CHARS] or type(exc).__name__
                return method, 503, {"error": f"the state store did not answer: {reason}"}
            return method, 200, document
        if target == "/healthz":
            alive = self._alive()
            return method, (200 if alive else 503), {"status": "ok" if alive else "failed"}
        status, body = await self._readiness()
        return method, status, body

    @staticmethod
    async def _skip_body(reader: asyncio.StreamReader, header_lines: list[str]) -> None:
        # Closing a socket with unread bytes makes the kernel send a reset, which can
        # destroy our answer before the client reads it; so read a small body first.
        for line in header_lines:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length" and value.strip().isdigit():
                length = int(value.strip())
                if 0 < length <= _MAX_REQUEST_BYTES:
                    with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError):
                        await asyncio.wait_for(reader.readexactly(length), _READ_TIMEOUT_S)
                return

    async def _readiness(self) -> tuple[int, dict[str, object]]:
        if self.draining:
            return 503, {"status": "draining"}
        if not self._alive():
            return 503, {"status": "failed"}
        if not self.started:
            return 503, {"status": "starting"}
        checks = list(self._checks.values())
        results = await asyncio.gather(*(self._run_check(c) for c in checks))
        outcome = {c.name: result for c, result in zip(checks, results, strict=True)}
        failing = [name for name, result in outcome.items() if result != "ok"]
        if failing:
            return 503, {"status": "not ready", "failing": failing, "checks": outcome}
        return 200, {"status": "ready", "checks": outcome}

    @staticmethod
    async def _run_check(check: _Check) -> str:
        """``"ok"``, or why the check failed."""
        try:
            ok = await asyncio.wait_for(check.fn(), check.timeout_s)
        except TimeoutError:
            return f"timed out after {check.timeout_s:g} s"
        except Exception as exc:
            return f"error: {type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS]
        return "ok" if ok else "not ready"
