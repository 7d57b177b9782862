"""Prefill/decode disaggregation over any policy: the pools a cluster is cut into (pure).

DistServe, Splitwise and Dynamo's disaggregated serving run a request's prefill on one
set of workers and its decode on another, moving the prompt's KV cache between them.
Here that is a property of the cluster, not of a policy: each worker has a role
(:class:`~switchyard.policies.snapshot.WorkerRole`), and any registered assignment policy
decides twice per request, once over each pool:

1. a new request is placed over :func:`prefill_pool`: the workers that prefill (the
   ``PREFILL`` pool, and ``MIXED`` workers, which run both phases);
2. its decode phase is placed by :func:`place_decode` over :func:`decode_pool`, with the
   request shown as :func:`bringing_kv` (its whole prompt cached on every decode worker,
   no first-token objective left). A stage-aware policy that brings its own decode rule
   (a :class:`~switchyard.policies.base.DecodeRouter`, the registered ``splitwise``)
   keeps it, over the whole cluster.

Each pool is shown to the policy as a plain cluster: the decode pool's workers carry the
role ``MIXED``, because policies pick among :meth:`ClusterSnapshot.eligible` workers,
which leaves ``DECODE`` out (a policy unaware of pools would otherwise find no worker).
A rebalancing policy plans over each pool on its own (:func:`rebalance_pools`), so a
request never moves between pools.

The simulator (``research.llm.disaggregation``) and the live placer
(:mod:`switchyard.cluster.placer`) both cut their clusters here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from switchyard.policies.base import AssignmentPolicy, DecisionContext, DecodeRouter, Placement
from switchyard.policies.snapshot import (
    ClusterSnapshot,
    RebalanceSnapshot,
    RequestView,
    WorkerRole,
    WorkerView,
)
from switchyard.policies.view_builders import new_cluster_snapshot, new_request_view

__all__ = [
    "bringing_kv",
    "decode_pool",
    "has_decode_pool",
    "place_decode",
    "prefill_pool",
    "rebalance_pools",
    "shown_as_mixed",
]

_WORKER_SLOTS: tuple[Any, ...] = tuple(WorkerView.__dict__[f.name] for f in fields(WorkerView))
_ROLE: Any = WorkerView.__dict__["role"]


def shown_as_mixed(view: WorkerView) -> WorkerView:
    """``replace(view, role=MIXED)``, slot by slot (a third of the cost; see
    :mod:`switchyard.policies.view_builders`)."""
    shown: WorkerView = object.__new__(WorkerView)
    for slot in _WORKER_SLOTS:
        slot.__set__(shown, slot.__get__(view, WorkerView))
    _ROLE.__set__(shown, WorkerRole.MIXED)
    return shown


def has_decode_pool(cluster: ClusterSnapshot) -> bool:
    """Whether any worker of ``cluster`` only decodes."""
    decode = WorkerRole.DECODE
    return any(worker.role is decode for worker in cluster.workers)


def prefill_pool(cluster: ClusterSnapshot) -> ClusterSnapshot:
    """``cluster`` cut to the workers a new request may go to (every one but the decode
    pool's); ``cluster`` itself when it has no decode pool."""
    if not has_decode_pool(cluster):
        return cluster
    decode = WorkerRole.DECODE
    return new_cluster_snapshot(
        cluster.now_s, tuple([w for w in cluster.workers if w.role is not decode])
    )


def decode_pool(cluster: ClusterSnapshot) -> ClusterSnapshot:
    """``cluster`` cut to its decode pool, each worker shown as one that takes the
    request (role ``MIXED``: see the module docstring)."""
    decode = WorkerRole.DECODE
    return new_cluster_snapshot(
        cluster.now_s, tuple([shown_as_mixed(w) for w in cluster.workers if w.role is decode])
    )


def bringing_kv(request: RequestView, workers: Sequence[WorkerView]) -> RequestView:
    """``request`` as its decode phase is placed: its whole prompt cached on every one
    of ``workers`` (its KV cache comes with it) and no first-token objective left."""
    prompt = request.prompt_tokens
    # RequestView's fields in order (see view_builders: the same object, built faster).
    return new_request_view(
        request.request_id,
        request.arrival_s,
        prompt,
        request.workload,
        request.model,
        request.output_tokens_hint,
        request.predicted_s,
        request.calibrated_s,
        request.deadline_s,
        request.true_service_s,
        {worker.worker_id: prompt for worker in workers},  # cached_tokens
        None,  # ttft_slo_s: the first token is out
    )


def place_decode(
    assignment: AssignmentPolicy,
    request: RequestView,
    kv_tokens: int,
    cluster: ClusterSnapshot,
    ctx: DecisionContext,
    pool: ClusterSnapshot | None = None,
) -> Placement:
    """Where ``request``'s decode phase runs, its prefill done and its KV cache of
    ``kv_tokens`` tokens to move: a stage-aware policy's own decode rule over the whole
    ``cluster``, any other policy asked again over the decode pool (``pool``, when the
    caller has cut it already).

    Raises:
        RuntimeError: the policy chose a worker outside the pool it was shown.
    """
    if isinstance(assignment, DecodeRouter):
        return assignment.route_decode(request, kv_tokens, cluster, ctx)
    shown = decode_pool(cluster) if pool is None else pool
    placement = assignment.assign(bringing_kv(request, shown.workers), shown, ctx)
    if not any(w.worker_id == placement.worker_id for w in shown.workers):
        raise RuntimeError(
            f"{assignment.name} placed a decode phase on {placement.worker_id}, "
            "outside the decode pool it was shown"
        )
    return placement


def rebalance_pools(snapshot: RebalanceSnapshot) -> tuple[RebalanceSnapshot, ...]:
    """``snapshot`` as one per pool (its workers and its queued requests), so that a
    rebalancer moves requests within a pool, never across; ``(snapshot,)`` when the
    cluster has no decode pool."""
    cluster = snapshot.cluster
    if not has_decode_pool(cluster):
        return (snapshot,)
    pools = (prefill_pool(cluster), decode_pool(cluster))
    return tuple(
        RebalanceSnapshot(
            cluster=pool,
            queued=tuple(q for q in snapshot.queued if q.worker_id in ids),
            recent_slo_violation_rate=snapshot.recent_slo_violation_rate,
        )
        for pool in pools
        for ids in [frozenset(w.worker_id for w in pool.workers)]
    )
