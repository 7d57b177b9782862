"""The replay's target: the ingress base URL, checked before the replay starts.

:func:`normalise_target` turns ``--target`` into a base URL without a trailing slash and
refuses anything but an ``http://`` or ``https://`` URL with a host;
:func:`check_reachable` opens (and closes) one TCP connection to it. Both raise
:class:`TargetError`, whose one-line message is what the command line prints.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx

__all__ = [
    "TargetError",
    "check_reachable",
    "normalise_target",
]


class TargetError(ValueError):
    """The target URL is malformed or cannot be reached; the one-line message says why."""


def normalise_target(target: str) -> str:
    """The target as a base URL without a trailing slash.

    Raises:
        TargetError: not an ``http://`` or ``https://`` URL with a host.
    """
    text = target.strip().rstrip("/")
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as exc:
        raise TargetError(f"--target: not a URL: {target!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise TargetError(
            f"--target: expected an http:// or https:// URL with a host, got {target!r}"
        )
    return text


async def check_reachable(target: str, timeout_s: float = 3.0) -> None:
    """Open (and close) one TCP connection to the target's host and port.

    Raises:
        TargetError: the URL is malformed, or nothing accepts a connection there within
            ``timeout_s``.
    """
    url = httpx.URL(normalise_target(target))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(url.host, port), timeout_s)
    except TimeoutError:
        raise TargetError(
            f"cannot reach the target {target}: no connection within {timeout_s:g} s"
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise TargetError(f"cannot reach the target {target}: {reason}") from None
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
