"""The ingress: Switchyard's HTTP front door.

An OpenAI-compatible API (``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``), classification inference (``/v1/apps/{app}/infer``, ``/v1/apps``),
request status from the state store (``/v1/requests/{id}``), ``/openapi.json`` and
``/healthz``. It validates, refuses what the cluster cannot serve in time (429 or 503
with ``Retry-After``), publishes each request to ``switchyard.requests`` and waits for
the completion routed back to it (``reply_to`` = its instance id).

Modules: :mod:`~services.ingress.api` (the Starlette app), :mod:`~.service` (the
service shell: uvicorn and the answer routines), :mod:`~.answers` (waiters),
:mod:`~.records` (request records in the state store), :mod:`~.openai_schema` (request
validation), :mod:`~.responses` (answer bodies), :mod:`~.openapi`, :mod:`~.tokens`,
:mod:`~.drain` (the drain), :mod:`~.load_shedding` (deadline-aware admission control),
:mod:`~.errors`.

The ingress imports neither torch, scikit-learn nor faiss: it starts fast and its image
stays small.
"""

from __future__ import annotations

import asyncio

from switchyard.runtime.service import Service, ServiceContext
from switchyard.serving import ServingCatalogue

__all__ = ["create"]


async def create(ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> Service:
    """The ingress service for ``ctx``.

    Args:
        ctx: the service context.
        catalogue: what is served; when None it is loaded (in a thread) from
            ``ctx.settings.registry``, or the default registry under
            ``ctx.settings.cache_dir``.
    """
    from services.ingress.service import IngressService

    if catalogue is None:
        from switchyard.serving.artifacts import load_catalogue

        settings = ctx.settings
        catalogue = await asyncio.to_thread(load_catalogue, settings.registry, settings.cache_dir)
    return IngressService(ctx, catalogue)
