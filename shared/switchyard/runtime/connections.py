"""Reaching a service's bus and state store at start, and letting go of them at exit.

:func:`connect` retries (with :func:`backoff_s`, which supervised routines use too) what
a fresh deployment needs time for (a broker that starts
after the service) within a deadline and turns a failure into one :class:`StartError`
line naming the address (passwords left out); :func:`close_connections` bounds each
closing step, so one broken connection does not keep the others open.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit, urlunsplit

from switchyard.config import Settings
from switchyard.errors import is_retriable

if TYPE_CHECKING:
    from switchyard.bus import Bus
    from switchyard.state import StateStore
    from switchyard.telemetry import Telemetry


class Connected(Protocol):
    """What connecting and closing need of a service's context
    (:class:`~switchyard.runtime.service.ServiceContext` has it)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def bus(self) -> Bus: ...
    @property
    def state(self) -> StateStore: ...
    @property
    def telemetry(self) -> Telemetry: ...
    @property
    def logger(self) -> logging.Logger: ...


_BACKOFF_INITIAL_S = 0.1
_BACKOFF_MAX_S = 5.0


def backoff_s(attempt: int) -> float:
    """Delay before retry ``attempt`` (1-based): 0.1 s, 0.2 s, 0.4 s … capped at 5 s."""
    return min(_BACKOFF_MAX_S, _BACKOFF_INITIAL_S * 2.0 ** min(attempt - 1, 32))


def redact_url(url: str) -> str:
    """``url`` without its password, fit for a log line."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _bus_address(settings: Settings) -> str:
    if settings.bus == "kafka":
        return f"Kafka at {settings.kafka_bootstrap}"
    return "the in-memory bus"


def _state_address(settings: Settings) -> str:
    if settings.state == "redis":
        return f"Redis at {redact_url(settings.redis_url)}"
    return "the in-memory state store"


class StartError(Exception):
    """Starting failed; the message is the one line to show."""


async def connect(ctx: Connected, timeout_s: float) -> None:
    """Start the bus and reach the state store, retrying retriable errors with backoff for
    up to ``timeout_s``: in a fresh deployment the broker may start after the service."""
    deadline_s = time.monotonic() + timeout_s
    steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
        (_bus_address(ctx.settings), ctx.bus.start),
        (_state_address(ctx.settings), ctx.state.ping),
    ]
    for address, step in steps:
        attempt = 0
        while True:
            attempt += 1
            left_s = deadline_s - time.monotonic()
            try:
                await asyncio.wait_for(step(), max(left_s, 0.01))
                break
            except TimeoutError as exc:
                error: Exception = exc
            except Exception as exc:
                if not is_retriable(exc):
                    raise StartError(f"could not connect to {address}: {exc}") from exc
                error = exc
            left_s = deadline_s - time.monotonic()
            if left_s <= 0:
                detail = str(error) or type(error).__name__
                raise StartError(
                    f"could not connect to {address} within {timeout_s:g} s: {detail}"
                ) from error
            delay_s = min(backoff_s(attempt), left_s)
            ctx.logger.warning(
                "waiting for %s (retry in %.1f s): %s",
                address,
                delay_s,
                error,
                extra={"event": "connect-retry", "address": address, "attempt": attempt},
            )
            await asyncio.sleep(delay_s)


async def close_connections(ctx: Connected, *, step_timeout_s: float) -> None:
    """Stop the bus, close the state store, flush telemetry: each step bounded and
    independent, so one broken connection does not keep the others open."""
    log = ctx.logger
    for what, step in (("stopping the bus", ctx.bus.stop), ("closing state", ctx.state.close)):
        try:
            await asyncio.wait_for(step(), step_timeout_s)
        except Exception as exc:
            log.warning("%s failed: %s", what, exc or type(exc).__name__)
    try:
        ctx.telemetry.shutdown()
    except Exception as exc:
        log.warning("flushing telemetry failed: %s", exc)
