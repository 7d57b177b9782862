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

from dataclasses import dataclass, field
from operator import itemgetter

from switchyard.policies.base import DecisionContext, MigrationPlan, NoWorkerError, Placement
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
        if not workers:
            raise NoWorkerError("no live worker can take the request")
        # Both keys written out (this runs once per request): ties go to the earliest
        # worker in the snapshot, as pick_min's do.
        best = workers[0]
        if not self.config.use_global_work or cluster.utilization < (
            self.config.utilization_threshold
        ):
            # Outstanding requests, ties broken by the predicted work.
            best_key = best.waiting + best.running + best.queued_work_s * 1e-9
            for worker in workers:
                key = worker.waiting + worker.running + worker.queued_work_s * 1e-9
                if key < best_key:
                    best, best_key = worker, key
            return Placement(best.worker_id, "shortest queue (cluster below u_th)")
        # assignment.work_key plus assignment.service_estimate_s.
        estimates = request.calibrated_s
        best_key = (
            best.queued_work_s
            + 1e-6 * (best.waiting + best.running)
            + estimates.get(best.worker_type, 0.0)
        )
        for worker in workers:
            key = (
                worker.queued_work_s
                + 1e-6 * (worker.waiting + worker.running)
                + estimates.get(worker.worker_type, 0.0)
            )
            if key < best_key:
                best, best_key = worker, key
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
        config = self.config
        cluster = snapshot.cluster
        targets = cluster.eligible()
        if len(targets) < 2 or config.max_migrations == 0:
            return ()
        by_id = {w.worker_id: w for w in cluster.workers}
        work = {w.worker_id: w.queued_work_s for w in targets}
        mean_work_s = sum(work.values()) / len(work)
        now_s = cluster.now_s
        # Per source worker, once a round rather than once per request: _wait_s's
        # divisor, and whether the worker is overloaded.
        batch = {worker_id: max(1, by_id[worker_id].running) for worker_id in work}
        limit_s = config.overload_factor * mean_work_s
        overloaded = {worker_id: work_s > limit_s > 0 for worker_id, work_s in work.items()}

        # The candidates of each tier (urgent, overloaded, long) as (-finish_s, request).
        tiers: tuple[list[tuple[float, QueuedRequestView]], ...] = ([], [], [])
        urgent, loaded, long_running = tiers
        long_request_s = config.long_request_s
        waiting = RequestPhase.WAITING
        for queued in snapshot.queued:
            divisor = batch.get(queued.worker_id)
            if divisor is None or queued.phase is not waiting:
                continue
            finish_s = now_s + queued.work_ahead_s / divisor + queued.remaining_s
            deadline_s = queued.request.deadline_s
            if deadline_s is not None and finish_s > deadline_s:
                urgent.append((-finish_s, queued))
            elif overloaded[queued.worker_id]:
                loaded.append((-finish_s, queued))
            elif finish_s - now_s > long_request_s:
                long_running.append((-finish_s, queued))
        # The most pressing first: by tier, then the latest predicted finish, ties in
        # snapshot order (a stable sort per tier is the order heapq.nsmallest gave over
        # (tier, -finish_s)); later tiers are not even sorted once the first fill the list.
        candidates: list[tuple[QueuedRequestView, str]] = []
        for tier, why in zip(tiers, _WHY, strict=True):
            if len(candidates) >= config.max_candidates:
                break
            tier.sort(key=_FIRST)
            candidates.extend((queued, why) for _, queued in tier)
        del candidates[config.max_candidates :]

        plans: list[MigrationPlan] = []
        ranked = _RankedTargets(targets, work)
        for queued, why in candidates:
            if len(plans) >= config.max_migrations:
                break
            source = by_id[queued.worker_id]
            stay_s = queued.work_ahead_s / batch[source.worker_id] + queued.remaining_s
            target, move_s = ranked.best(queued.request, source.worker_id)
            there_s = queued.request.calibrated_s.get(target.worker_type, 0.0)
            cost_s = config.fixed_overhead_s + (
                queued.kv_tokens * source.kv_bytes_per_token / source.interconnect_bytes_per_s
            )
            gain_s = stay_s - move_s
            if gain_s <= cost_s or gain_s < config.min_gain_fraction * stay_s:
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
            ranked.rank()
        return tuple(plans)


_FIRST = itemgetter(0)
_FIRST_TWO = itemgetter(0, 1)
_WHY = (
    "urgent: predicted past its deadline",
    "on an overloaded worker",
    "long predicted completion",
)


class _RankedTargets:
    """The targets of a round ranked per worker type by their wait, so the best target
    for a request is found without scoring every worker.

    A target scores ``_wait_s(work, worker) + s~(its type)``. Within one type ``s~`` is
    the same for all, and rounded addition never reverses an order, so the type's
    best is at the head of its ranking: the first entry, or a later one whose score
    rounds to the same value and that comes earlier in the snapshot. That is exactly
    the worker ``pick_min`` over all the targets would return, ties included.
    """

    __slots__ = ("_by_type", "_targets", "_work")

    def __init__(self, targets: tuple[WorkerView, ...], work: dict[str, float]) -> None:
        self._targets = targets
        self._work = work
        self._by_type: dict[str, list[tuple[float, int, WorkerView]]] = {}
        self.rank()

    def rank(self) -> None:
        """Rank again after the work changed."""
        by_type: dict[str, list[tuple[float, int, WorkerView]]] = {}
        work = self._work
        for position, worker in enumerate(self._targets):
            wait_s = _wait_s(work[worker.worker_id], worker)
            by_type.setdefault(worker.worker_type, []).append((wait_s, position, worker))
        for entries in by_type.values():
            entries.sort(key=_FIRST_TWO)
        self._by_type = by_type

    def best(self, request: RequestView, source_id: str) -> tuple[WorkerView, float]:
        """The target other than ``source_id`` with the least wait plus ``s~``, and that
        score (first in the snapshot among equal scores)."""
        estimates = request.calibrated_s
        best: WorkerView | None = None
        best_s = 0.0
        best_position = 0
        for worker_type, entries in self._by_type.items():
            estimate_s = estimates.get(worker_type, 0.0)
            head: WorkerView | None = None
            head_s = 0.0
            head_position = 0
            for wait_s, position, worker in entries:
                if worker.worker_id == source_id:
                    continue
                score_s = wait_s + estimate_s
                if head is None:
                    head, head_s, head_position = worker, score_s, position
                elif score_s == head_s:
                    if position < head_position:
                        head, head_position = worker, position
                else:
                    break
            if head is not None and (
                best is None
                or head_s < best_s
                or (head_s == best_s and head_position < best_position)
            ):
                best, best_s, best_position = head, head_s, head_position
        if best is None:
            raise NoWorkerError("no live worker can take the request")
        return best, best_s
