"""The messages of multi-model placement: what a worker holds, and what the placer orders.

A worker of the ``emulated-models`` backend serves the registry's multi-model
``models`` (the stages of pipelines). Its heartbeat lists each model placed on it as a
:class:`PlacedModel`; the placement service runs the registered placement policy over
those heartbeats and sends each worker whose placement changes one
:class:`PlacementOrder` (on the worker's own partition of ``switchyard.worker-inbox``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, NonNegativeFloat, NonNegativeInt

from switchyard.contracts.base import Message
from switchyard.contracts.fields import Identifier, Part

__all__ = ["PlacedModel", "PlacedState", "PlacementOrder"]


class PlacedState(StrEnum):
    """Where a placed model is in its life on a worker."""

    LOADING = "loading"
    """Being loaded: it holds its resources already and serves once loaded."""
    READY = "ready"
    """Loaded and serving."""
    DRAINING = "draining"
    """Told to unload: it takes nothing new from the router, finishes what it holds
    (queued and running), then gives its resources back."""


class PlacedModel(Part):
    """One model placed on a worker, as its heartbeat reports it."""

    model: Identifier
    state: PlacedState
    ready_in_s: NonNegativeFloat = Field(
        default=0.0,
        description="Wall seconds until it is loaded (0 once ready): the load time left.",
    )
    age_s: NonNegativeFloat = Field(
        default=0.0,
        description="Wall seconds since its load started (placement policies keep a "
        "replica a minimum time from then).",
    )
    queued: NonNegativeInt = 0
    """Stages waiting for it on this worker."""
    running: NonNegativeInt = 0
    """Stages it is serving now."""
    served_total: NonNegativeInt = 0
    """Stages it has finished on this worker since it was loaded."""


class PlacementOrder(Message):
    """The placer's decision for one worker: models to unload, then models to load.

    Unloads come first: each drains (finishes what it holds) before its resources are
    free. A load must fit in what the worker has free once the unloads are done; the
    worker refuses, by name, one that would not, so the models placed on a worker never
    need more than its resource vector.
    """

    MESSAGE_TYPE = "placement-order"

    worker_id: Identifier
    load: Annotated[list[Identifier], Field(max_length=256)] = Field(default_factory=list)
    unload: Annotated[list[Identifier], Field(max_length=256)] = Field(default_factory=list)
    policy: Identifier
    plan_id: Identifier
    decided_at_s: float
