"""Switchyard's own assignment policy: least expected finish, with the prefill a cached
prefix spares counted.

For each worker: the predicted work it holds (GAPS's queued work, from calibrated
predictions) plus the request's calibrated service time on the worker's type, minus
the prefill seconds the worker's cached prefix of the prompt spares
(:meth:`~switchyard.policies.snapshot.WorkerView.prefill_saved_s`); the least wins,
ties to the fewer outstanding requests. So a prefix hit draws a request exactly as far
as the time it saves, no further: a hit worth 0.8 s of prefill beats a queue 0.5 s
shorter and loses to one 1 s shorter. Unlike GAPS it has no load threshold below which
it joins the shortest queue (that would ignore cache hits on a quiet cluster). Without
a prediction for a worker's type it falls back to tokens: the worker's queued tokens
plus the prompt tokens it would prefill.

Registered as ``switchyard`` with GAPS's selective rebalancer and calibrated
predictions (``policies/registry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.policies.base import DecisionContext, Placement, pick_min
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerView

__all__ = ["CacheAwareWork"]


@dataclass(frozen=True, slots=True)
class CacheAwareWork:
    """Least predicted work plus service time, less the prefill a cache hit spares."""

    name: str = "switchyard"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        cached = request.cached_tokens
        calibrated = request.calibrated_s
        prompt = request.prompt_tokens

        def cost(worker: WorkerView) -> float:
            hit = cached.get(worker.worker_id, 0)
            service_s = calibrated.get(worker.worker_type)
            if service_s is None:
                return worker.queued_tokens + prompt - hit + 1e-6 * worker.outstanding
            saved_s = worker.prefill_saved_s(prompt, hit) if hit else 0.0
            # Ties (an idle cluster predicts no work anywhere) go to the fewer outstanding.
            return worker.queued_work_s + service_s - saved_s + 1e-6 * worker.outstanding

        return Placement(pick_min(cluster.eligible(), cost).worker_id, "least expected finish")
