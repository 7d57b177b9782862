"""The ingress's HTTP/1.1 connections: uvicorn's httptools protocol with a header-read
timeout.

uvicorn closes a keep-alive connection that stays idle after an answer, but sets no
limit on reading a request's headers: a connection that sends nothing, or sends its
headers a byte at a time, holds one of the ``SWITCHYARD_HTTP_MAX_CONNECTIONS`` places
for as long as it likes, and a few hundred such clients lock every other client out.
Here the headers of a connection's first request must be complete within
``header_timeout_s`` of the connection being made, and those of a later request within
``header_timeout_s`` of its first byte (until then the keep-alive timeout applies);
when they are not, the connection is answered ``408 Request Timeout`` and closed (as
nginx's ``client_header_timeout`` does). Bodies are bounded by
``SWITCHYARD_MAX_BODY_BYTES`` and the answer timeout.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("switchyard.ingress")


def _answer_408() -> bytes:
    body = b"the request headers were not complete in time\n"
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` that closes a connection whose request headers are not
    complete within :attr:`header_timeout_s` (see the module docstring)."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_message_begin(self) -> None:
        # A later request's first byte: its headers are timed from here (the first
        # request's from the connection).
        if self._header_timer is None:
            self._arm_header_timer()
        super().on_message_begin()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        log.info(
            "closed a connection from %s: its request headers were not complete within %g s",
            f"{self.client[0]}:{self.client[1]}" if self.client else "an unknown client",
            self.header_timeout_s,
            extra={"event": "header_timeout"},
        )
        self.transport.write(_answer_408())
        self.transport.close()


def header_timeout_protocol(header_timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's ``http`` option, with this timeout."""
    return type(
        "HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": header_timeout_s}
    )
