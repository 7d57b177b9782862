"""GAPS: prediction-driven, globally aware assignment and selective rebalancing.

Assignment is a hybrid. While the cluster's mean utilisation is below ``u_th`` every
worker has room, so the cheapest good answer is join-shortest-queue. Above it, queue
lengths lie (ten short requests are less work than one long one), so GAPS picks the
worker minimising ``queued_work_s + s~``: the predicted seconds of work already there
plus this request's calibrated service time on that worker's type.

Rebalancing runs every ``period_s`` and at once when the recent SLO-violation rate
spikes. It looks at waiting requests that are urgent (predicted to finish after their
adaptive deadline), on an overloaded worker, or facing a long predicted completion, and
moves one only when the expected gain beats the migration cost::

    wait_s(worker)   = work ahead on it / max(1, its running batch)   # batching drains in parallel
    gain_s           = (wait_s(src) + remaining_s(src)) - (wait_s(dst) + s~(dst))
    cost_s           = fixed_overhead_s + kv_bytes / interconnect_bytes_per_s
    migrate iff gain_s > cost_s  and  gain_s >= min_gain_fraction * stay_s

where ``stay_s = wait_s(src) + remaining_s(src)``. Only the ``max_candidates`` most
pressing candidates are weighed in a round, so its cost is bounded.

Worked number: 6 s of work ahead on a worker running 3 requests, a 1.5 s request, and
an idle target of the same type: gain = (2 + 1.5) - (0 + 1.5) = 2 s > 0.05 s, and 2 s
is 57 % of the 3.5 s it would take where it is (>= 20 %), so it moves.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from switchyard.policies.assignment import service_estimate_s, work_key
from switchyard.policies.base import DecisionContext, MigrationPlan, Placement, pick_min
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueuedRequestView,
    QueueScope,
    RebalanceSnapshot,
    RequestPhase,
    RequestView,
    WorkerView,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class GapsAssignmentConfig:
    utilization_threshold: float = 0.3
    """``u_th``: below it join-shortest-queue, above it least predicted work plus ``s~``."""
    use_global_work: bool = True
    """False for the gaps-noglobal ablation: always join-shortest-queue."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.utilization_threshold <= 1.0:
            raise ValueError(
                f"utilization_threshold must be within [0, 1], got {self.utilization_threshold}"
            )


@dataclass(frozen=True, slots=True)
class GapsAssignment:
    """The hybrid assignment of GAPS (see the module docstring)."""

    config: GapsAssignmentConfig = field(default_factory=GapsAssignmentConfig)
    name: str = "gaps"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        workers = cluster.eligible()
        if not self.config.use_global_work or cluster.utilization < (
            self.config.utilization_threshold
        ):
            best = pick_min(workers, lambda w: w.outstanding + w.queued_work_s * 1e-9)
            return Placement(best.worker_id, "shortest queue (cluster below u_th)")
        best = pick_min(workers, lambda w: work_key(w) + service_estimate_s(request, w))
        return Placement(best.worker_id, "least predicted work plus s~")


