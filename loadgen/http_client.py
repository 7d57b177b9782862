"""The replay's HTTP clients: a lean keep-alive client for load, and an httpx one for tests.

A load generator that spends milliseconds of CPU per request measures itself, not the
server: at 1,000 requests/s a general-purpose client (httpx) would need more than a core.
:class:`KeepAliveClient` is HTTP/1.1 over plain asyncio protocols and nothing else: one
request at a time per connection, connections kept open and reused, a new one opened
whenever every open one is busy (so an open-loop replay never queues behind a slow
answer), ``Content-Length`` and chunked bodies, a per-request timeout. It speaks only
``http://``; :class:`HttpxClient` serves ``https://`` targets and in-process ASGI apps
(tests).

Both implement :class:`HttpClient`::

    async with KeepAliveClient("127.0.0.1", 8080, timeout_s=30.0) as client:
        response = await client.post("/v1/completions", body)
        response.status, response.headers["content-type"], response.content
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, cast

import httpx

__all__ = [
    "ConnectError",
    "HttpClient",
    "HttpResponse",
    "HttpxClient",
    "KeepAliveClient",
    "ProtocolError",
    "RequestTimeoutError",
]

_MAX_HEADER_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """An answer: status, headers (names in lower case), the whole body."""

    status: int
    headers: dict[str, str]
    content: bytes


class RequestTimeoutError(Exception):
    """No whole answer within the client's timeout."""


class ProtocolError(Exception):
    """The connection failed, or the server's answer is not HTTP/1.1 this client reads."""


class ConnectError(ProtocolError):
    """No connection could be opened (refused, unreachable)."""


class HttpClient(Protocol):
    """What the replay needs of an HTTP client: a POST of JSON bytes, and closing."""

    async def post(self, path: str, body: bytes) -> HttpResponse:
        """POST ``body`` (JSON) to ``path``; raises :class:`RequestTimeoutError` or
        :class:`ProtocolError`."""
        ...

    async def aclose(self) -> None: ...


