"""Prefix-aware routers, as the systems people deploy instead run them: llm-d's endpoint
picker and Dynamo's KV router.

Both read how many of the request's prompt tokens each worker already holds in its
prefix cache (``RequestView.cached_tokens``, filled by the shell from the workers'
caches, as vLLM's KV events let llm-d's precise scorer and Dynamo's indexer see them)
and weigh it against load.

- :class:`EndpointPicker` (llm-d's inference scheduler, its default scheduling
  profile): three scorers, each 0..1, summed with weights 2, 2 and 3, the highest
  score wins. *Queue*: the worker's waiting requests, min-max normalised over the
  candidates (1 for the shortest queue, 0 for the longest, 1 for all when equal).
  *KV-cache utilisation*: one minus the share of the worker's KV cache in use.
  *Prefix cache*: the share of the prompt's tokens the worker holds. Simplified: ties
  go to the worker listed first (llm-d's max-score picker draws among them at random),
  and there are no filters (its decode filter matters only with disaggregation).
- :class:`KvRouter` (Dynamo's KV router, temperature 0): the cost of a worker is
  ``overlap weight x prefill blocks + decode blocks``, the lowest cost wins; *prefill
  blocks* are the prompt's blocks the worker would compute (those it does not hold),
  *decode blocks* the blocks of every request on the worker (the running batch's KV
  and the waiting prompts) plus the request's own; the overlap weight is Dynamo's
  default, 1. Simplified: blocks are counted in 512-token units, and the worker's
  blocks come from the snapshot rather than the router's own book of what it sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS
from switchyard.policies.base import DecisionContext, Placement, pick_min
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerView

__all__ = ["EndpointPicker", "KvRouter"]


@dataclass(frozen=True, slots=True)
class EndpointPicker:
    """llm-d's endpoint picker (see the module docstring)."""

    name: str = "llm-d"
    queue_weight: float = 2.0
    kv_cache_weight: float = 2.0
    prefix_weight: float = 3.0

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        workers = cluster.eligible()
        waiting = [w.waiting for w in workers] or [0]
        shortest, longest = min(waiting), max(waiting)
        spread = longest - shortest
        prompt = max(1, request.prompt_tokens)

        def minus_score(worker: WorkerView) -> float:
            queue = 1.0 if spread == 0 else (longest - worker.waiting) / spread
            kv = 1.0 - min(1.0, worker.kv_used_tokens / max(1, worker.kv_capacity_tokens))
            prefix = request.cached_tokens.get(worker.worker_id, 0) / prompt
            return -(
                self.queue_weight * queue + self.kv_cache_weight * kv + self.prefix_weight * prefix
            )

        return Placement(pick_min(workers, minus_score).worker_id, "highest weighted score")


@dataclass(frozen=True, slots=True)
class KvRouter:
    """Dynamo's KV router (see the module docstring)."""

    name: str = "kv-router"
    overlap_weight: float = 1.0

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        prompt_blocks = request.prompt_tokens / PREFIX_BLOCK_TOKENS

        def cost(worker: WorkerView) -> float:
            cached = request.cached_tokens.get(worker.worker_id, 0)
            prefill_blocks = (request.prompt_tokens - cached) / PREFIX_BLOCK_TOKENS
            decode_blocks = worker.queued_tokens / PREFIX_BLOCK_TOKENS + prompt_blocks
            return self.overlap_weight * prefill_blocks + decode_blocks

        return Placement(pick_min(cluster.eligible(), cost).worker_id, "lowest KV cost")
