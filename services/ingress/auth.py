"""The tenant of each call: its API key checked (401), its limits applied (429).

:class:`TenantMiddleware` runs before any route: it puts the call's
:class:`~services.ingress.tenants.Tenant` in the ASGI scope (:func:`tenant_of` reads it)
for every path under ``/v1/``; the health, metrics and OpenAPI paths need no key. An
inference call (a POST) of a tenant with limits is admitted by
:class:`~services.ingress.quotas.Quotas` first, holds its place until its answer is
sent, and its answer carries the ``x-ratelimit-*`` headers.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable

from opentelemetry import trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.ingress.drain import unavailable
from services.ingress.errors import ApiError
from services.ingress.quotas import Quotas
from services.ingress.tenants import ANONYMOUS, KeyRing, Tenant

_SCOPE_KEY = "switchyard.tenant"
_PROTECTED_PREFIX = "/v1/"


def tenant_of(scope: Scope) -> Tenant:
    """The tenant a call acts for (the anonymous one without API keys)."""
    tenant = scope.get(_SCOPE_KEY)
    return tenant if isinstance(tenant, Tenant) else ANONYMOUS


def unauthorized(message: str) -> ApiError:
    return ApiError(
        401,
        message,
        code="invalid_api_key",
        headers={"WWW-Authenticate": 'Bearer realm="switchyard"'},
    )


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            text = bytes(value).decode("latin-1")
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class TenantMiddleware:
    """Authenticates calls under ``/v1/`` and applies their tenant's limits.

    Args:
        app: the app to wrap.
        keys: the tenants' keys; None: auth off, every call is the anonymous tenant's.
        quotas: where the limits are kept; None: no limits.
        clock: epoch seconds.
    """

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyRing | None,
        quotas: Quotas | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.keys = keys
        self.quotas = quotas
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or self.keys is None
            or not str(scope.get("path", "")).startswith(_PROTECTED_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        key = _bearer(scope)
        tenant = self.keys.tenant_for(key) if key is not None else None
        if tenant is None:
            refusal = unauthorized(
                "missing API key: send Authorization: Bearer YOUR_KEY"
                if key is None
                else "incorrect API key provided"
            )
            await refusal.response()(scope, receive, send)
            return
        scope[_SCOPE_KEY] = tenant
        span = trace.get_current_span()
        if span.is_recording():
            # Who the call acted for; never the key.
            span.set_attribute("switchyard.tenant", str(tenant.name))
        if self.quotas is None or scope.get("method") != "POST" or not tenant.limits.limited:
            await self.app(scope, receive, send)
            return
        try:
            admission = await self.quotas.admit(tenant, uuid.uuid4().hex, self.clock())
        except ApiError as refused:
            await refused.response()(scope, receive, send)
            return
        except Exception as exc:
            await unavailable(f"the state store is unavailable: {exc}").response()(
                scope, receive, send
            )
            return
        extra = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in admission.headers.items()
        ]

        async def send_with_limits(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_limits)
        finally:
            # A place that cannot be given back now expires by itself.
            with contextlib.suppress(Exception):
                await self.quotas.release(tenant, admission)
