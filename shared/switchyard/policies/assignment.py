"""The classic assignment baselines: round-robin, random, join-shortest-queue,
power-of-two-choices, and least predicted work.

Each is a tiny frozen class with an ``assign`` method (the :class:`AssignmentPolicy`
Protocol). Ties always go to the worker listed first in the snapshot, so a decision
depends on nothing but the snapshot and the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.policies.base import DecisionContext, NoWorkerError, Placement, pick_min
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerView


def service_estimate_s(request: RequestView, worker: WorkerView) -> float:
    """The calibrated service time of ``request`` on ``worker``'s type (0.0 unknown)."""
    return request.calibrated_s.get(worker.worker_type, 0.0)


def work_key(worker: WorkerView) -> float:
    """Predicted queued work, ties broken by the queue length: when predictions say
    every worker is free (all work done or overdue), the work still goes round."""
    return worker.queued_work_s + 1e-6 * worker.outstanding


@dataclass(frozen=True, slots=True)
class RoundRobin:
    """Worker ``sequence mod n``: blind to load, the simplest fair spread."""

    name: str = "round-robin"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        workers = cluster.eligible()
        if not workers:
            raise NoWorkerError("no live worker can take the request")
        return Placement(workers[ctx.sequence % len(workers)].worker_id, "next in turn")


@dataclass(frozen=True, slots=True)
class RandomChoice:
    """A uniformly random live worker."""

    name: str = "random"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        workers = cluster.eligible()
        if not workers:
            raise NoWorkerError("no live worker can take the request")
        return Placement(ctx.rng.choice(workers).worker_id, "random")


def _queue_key(worker: WorkerView) -> float:
    # Outstanding requests first; among equals, the one with less running.
    return worker.outstanding + worker.running * 1e-6


@dataclass(frozen=True, slots=True)
class JoinShortestQueue:
    """The worker with the fewest outstanding (waiting plus running) requests."""

    name: str = "jsq"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        return Placement(pick_min(cluster.eligible(), _queue_key).worker_id, "shortest queue")


@dataclass(frozen=True, slots=True)
class PowerOfTwoChoices:
    """Two workers drawn at random; the one with the shorter queue wins."""

    name: str = "power-of-two"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        workers = cluster.eligible()
        if len(workers) <= 2:
            return Placement(pick_min(workers, _queue_key).worker_id, "shorter of two")
        first, second = ctx.rng.sample(range(len(workers)), 2)
        pair = (workers[min(first, second)], workers[max(first, second)])
        return Placement(pick_min(pair, _queue_key).worker_id, "shorter of two")


@dataclass(frozen=True, slots=True)
class LeastPredictedWork:
    """The worker with the least predicted work queued, whatever the cluster's load."""

    name: str = "least-work"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        best = pick_min(cluster.eligible(), work_key)
        return Placement(best.worker_id, "least predicted work")


@dataclass(frozen=True, slots=True)
class LeastWorkPlusService:
    """Least queued work plus this request's service time on the worker, at any load.

    With exact service times this is the clairvoyant oracle's rule.
    """

    name: str = "least-work-plus-service"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        best = pick_min(cluster.eligible(), lambda w: work_key(w) + service_estimate_s(request, w))
        return Placement(best.worker_id, "least work plus service time")