@dataclass(frozen=True, slots=True, kw_only=True)
class GapsRebalanceConfig:
    period_s: float = 1.0
    spike_violation_rate: float = 0.2
    """Run at once when at least this share of recent completions missed their SLO."""
    fixed_overhead_s: float = 0.05
    """Cost of any migration besides moving KV cache: cancel, re-route, re-admit."""
    overload_factor: float = 1.5
    """A worker is overloaded when its queued work exceeds this times the cluster mean."""
    long_request_s: float = 10.0
    """Predicted completion (from now) above which a request is a candidate anyway."""
    max_migrations: int = 16
    """At most this many moves per round, so one round cannot thrash the cluster."""
    queue_tail: int = 32
    """Waiting requests of each worker the snapshot lists: the last this-many."""
    max_candidates: int = 128
    """At most this many candidates, the most pressing first, are weighed per round: the
    round's cost stays bounded however long the queues grow."""
    min_gain_fraction: float = 0.2
    """Hysteresis: a move must also save this share of the time the request would take
    where it is. Without it, estimates that differ by noise swap requests back and forth."""

    def __post_init__(self) -> None:
        for name in ("period_s", "fixed_overhead_s", "long_request_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_migrations", "max_candidates", "queue_tail"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.min_gain_fraction < 1.0:
            raise ValueError(
                f"min_gain_fraction must be within [0, 1), got {self.min_gain_fraction}"
            )


def _wait_s(work_ahead_s: float, worker: WorkerView) -> float:
    return work_ahead_s / max(1, worker.running)


@dataclass(frozen=True, slots=True)
class GapsRebalancer:
    """Selective, cost-aware migration of waiting requests (see the module docstring)."""

    config: GapsRebalanceConfig = field(default_factory=GapsRebalanceConfig)
    name: str = "gaps-rebalance"

    @property
    def period_s(self) -> float:
        return self.config.period_s

    @property
    def queue_scope(self) -> QueueScope:
        # Waiting requests only, and of each queue its tail: along a FIFO queue the
        # predicted completion only grows, so the tail holds the most pressing ones.
        return QueueScope(waiting_tail=self.config.queue_tail, running=False)

    def spike(self, recent_slo_violation_rate: float) -> bool:
        return recent_slo_violation_rate >= self.config.spike_violation_rate

    def plan(self, snapshot: RebalanceSnapshot, ctx: DecisionContext) -> tuple[MigrationPlan, ...]:
        cluster = snapshot.cluster
        targets = cluster.eligible()
        if len(targets) < 2 or self.config.max_migrations == 0:
            return ()
        by_id = {w.worker_id: w for w in cluster.workers}
        work = {w.worker_id: w.queued_work_s for w in targets}
        mean_work_s = sum(work.values()) / len(work)
        now_s = cluster.now_s

        candidates: list[tuple[int, float, QueuedRequestView, str]] = []
        for queued in snapshot.queued:
            if queued.phase is not RequestPhase.WAITING or queued.worker_id not in work:
                continue
            source = by_id[queued.worker_id]
            finish_s = now_s + _wait_s(queued.work_ahead_s, source) + queued.remaining_s
            deadline_s = queued.request.deadline_s
            if deadline_s is not None and finish_s > deadline_s:
                candidates.append((0, -finish_s, queued, "urgent: predicted past its deadline"))
            elif work[queued.worker_id] > self.config.overload_factor * mean_work_s > 0:
                candidates.append((1, -finish_s, queued, "on an overloaded worker"))
            elif finish_s - now_s > self.config.long_request_s:
                candidates.append((2, -finish_s, queued, "long predicted completion"))
        candidates = heapq.nsmallest(
            self.config.max_candidates, candidates, key=lambda c: (c[0], c[1])
        )

        plans: list[MigrationPlan] = []
        for _, _, queued, why in candidates:
            if len(plans) >= self.config.max_migrations:
                break
            source = by_id[queued.worker_id]
            stay_s = _wait_s(queued.work_ahead_s, source) + queued.remaining_s
            others = tuple(w for w in targets if w.worker_id != source.worker_id)
            target = pick_min(
                others,
                lambda w, r=queued.request: (
                    _wait_s(work[w.worker_id], w)  # type: ignore[misc]
                    + service_estimate_s(r, w)
                ),
            )
            there_s = service_estimate_s(queued.request, target)
            move_s = _wait_s(work[target.worker_id], target) + there_s
            cost_s = self.config.fixed_overhead_s + (
                queued.kv_tokens * source.kv_bytes_per_token / source.interconnect_bytes_per_s
            )
            gain_s = stay_s - move_s
            if gain_s <= cost_s or gain_s < self.config.min_gain_fraction * stay_s:
                continue
            plans.append(
                MigrationPlan(
                    request_id=queued.request.request_id,
                    from_worker_id=source.worker_id,
                    to_worker_id=target.worker_id,
                    expected_gain_s=gain_s,
                    cost_s=cost_s,
                    kv_tokens=queued.kv_tokens,
                    reason=why,
                )
            )
            # Later candidates see the moves already planned, so a round never piles
            # every request onto the same idle worker.
            work[source.worker_id] -= queued.remaining_s
            work[target.worker_id] += there_s
        return tuple(plans)