class _Connection(asyncio.Protocol):
    """One keep-alive connection: sends a request, parses its answer, then idles."""

    def __init__(self, on_idle: deque[_Connection], on_lost: set[_Connection]) -> None:
        self._idle = on_idle
        self._open = on_lost
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._answer: asyncio.Future[HttpResponse] | None = None
        self._status = 0
        self._headers: dict[str, str] | None = None
        self._length: int | None = None
        self._chunked = False
        self._body = bytearray()
        self._keep_alive = True
        self.closed = False

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, only alike.
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._open.discard(self)
        with contextlib.suppress(ValueError):
            self._idle.remove(self)
        if self._answer is None or self._answer.done():
            return
        if exc is None and self._headers is not None and self._length is None and not self._chunked:
            # No length and not chunked: the body runs to the end of the connection.
            self._body = self._buffer
            self._keep_alive = False
            self._finish()
            return
        reason = str(exc) if exc else "the server closed the connection"
        self._answer.set_exception(ProtocolError(reason))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            self._parse()
        except ProtocolError as exc:
            self._fail(exc)

    # -- use ------------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> asyncio.Future[HttpResponse]:
        assert self._transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._status, self._headers, self._length, self._chunked = 0, None, None, False
        self._body = bytearray()
        self._transport.write(head + body)
        return self._answer

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()
        self.closed = True

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
        self.abort()

    def _parse(self) -> None:
        if self._headers is None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > _MAX_HEADER_BYTES:
                    raise ProtocolError("answer headers too large")
                return
            head = bytes(self._buffer[:end]).decode("latin-1")
            del self._buffer[: end + 4]
            status_line, _, rest = head.partition("\r\n")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ProtocolError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
            self._status = int(parts[1])
            headers: dict[str, str] = {}
            for line in rest.split("\r\n"):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            self._headers = headers
            self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            length = headers.get("content-length")
            self._length = int(length) if length is not None and length.isdigit() else None
            self._keep_alive = headers.get("connection", "").lower() != "close"
        if self._chunked:
            if not self._parse_chunks():
                return
        elif self._length is not None:
            if len(self._buffer) < self._length:
                return
            self._body = self._buffer[: self._length]
            del self._buffer[: self._length]
        else:
            return  # read to the end of the connection (connection_lost finishes it)
        self._finish()

    def _parse_chunks(self) -> bool:
        """Move complete chunks from the buffer to the body; True at the last chunk."""
        while True:
            line_end = self._buffer.find(b"\r\n")
            if line_end < 0:
                return False
            size_text = bytes(self._buffer[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                trailer_end = self._buffer.find(b"\r\n\r\n", line_end)
                if trailer_end < 0:
                    return False
                del self._buffer[: trailer_end + 4]
                return True
            start = line_end + 2
            if len(self._buffer) < start + size + 2:
                return False
            self._body += self._buffer[start : start + size]
            del self._buffer[: start + size + 2]

    def _finish(self) -> None:
        answer, self._answer = self._answer, None
        assert self._headers is not None
        response = HttpResponse(self._status, self._headers, bytes(self._body))
        if self._keep_alive and not self.closed:
            self._idle.append(self)
        else:
            self.abort()
        if answer is not None and not answer.done():
            answer.set_result(response)


class KeepAliveClient:
    """HTTP/1.1 POSTs to one ``host:port`` over reused connections (see the module
    docstring).

    Args:
        host, port: the server.
        timeout_s: longest wait for a whole answer, connecting included.
        max_connections: connections open at most; a request beyond waits for one.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 120.0,
        max_connections: int = 4096,
        api_key: str | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self._timeout_s = timeout_s
        self._idle: deque[_Connection] = deque()
        self._open: set[_Connection] = set()
        self._slots = asyncio.Semaphore(max_connections)
        self._host_header = f"Host: {host}:{port}\r\n".encode()
        if api_key is not None:
            self._host_header += f"Authorization: Bearer {api_key}\r\n".encode()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def post(self, path: str, body: bytes) -> HttpResponse:
        head = (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\n"
            + self._host_header
            + b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        async with self._slots:
            connection = await self._connection(deadline)
            answer = connection.send(head, body)
            try:
                return await asyncio.wait_for(answer, max(0.0, deadline - loop.time()))
            except TimeoutError:
                connection.abort()
                raise RequestTimeoutError(f"no answer within {self._timeout_s:g} s") from None

    async def _connection(self, deadline: float) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self._idle, self._open), self._host, self._port
                ),
                max(0.0, deadline - loop.time()),
            )
        except TimeoutError:
            raise RequestTimeoutError(f"no connection within {self._timeout_s:g} s") from None
        except OSError as exc:
            raise ConnectError(exc.strerror or str(exc) or type(exc).__name__) from None
        self._open.add(protocol)
        return protocol

    async def aclose(self) -> None:
        for connection in list(self._open):
            connection.abort()
        self._open.clear()
        self._idle.clear()


class HttpxClient:
    """:class:`HttpClient` over httpx: for ``https://`` targets and in-process ASGI apps."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 120.0,
        max_connections: int = 4096,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
    ) -> None:
        self._client = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {api_key}"} if api_key is not None else None,
            base_url=base_url,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=min(max_connections, 1024),
            ),
            transport=transport,
        )

    async def post(self, path: str, body: bytes) -> HttpResponse:
        try:
            response = await self._client.post(
                path, content=body, headers={"content-type": "application/json"}
            )
        except httpx.TimeoutException as exc:
            raise RequestTimeoutError(str(exc) or "no answer within the timeout") from None
        except httpx.HTTPError as exc:  # refused, reset, protocol errors
            raise ProtocolError(str(exc) or type(exc).__name__) from None
        headers = {name.lower(): value for name, value in response.headers.items()}
        return HttpResponse(response.status_code, headers, response.content)

    async def aclose(self) -> None:
        await self._client.aclose()
