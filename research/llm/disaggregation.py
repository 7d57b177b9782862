"""Prefill/decode disaggregation as a cluster option: any policy over two pools.

DistServe (Zhong et al., OSDI 2024), Splitwise (Patel et al., ISCA 2024) and Dynamo's
disaggregated serving run a request's prefill on one set of workers and its decode on
another, and move the prompt's KV cache between them. With
``SimulationConfig.prefill_workers`` set, the simulator's first ``prefill_workers``
workers form the prefill pool (:attr:`WorkerRole.PREFILL`) and the rest the decode
pool (:attr:`WorkerRole.DECODE`), and every registered assignment policy runs on them
unchanged, deciding twice per request:

1. on arrival it is shown a snapshot of the prefill pool only, and places the request
   there (the admission policy, if any, is asked over the same snapshot);
2. when the prefill ends, with the first token (unless that token was the answer's
   only one: it ends on its prefill worker), it is asked again, over a snapshot of
   the decode pool only, with the request's view marked as bringing its KV cache:
   ``cached_tokens`` holds the whole prompt for every decode worker (no worker need
   prefill any of it) and ``ttft_slo_s`` is None (the first token is out). The KV
   cache then travels for ``kv_transfer_s(prompt + 1 tokens)`` of the prefill worker's
   profile before the request joins its decode worker's queue, as the Splitwise
   policy's hand-off always did.

Each pool is shown to the policy as a plain cluster: every worker of the decode
snapshot carries the role ``MIXED``, because policies pick among
:meth:`ClusterSnapshot.eligible` workers, which leaves the ``DECODE`` role out (a
policy unaware of pools would otherwise find no worker). A rebalancing policy (GAPS,
Llumnix) plans over each pool on its own, so a request never moves between pools.

The pools' views and the decode placement are
:mod:`switchyard.policies.disaggregation`'s: the live stack's placer cuts its clusters
there too (it chooses the decode worker at arrival, as Splitwise and llm-d do).

A stage-aware policy that brings its own decode rule (a :class:`DecodeRouter`, the
registered ``splitwise``) keeps it: it places the decode phase by ``route_decode`` over
the whole cluster, as before. Without the option its pools are its own
``prefill_fraction`` of the workers (:func:`switchyard.policies.splitwise.split_roles`);
with it, the option's.

Simplified against those systems: the pools are fixed (no Splitwise mixed pool, no
Dynamo planner moving workers between them, no DistServe search for their sizes and
parallelism); every request is disaggregated (Dynamo may prefill a short prompt or a
well-cached one on its decode worker); the decode worker is chosen when the prefill
ends (Splitwise picks both at arrival, and so does the simulator with
``SimulationConfig.decode_at_arrival``, as the live placer does); the KV cache moves whole after the prefill, at
the profile's interconnect bandwidth, with no layer-by-layer overlap (Splitwise) and no
contention between transfers, and the prefill worker frees it at once (DistServe's
decode stage pulls it when it has room, the prefill GPU holding it meanwhile).
"""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.policies.base import (
    AssignmentPolicy,
    DecisionContext,
    DecodeRouter,
    Placement,
)
from switchyard.policies.disaggregation import bringing_kv, place_decode, shown_as_mixed
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    RebalanceSnapshot,
    RequestView,
    WorkerRole,
    WorkerView,
)
from switchyard.policies.splitwise import split_roles
from switchyard.policies.view_builders import new_cluster_snapshot

__all__ = ["Pools", "bringing_kv", "pool_problem", "worker_roles"]


def pool_problem(workers: int, prefill_workers: int) -> str | None:
    """Why ``prefill_workers`` of ``workers`` cannot prefill (None: they can)."""
    count = prefill_workers
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count < workers:
        return (
            f"prefill-workers must leave both pools non-empty: 1 to {workers - 1} of "
            f"{workers} workers, got {prefill_workers!r}"
            if workers > 1
            else f"prefill-workers needs at least 2 workers (one per pool), got {workers}"
        )
    return None


