"""A Splitwise-style stage-aware router: separate prefill and decode pools.

Splitwise (ISCA 2024) runs the compute-bound prefill and the memory-bound decode on
different machines and ships the KV cache between them. Here a share of the workers
(``prefill_fraction``) forms the prefill pool; a new request goes to the prefill worker
with the shortest queue; when its prefill is done the shell asks :meth:`route_decode`
for the decode worker with the lowest KV-cache memory in use, and pays the transfer of
the prompt's KV cache over the interconnect before decoding starts there.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.policies.base import DecisionContext, NoWorkerError, Placement, pick_min
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerRole


def split_roles(workers: int, prefill_fraction: float) -> tuple[WorkerRole, ...]:
    """Roles for ``workers`` instances: the first ``round(n * fraction)`` (at least one,
    and at least one left for decode) prefill, the rest decode. One worker stays mixed."""
    if workers < 2:
        return (WorkerRole.MIXED,) * workers
    prefill = min(workers - 1, max(1, round(workers * prefill_fraction)))
    return (WorkerRole.PREFILL,) * prefill + (WorkerRole.DECODE,) * (workers - prefill)


@dataclass(frozen=True, slots=True)
class SplitwiseRouter:
    """Prefill by shortest queue, decode by lowest memory."""

    prefill_fraction: float = 0.25
    name: str = "splitwise"

    def __post_init__(self) -> None:
        if not 0.0 < self.prefill_fraction < 1.0:
            raise ValueError(f"prefill_fraction must be within (0, 1), got {self.prefill_fraction}")

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        best = pick_min(cluster.eligible(), lambda w: w.outstanding + w.queued_tokens * 1e-9)
        return Placement(best.worker_id, "prefill pool, shortest queue")

    def route_decode(
        self, request: RequestView, kv_tokens: int, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        pool = cluster.with_role(WorkerRole.DECODE) or cluster.with_role(WorkerRole.MIXED)
        if not pool:
            raise NoWorkerError("no live decode worker")
        roomy = tuple(w for w in pool if w.free_slots > 0 and w.kv_free_tokens >= kv_tokens)
        best = pick_min(roomy or pool, lambda w: w.kv_used_tokens / max(1, w.kv_capacity_tokens))
        return Placement(best.worker_id, "decode pool, lowest memory")
