"""One raw HTTP/1.1 exchange over loopback, for tests of the runtime's own small server."""

from __future__ import annotations

import asyncio

WAIT_S = 10.0


async def raw_http(port: int, raw: bytes, *, eof: bool = False) -> tuple[str, bytes]:
    """Send ``raw`` to ``127.0.0.1:port`` (then close the sending side when ``eof``: a
    client that gives up half-way) and read until the server closes; returns the head
    (status line and headers, decoded) and the body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        if eof:
            writer.write_eof()
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), WAIT_S)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    return head.decode("latin-1"), body
