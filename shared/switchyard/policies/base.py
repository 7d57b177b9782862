"""The policy families for LLM scheduling: one Protocol each, and their decisions.

Every policy is synchronous and pure over what it is given: a frozen snapshot, the
request in question and a :class:`DecisionContext` holding the only randomness and the
only memory (a decision counter) it may use. The simulator and the live scheduler call
the very same objects.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueueScope,
    RebalanceSnapshot,
    RequestView,
    WorkerView,
)


class NoWorkerError(RuntimeError):
    """No live worker can take the request (every one is down or in the wrong pool)."""


@dataclass(frozen=True, slots=True)
class DecisionContext:
    """What a policy may use besides the snapshot.

    ``rng`` is the one source of randomness (seeded by the caller); ``sequence`` counts
    the decisions this caller made before this one (round-robin reads it).
    """

    rng: random.Random
    sequence: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a request goes: the worker that admits it."""

    worker_id: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class MigrationPlan:
    """Move one request to another worker, because the expected gain beats the cost."""

    request_id: str
    from_worker_id: str
    to_worker_id: str
    expected_gain_s: float
    cost_s: float
    kv_tokens: int
    reason: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """An admission policy's no: the request is not taken, and why."""

    reason: str


class AdmissionPolicy(Protocol):
    """Decides, before any worker is chosen, whether a request is taken at all.

    A refused request is answered at once and counts as a miss of its SLO; what it
    spares is the capacity it would have taken from requests that can still be on time.
    """

    @property
    def name(self) -> str: ...

    def admit(self, request: RequestView, cluster: ClusterSnapshot) -> Refusal | None:
        """None to take the request; a :class:`Refusal` saying why not."""
        ...


class AssignmentPolicy(Protocol):
    """Chooses the worker for a new request."""

    @property
    def name(self) -> str: ...

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement: ...


@runtime_checkable
class DecodeRouter(Protocol):
    """Stage-aware policies: chooses the decode worker once a prefill finished."""

    def route_decode(
        self, request: RequestView, kv_tokens: int, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement: ...


class RebalancePolicy(Protocol):
    """Decides which queued or running requests move, and when it wants to be asked."""

    @property
    def name(self) -> str: ...

    @property
    def period_s(self) -> float:
        """How often the shell runs it; ``0`` means only on a violation spike."""
        ...

    @property
    def queue_scope(self) -> QueueScope:
        """Which queued requests its snapshot must list."""
        ...

    def spike(self, recent_slo_violation_rate: float) -> bool:
        """Whether the shell should run it now, before the next period."""
        ...

    def plan(self, snapshot: RebalanceSnapshot, ctx: DecisionContext) -> tuple[MigrationPlan, ...]:
        """Migrations to carry out now (possibly none)."""
        ...


def pick_min(workers: tuple[WorkerView, ...], key: Callable[[WorkerView], float]) -> WorkerView:
    """The worker with the smallest key; ties go to the earliest in the snapshot, so a
    decision never depends on anything but the snapshot's order."""
    if not workers:
        raise NoWorkerError("no live worker can take the request")
    best = workers[0]
    best_key = key(best)
    for worker in workers[1:]:
        value = key(worker)
        if value < best_key:
            best, best_key = worker, value
    return best
