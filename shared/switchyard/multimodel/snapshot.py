"""What a multi-model policy sees and decides.

Every update (``1 / update_hz`` seconds, and on a large state change) the shell builds a
:class:`PlacementSnapshot` -- the state ``s_t = [m_t, r_t, q_t]``: which models are
resident or loading where (``m_t``), each worker's free resources (``r_t``), and the
queues (``q_t``) -- and asks a :class:`PlacementPolicy` for a :class:`PlacementPlan`.
Between updates a :class:`Router` sends each ready stage of a request to a worker where
its model is resident. Policies are pure and synchronous; no I/O, clock or global
state; randomness only from the ``DecisionContext``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from switchyard.multimodel.model import ModelSpec, PipelineSpec, ResourceVector, WorkerSpec
from switchyard.policies.base import DecisionContext

__all__ = [
    "PlacementPlan",
    "PlacementPolicy",
    "PlacementSnapshot",
    "ResidentModel",
    "Router",
    "WorkerState",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidentModel:
    """A model placed on a worker: loading until ``ready_at_s``, then serving."""

    model: str
    ready_at_s: float
    queued: int
    """Requests (stages) waiting for it on this worker."""
    running: int
    """Requests it is serving now (at most one per replica; see the simulator)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerState:
    """One worker at the snapshot: its spec, what is placed on it, what is free."""

    spec: WorkerSpec
    resident: tuple[ResidentModel, ...]
    free: ResourceVector
    """Capacity minus the resources of every resident (and loading) model."""
    queued_work_s: float
    """Predicted seconds of work queued and running on it (service times / speed)."""
    utilization: float
    """Time-average busy share over the last update interval, 0..1."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementSnapshot:
    """The state ``s_t`` a placement policy decides on."""

    now_s: float
    workers: tuple[WorkerState, ...]
    models: Mapping[str, ModelSpec]
    pipelines: Mapping[str, PipelineSpec]
    demand_rps: Mapping[str, float]
    """Recent request rate per model (stage invocations per second, smoothed)."""
    waiting: Mapping[str, int]
    """Stages waiting per model with no worker holding the model (unroutable)."""


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """Loads and evictions to carry out now. Evictions happen first; a load must fit in
    the worker's free resources after them (the shell checks and refuses, by name, a
    plan that would overflow a worker). A model being evicted finishes the request it
    is serving; its queued stages go back to be routed again."""

    load: tuple[tuple[str, str], ...] = ()
    """(worker_id, model) pairs to load."""
    evict: tuple[tuple[str, str], ...] = ()
    """(worker_id, model) pairs to remove."""
    cost_s: float = 0.0
    """The policy's own estimate of the decision's running cost ``alpha*D + beta*U``."""


class PlacementPolicy(Protocol):
    """Decides placement at each update."""

    @property
    def name(self) -> str: ...

    def place(self, snapshot: PlacementSnapshot, ctx: DecisionContext) -> PlacementPlan: ...


class Router(Protocol):
    """Chooses, for one ready stage, a worker where its model is resident (or ``None``
    to keep it waiting)."""

    def route(
        self, model: str, snapshot: PlacementSnapshot, ctx: DecisionContext
    ) -> str | None: ...
