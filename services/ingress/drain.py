"""Admission control for the drain: stop taking new calls, count the ones in flight.

A drain is announced before calls are refused: ``/healthz`` answers 503 from the
announcement, so a load balancer polling it takes the replica out while the replica still
takes what was already on its way (``SWITCHYARD_DRAIN_NOTICE_S`` apart).

:class:`AdmissionMiddleware` wraps the whole ASGI app, so a call counts as in flight
until its response is fully sent, streamed answers included.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

from services.ingress.errors import SERVER_ERROR, ApiError

RETRY_AFTER_S = 1
"""What ``Retry-After`` says when the ingress cannot take a call now."""

HEALTH_PATHS = ("/healthz", "/health")
"""Where the ingress answers its health: ``/healthz`` (Kubernetes' convention) and
``/health`` (vLLM's and SGLang's, which benchmark clients such as guidellm probe). Never
traced, and answered while draining: probes must see the drain, not a refusal."""


class Admission:
    """Whether new calls are accepted, and how many are in flight."""

    def __init__(self) -> None:
        self.accepting = True
        self.draining = False
        """Announced: health checks see the drain; calls may still be accepted."""
        self.in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def announce_drain(self) -> None:
        """From now on ``/healthz`` answers 503 draining; calls are still accepted."""
        self.draining = True

    def stop_accepting(self) -> None:
        """From now on new calls get 503 with ``Retry-After``."""
        self.draining = True
        self.accepting = False

    def enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0:
            self.in_flight = 0
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""
        await self._idle.wait()


def unavailable(message: str) -> ApiError:
    """A 503 telling the client to retry shortly."""
    return ApiError(
        503,
        message,
        type_=SERVER_ERROR,
        code="unavailable",
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


class AdmissionMiddleware:
    """Refuses new HTTP calls once draining and counts the calls in flight."""

    def __init__(self, app: ASGIApp, admission: Admission) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self.admission.accepting and scope.get("path") not in HEALTH_PATHS:
            refusal = unavailable("this ingress replica is draining; retry on another")
            await refusal.response()(scope, receive, send)
            return
        self.admission.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.admission.leave()
