"""The placement service: the multi-model placement policy over the workers' heartbeats,
sending each worker the models to load and unload. Run it with
``python -m services.placement``; see :mod:`services.placement.service`.
"""

from __future__ import annotations

import asyncio

from switchyard.runtime.service import Service, ServiceContext
from switchyard.serving.catalogue import ServingCatalogue

from services.placement.service import PlacementService, placement_policy

__all__ = ["PlacementService", "create"]


async def create(ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> Service:
    """The placement service with ``SWITCHYARD_PLACEMENT_POLICY`` over the catalogue's
    models and pipelines (``catalogue``, or the one the settings name).

    Raises:
        ConfigError: an unknown policy, or a registry that cannot be read.
    """
    policy = placement_policy(ctx.settings.placement_policy)  # before the slow part
    if catalogue is None:
        from switchyard.serving.artifacts import settings_catalogue

        catalogue = await asyncio.to_thread(settings_catalogue, ctx.settings)
    return PlacementService(
        ctx, models=catalogue.models, pipelines=catalogue.pipelines, policy=policy
    )
