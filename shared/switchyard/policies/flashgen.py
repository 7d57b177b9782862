"""A FlashGen-style local router that optimises the decode phase.

Decode dominates an LLM request's time, and each decode step slows down as the batch
and its KV cache grow. This router looks only at each worker's *current* batch (local
state, no prediction of queued work, no migration) and sends a request where its
per-token latency would be lowest: among workers that can admit it at once, the one
whose next decode step, with the request added, is shortest; when none can, the one
with the fewest waiting requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.policies.base import DecisionContext, Placement, pick_min
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerView


def step_with(worker: WorkerView, prompt_tokens: int) -> float:
    """The decode step time of ``worker``'s batch once this request joined it."""
    return (
        worker.decode_step_s
        + worker.decode_step_per_seq_s
        + worker.decode_step_per_kv_token_s * prompt_tokens
    )


@dataclass(frozen=True, slots=True)
class FlashGenRouter:
    name: str = "flashgen"

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        workers = cluster.eligible()
        ready = tuple(
            w
            for w in workers
            if w.waiting == 0 and w.free_slots > 0 and w.kv_free_tokens >= request.prompt_tokens
        )
        if ready:
            best = pick_min(ready, lambda w: step_with(w, request.prompt_tokens))
            return Placement(best.worker_id, "fastest decode step once joined")
        best = pick_min(workers, lambda w: w.waiting + w.outstanding * 1e-6)
        return Placement(best.worker_id, "fewest waiting")
