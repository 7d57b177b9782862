"""A Llumnix-style reactive global balancer: no prediction, load from current usage.

Llumnix (OSDI 2024) places a request on the instance with the lowest *virtual usage*
(KV-cache memory in use plus what queued requests will need) and periodically
live-migrates running requests from the most to the least loaded instance, paying the
KV-cache transfer. This module keeps those two mechanisms and leaves out what the
simulator cannot express (priorities, instance auto-scaling, the overlap of migration
with decoding: here a migration pauses the request for its whole cost).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from switchyard.policies.base import DecisionContext, MigrationPlan, Placement, pick_min
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    QueueScope,
    RebalanceSnapshot,
    RequestPhase,
    RequestView,
    WorkerView,
)


def virtual_usage(worker: WorkerView) -> float:
    """KV tokens held plus prompt tokens waiting, over the KV capacity (may exceed 1)."""
    return worker.queued_tokens / max(1, worker.kv_capacity_tokens)


@dataclass(frozen=True, slots=True)
class LlumnixAssignment:
    """The instance with the lowest virtual usage."""

    name: str = "llumnix"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        return Placement(pick_min(cluster.eligible(), virtual_usage).worker_id, "lowest usage")


@dataclass(frozen=True, slots=True, kw_only=True)
class LlumnixRebalanceConfig:
    period_s: float = 0.5
    imbalance: float = 0.25
    """Migrate while the usage gap between the most and least loaded exceeds this."""
    fixed_overhead_s: float = 0.02
    max_migrations: int = 4

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {self.period_s}")
        if self.imbalance < 0:
            raise ValueError(f"imbalance must be >= 0, got {self.imbalance}")


@dataclass(frozen=True, slots=True)
class LlumnixRebalancer:
    """Moves running requests, shortest KV first, from the most to the least loaded."""

    config: LlumnixRebalanceConfig = field(default_factory=LlumnixRebalanceConfig)
    name: str = "llumnix-migrate"

    @property
    def period_s(self) -> float:
        return self.config.period_s

    @property
    def queue_scope(self) -> QueueScope:
        return QueueScope(waiting_tail=0, running=True)  # it moves running requests only

    def spike(self, recent_slo_violation_rate: float) -> bool:
        return False  # purely periodic, like the published system

    def plan(self, snapshot: RebalanceSnapshot, ctx: DecisionContext) -> tuple[MigrationPlan, ...]:
        workers = snapshot.cluster.eligible()
        if len(workers) < 2:
            return ()
        usage = {w.worker_id: float(w.queued_tokens) for w in workers}
        capacity = {w.worker_id: max(1, w.kv_capacity_tokens) for w in workers}
        by_id = {w.worker_id: w for w in workers}
        running: dict[str, list[tuple[int, str]]] = {}
        for queued in snapshot.queued:
            if queued.phase is RequestPhase.RUNNING and queued.worker_id in usage:
                running.setdefault(queued.worker_id, []).append(
                    (queued.kv_tokens, queued.request.request_id)
                )
        for items in running.values():
            items.sort(reverse=True)  # popped from the end: shortest first

        plans: list[MigrationPlan] = []
        added: dict[str, int] = {}
        while len(plans) < self.config.max_migrations:
            ratio = {wid: usage[wid] / capacity[wid] for wid in usage}
            source_id = max(ratio, key=lambda wid: ratio[wid])
            target_id = min(ratio, key=lambda wid: ratio[wid])
            if ratio[source_id] - ratio[target_id] <= self.config.imbalance:
                break
            if not running.get(source_id):
                break
            kv_tokens, request_id = running[source_id].pop()
            target = by_id[target_id]
            if kv_tokens > target.kv_free_tokens - added.get(target_id, 0):
                break
            source = by_id[source_id]
            cost_s = self.config.fixed_overhead_s + (
                kv_tokens * source.kv_bytes_per_token / source.interconnect_bytes_per_s
            )
            plans.append(
                MigrationPlan(
                    request_id=request_id,
                    from_worker_id=source_id,
                    to_worker_id=target_id,
                    expected_gain_s=0.0,  # no prediction: Llumnix balances load, not time
                    cost_s=cost_s,
                    kv_tokens=kv_tokens,
                    reason="load imbalance",
                )
            )
            usage[source_id] -= kv_tokens
            usage[target_id] += kv_tokens
            added[target_id] = added.get(target_id, 0) + kv_tokens
        return tuple(plans)
