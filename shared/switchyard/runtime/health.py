"""A small HTTP/1.1 server for liveness and readiness probes.

No framework: every service, even the ones that must start fast, serves these.

- ``GET /healthz``: 200 ``{"status": "ok"}`` while the service is alive, 503 once it
  has failed (a routine crashed).
- ``GET /readyz``: 200 when every readiness check passes, 503 naming the failing checks,
  and 503 ``{"status": "draining"}`` from the moment a stop began, so load balancers and
  Kubernetes stop routing to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[bool]]

_MAX_REQUEST_BYTES = 8192
_READ_TIMEOUT_S = 5.0
_CHECK_TIMEOUT_S = 2.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


class HealthServer:
    """Serves ``/healthz`` and ``/readyz`` on ``host:port`` (port 0 picks a free one).

    Args:
        alive: returns False once the service has failed.
        checks: named readiness checks; each returns True when ready, and counts as not
            ready when it returns False, raises, or takes longer than 2 s.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        alive: Callable[[], bool],
        checks: Mapping[str, ReadinessCheck],
    ) -> None:
        self.host = host
        self.requested_port = port
        self._alive = alive
        self._checks = dict(checks)
        self.draining = False
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("health server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.requested_port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body = await self._answer(reader)
        except Exception:  # a probe must never take the service down
            log.exception("health endpoint failed")
            status, body = 503, {"status": "error"}
        payload = json.dumps(body).encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            writer.write(head.encode() + payload)
            await writer.drain()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            return 400, {"error": "incomplete or oversized request"}
        if len(head) > _MAX_REQUEST_BYTES:
            return 400, {"error": "request too large"}
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, {"error": "malformed request line"}
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target not in ("/healthz", "/readyz"):
            return 404, {"error": f"no such path {target}; try /healthz or /readyz"}
        if method not in ("GET", "HEAD"):
            return 405, {"error": f"{method} not allowed; use GET"}
        if target == "/healthz":
            return (200, {"status": "ok"}) if self._alive() else (503, {"status": "failed"})
        return await self._readiness()

    async def _readiness(self) -> tuple[int, dict[str, object]]:
        if self.draining:
            return 503, {"status": "draining"}
        if not self._alive():
            return 503, {"status": "failed"}
        names = list(self._checks)
        results = await asyncio.gather(*(self._run_check(self._checks[n]) for n in names))
        checks = dict(zip(names, results, strict=True))
        failing = [n for n, ok in checks.items() if not ok]
        body: dict[str, object] = {
            "status": "ready" if not failing else "not ready",
            "checks": checks,
        }
        if failing:
            body["failing"] = failing
        return (200 if not failing else 503), body

    @staticmethod
    async def _run_check(check: ReadinessCheck) -> bool:
        try:
            return bool(await asyncio.wait_for(check(), _CHECK_TIMEOUT_S))
        except Exception:
            return False
