"""The worker service: executes assigned requests and reports on them.

A worker holds a local queue (:mod:`services.worker.queue`), batches requests of the same
model (:mod:`services.worker.batching`), keeps models in a memory-budgeted cache
(:mod:`services.worker.model_cache`), and runs them through one backend interface
(:mod:`services.worker.backends`): the emulated LLM (modelled time of a named GPU and
model, labelled as emulation), real torch models (classification variants and the tiny
language model), or the emulated multi-model node serving pipeline stages of the models
the placement service places on it (:mod:`services.worker.placement`, labelled as
emulation). :mod:`services.worker.service` is the shell over the bus.

Importing this package does not import torch.
"""

from __future__ import annotations

from switchyard.runtime.service import Service, ServiceContext
from switchyard.serving import ServingCatalogue

from services.worker.backends import build_backend_for
from services.worker.service import WorkerService

__all__ = ["WorkerService", "create"]


async def create(ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> Service:
    """A worker for ``ctx``, its backend built from ``ctx.settings`` (and ``catalogue``,
    loaded when a torch or emulated-models worker is not given one)."""
    backend = await build_backend_for(ctx.settings, catalogue)
    return WorkerService(ctx, backend)