def worker_roles(
    workers: int, prefill_workers: int | None, policy_fraction: float | None
) -> tuple[WorkerRole, ...]:
    """Each worker's role: the option's pools when set, else a stage-aware policy's own
    (``policy_fraction``), else every worker runs both phases."""
    if prefill_workers is not None:
        decode = workers - prefill_workers
        return (WorkerRole.PREFILL,) * prefill_workers + (WorkerRole.DECODE,) * decode
    if policy_fraction is not None:
        return split_roles(workers, policy_fraction)
    return (WorkerRole.MIXED,) * workers


class Pools:
    """The prefill and decode pools of a cluster, and the snapshots each is shown in."""

    __slots__ = (
        "_all",
        "_assignment",
        "_decode",
        "_decode_ids",
        "_prefill",
        "_prefill_ids",
        "_prefill_views",
        "_relabeled",
        "_router",
    )

    def __init__(
        self, assignment: AssignmentPolicy, roles: Sequence[WorkerRole], worker_ids: Sequence[str]
    ) -> None:
        self._assignment = assignment
        self._router = assignment if isinstance(assignment, DecodeRouter) else None
        """A stage-aware policy's own decode rule (None: ask ``assignment`` again)."""
        self._prefill = tuple(i for i, role in enumerate(roles) if role is not WorkerRole.DECODE)
        self._decode = tuple(i for i, role in enumerate(roles) if role is WorkerRole.DECODE)
        self._prefill_ids = frozenset(worker_ids[i] for i in self._prefill)
        self._decode_ids = frozenset(worker_ids[i] for i in self._decode)
        self._all: tuple[WorkerView, ...] | None = None
        """The whole cluster's views the last prefill snapshot was cut from, and it."""
        self._prefill_views: tuple[WorkerView, ...] = ()
        self._relabeled: dict[int, tuple[WorkerView, WorkerView]] = {}
        """Per decode worker, its last view and that view with the role ``MIXED``."""

    def prefill(self, cluster: ClusterSnapshot) -> ClusterSnapshot:
        """``cluster`` cut to the prefill pool, the workers a new request may go to."""
        workers = cluster.workers
        if workers is not self._all:  # the simulator reuses the tuple until a change
            self._all = workers
            self._prefill_views = tuple([workers[i] for i in self._prefill])
        return new_cluster_snapshot(cluster.now_s, self._prefill_views)

    def decode(self, cluster: ClusterSnapshot) -> ClusterSnapshot:
        """``cluster`` cut to the decode pool, each worker shown as one that takes the
        request (role ``MIXED``: see the module docstring)."""
        workers = cluster.workers
        relabeled = self._relabeled
        shown: list[WorkerView] = []
        for i in self._decode:
            view = workers[i]
            known = relabeled.get(i)
            if known is None or known[0] is not view:
                known = relabeled[i] = (view, shown_as_mixed(view))
            shown.append(known[1])
        return new_cluster_snapshot(cluster.now_s, tuple(shown))

    def place_decode(
        self, request: RequestView, kv_tokens: int, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        """Where ``request``'s decode phase runs, its prefill done and its KV cache of
        ``kv_tokens`` tokens to move: a stage-aware policy's own decode rule over the
        whole cluster, any other policy asked again over the decode pool."""
        if self._router is not None:
            return self._router.route_decode(request, kv_tokens, cluster, ctx)
        pool = self.decode(cluster)
        return place_decode(self._assignment, request, kv_tokens, cluster, ctx, pool)

    def rebalance(self, snapshot: RebalanceSnapshot) -> tuple[RebalanceSnapshot, ...]:
        """``snapshot`` as one per pool: each pool's workers and queued requests, so a
        rebalancer moves requests within a pool, never across."""
        cluster = snapshot.cluster
        rate = snapshot.recent_slo_violation_rate
        return tuple(
            RebalanceSnapshot(
                cluster=pool,
                queued=tuple(q for q in snapshot.queued if q.worker_id in ids),
                recent_slo_violation_rate=rate,
            )
            for pool, ids in (
                (self.prefill(cluster), self._prefill_ids),
                (self.decode(cluster), self._decode_ids),
            )
        )
