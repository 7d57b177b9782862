"""Routers: between placement updates, which holder of a model serves a ready stage.

A router only ever answers a worker that holds the model at the snapshot (ready or still
loading), or ``None`` when none does (the stage waits, counted in
``PlacementSnapshot.waiting``). Ready holders always come before loading ones; a stage
is sent to a loading replica only when no replica is ready, and then queues there until
the load finishes. Ties go to the worker listed first in the snapshot.

Replicas on one worker run side by side (each holds its own resources and serves one
stage at a time), so the queue a stage joins is its model's replica's, not the whole
worker's: "work" below is that replica's predicted work,
``(queued + running) * exec_s / speed``, plus the seconds until it is ready.

- ``least-work``: the GAPS rule -- least predicted work ahead plus this stage's own
  service time ``exec_s / speed``. Example: a replica on a speed-2 worker with 3 stages
  of a 1 s model ahead has 3 * 0.5 + 0.5 = 2.0 s; an idle one on a speed-1 worker has
  0 + 1.0 = 1.0 s and wins.
- ``balanced-work``: among the holders within ``slack * exec_s`` of the least work, the
  one on the least busy worker (the adaptive policies' router).
- ``jsq``: fewest stages queued and running on the replica (faster worker on ties).
- ``round-robin``: the ``ctx.sequence``-th holder in turn.
- ``gaps``: the GAPS hybrid -- below a utilisation threshold (the mean ``utilization`` of
  the ready holders, default 0.3, as in the LLM GAPS policy) ``jsq``, above it
  ``least-work``.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.multimodel.snapshot import PlacementSnapshot, ResidentModel, WorkerState
from switchyard.policies.base import DecisionContext

__all__ = [
    "BalancedWorkRouter",
    "GapsHybridRouter",
    "JoinShortestQueueRouter",
    "LeastWorkRouter",
    "RoundRobinRouter",
    "holders",
]

Holder = tuple[WorkerState, ResidentModel]


def holders(model: str, snapshot: PlacementSnapshot) -> tuple[list[Holder], list[Holder]]:
    """``(ready, loading)`` holders of ``model``, each in snapshot order."""
    ready: list[Holder] = []
    loading: list[Holder] = []
    for worker in snapshot.workers:
        for resident in worker.resident:
            if resident.model == model:
                (ready if resident.ready_at_s <= snapshot.now_s else loading).append(
                    (worker, resident)
                )
                break
    return ready, loading


def _service_s(model: str, worker: WorkerState, snapshot: PlacementSnapshot) -> float:
    spec = snapshot.models.get(model)
    exec_s = spec.exec_s if spec is not None else 0.0
    return exec_s / worker.spec.speed if worker.spec.speed > 0 else float("inf")


def _work_key(model: str, holder: Holder, snapshot: PlacementSnapshot) -> tuple[float, float]:
    worker, resident = holder
    service = _service_s(model, worker, snapshot)
    wait_ready = max(0.0, resident.ready_at_s - snapshot.now_s)
    ahead = (max(0, resident.queued) + max(0, resident.running)) * service
    return (wait_ready + ahead + service, worker.queued_work_s)


def _least_work(model: str, snapshot: PlacementSnapshot) -> str | None:
    ready, loading = holders(model, snapshot)
    pool = ready or loading
    if not pool:
        return None
    best = min(pool, key=lambda holder: _work_key(model, holder, snapshot))
    return best[0].spec.worker_id


def _jsq(model: str, snapshot: PlacementSnapshot) -> str | None:
    ready, loading = holders(model, snapshot)
    pool = ready or loading
    if not pool:
        return None

    def key(holder: Holder) -> tuple[int, float, float]:
        worker, resident = holder
        return (
            max(0, resident.queued) + max(0, resident.running),
            max(0.0, resident.ready_at_s - snapshot.now_s),
            -worker.spec.speed,
        )

    return min(pool, key=key)[0].spec.worker_id


@dataclass(frozen=True, slots=True)
class LeastWorkRouter:
    """The holder with the least predicted work ahead plus ``exec_s / speed``."""

    name: str = "least-work"

    def route(self, model: str, snapshot: PlacementSnapshot, ctx: DecisionContext) -> str | None:
        return _least_work(model, snapshot)


@dataclass(frozen=True, slots=True)
class BalancedWorkRouter:
    """Least work within a slack, then the least busy worker.

    Among the holders (ready first, as every router) whose predicted completion --
    ``least-work``'s key, work ahead plus this stage's service -- is within ``slack``
    times the model's speed-1 ``exec_s`` of the best one, the holder on the worker with
    the lowest ``utilization`` (busy share over the last update) wins; ties go to less
    work. A stage thus waits at most ``slack * exec_s`` longer than under ``least-work``,
    and an idle slow replica is used instead of always queueing behind the fast
    workers, so the busy share of fast and slow workers evens out. Example: a 1 s model
    idle on a speed-2 worker at utilisation 0.4 (0.5 s) and idle on a speed-1 worker
    at 0.1 (1.0 s): within the default slack of 2 s both qualify and the speed-1 worker
    wins.
    """

    slack: float = 2.0
    name: str = "balanced-work"

    def __post_init__(self) -> None:
        if not self.slack >= 0.0:
            raise ValueError(f"slack must be >= 0, got {self.slack}")

    def route(self, model: str, snapshot: PlacementSnapshot, ctx: DecisionContext) -> str | None:
        ready, loading = holders(model, snapshot)
        pool = ready or loading
        if not pool:
            return None
        keys = [_work_key(model, holder, snapshot)[0] for holder in pool]
        spec = snapshot.models.get(model)
        limit = min(keys) + self.slack * (spec.exec_s if spec is not None else 0.0) + 1e-12
        best = min(
            (i for i in range(len(pool)) if keys[i] <= limit),
            key=lambda i: (pool[i][0].utilization, keys[i]),
        )
        return pool[best][0].spec.worker_id


@dataclass(frozen=True, slots=True)
class JoinShortestQueueRouter:
    """The holder with the fewest stages queued and running for the model."""

    name: str = "jsq"

    def route(self, model: str, snapshot: PlacementSnapshot, ctx: DecisionContext) -> str | None:
        return _jsq(model, snapshot)


@dataclass(frozen=True, slots=True)
class RoundRobinRouter:
    """Holder ``ctx.sequence mod n``: blind to load."""

    name: str = "round-robin"

    def route(self, model: str, snapshot: PlacementSnapshot, ctx: DecisionContext) -> str | None:
        ready, loading = holders(model, snapshot)
        pool = ready or loading
        if not pool:
            return None
        return pool[ctx.sequence % len(pool)][0].spec.worker_id


@dataclass(frozen=True, slots=True)
class GapsHybridRouter:
    """Join-shortest-queue while the model's ready holders are lightly used (mean
    ``utilization`` below ``utilization_threshold``), least predicted work above."""

    utilization_threshold: float = 0.3
    name: str = "gaps"

    def __post_init__(self) -> None:
        if not 0.0 <= self.utilization_threshold <= 1.0:
            raise ValueError(
                f"utilization_threshold must be within [0, 1], got {self.utilization_threshold}"
            )

    def route(self, model: str, snapshot: PlacementSnapshot, ctx: DecisionContext) -> str | None:
        ready, _ = holders(model, snapshot)
        if ready:
            mean_util = sum(worker.utilization for worker, _ in ready) / len(ready)
            if mean_util < self.utilization_threshold:
                return _jsq(model, snapshot)
        return _least_work(model, snapshot)
