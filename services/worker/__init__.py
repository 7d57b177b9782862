"""The worker service: executes assigned requests and reports on them.

A worker holds a local queue (:mod:`services.worker.queue`), batches requests of the same
model (:mod:`services.worker.batching`), keeps models in a memory-budgeted cache
(:mod:`services.worker.model_cache`), and runs them through one backend interface
(:mod:`services.worker.backends`): the emulated LLM (modelled time of a named GPU and
model, labelled as emulation) or real torch models (classification variants and the tiny
language model). :mod:`services.worker.service` is the shell over the bus.

Importing this package does not import torch.
"""

from __future__ import annotations

import asyncio

from switchyard.config import Settings
from switchyard.runtime.service import Service, ServiceContext
from switchyard.serving import ServingCatalogue

from services.worker.backends import Backend, build_backend
from services.worker.service import WorkerService

__all__ = ["WorkerService", "build_backend_for", "create"]


async def build_backend_for(settings: Settings, catalogue: ServingCatalogue | None) -> Backend:
    """The backend ``settings`` ask for, built off the event loop (importing torch and
    reading the registry take a while). A torch backend without ``catalogue`` loads it
    (``SWITCHYARD_REGISTRY``, or the default registry in the cache); an emulated one
    needs none: it serves its profile's model."""
    if settings.worker_backend == "torch" and catalogue is None:
        from switchyard.serving.artifacts import load_catalogue

        catalogue = await asyncio.to_thread(load_catalogue, settings.registry, settings.cache_dir)
    return await asyncio.to_thread(build_backend, settings, catalogue)


async def create(ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> Service:
    """A worker for ``ctx``, its backend built from ``ctx.settings`` (and ``catalogue``,
    loaded when a torch worker is not given one)."""
    backend = await build_backend_for(ctx.settings, catalogue)
    return WorkerService(ctx, backend)
