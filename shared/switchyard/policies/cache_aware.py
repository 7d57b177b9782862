"""Switchyard's own assignment policy: the worker where the request's first token comes
soonest and its prefill costs the others least, with cache hits counted as the compute
they spare.

For each worker the cost, in seconds, is the sum of five terms:

- **First token**: the prefill of the prompts waiting ahead (their tokens times the
  worker's prefill cost per token), half the prefill in progress
  (:data:`PREFILL_IN_PROGRESS_LEFT`), plus the request's own prefill past the prefix that
  worker's cache holds (:meth:`~switchyard.policies.snapshot.WorkerView.uncached_prefill_s`).
  A prefix hit counts as what it really spares: prefill compute, which no batching
  shares out. Routing by predicted service seconds instead (Switchyard's first form of
  this policy, and GAPS) weighs a hit against queues of decode work a batch drains
  thirty at a time, so it almost never follows one: on the Mooncake trace it reused 2
  to 5 % of prompt tokens from cache where llm-d's endpoint picker reused 18 %.
- **The pause it imposes**: a whole prefill stops every decode running on its worker,
  and one in chunks slows each of their iterations by its chunk, as much in all; so its
  own prefill compute counts again, ``stall_weight`` times the share of the worker's
  batch slots running. This is what keeps the time-per-output-token objective of the
  requests already running. (On a worker that chunks, the first-token term also counts
  each chunk's iteration, :meth:`~switchyard.policies.snapshot.WorkerView.uncached_prefill_s`.)
- **The prefill iteration it joins or opens** (whole prompts only): a prompt that finds
  others waiting is prefilled with them, so each of their first tokens comes its own
  prefill later, counted once a request waiting; one that finds none opens an iteration
  of its own, whose fixed cost (``prefill_base_s``, 11 ms on an A100 with llama-2-7b)
  pauses every running decode, ``iteration_weight`` times that base times the requests
  running. The prompt's compute pauses some batch wherever it goes; the base is the part
  of the pause only a prompt that goes alone imposes. Without the term the policy all
  but never joined a waiting prompt (1.01 prompts a prefill iteration on the
  conversation trace at 25.5 requests/s on 8 workers, `jsq`'s capacity, against `jsq`'s
  1.18): it paused its decodes for about 570 more iterations of 4,000 and met fewer
  end-to-end objectives than `jsq` there (88.7 % against 91.8 %; 92.5 % with the term,
  though at 25.45 requests/s `jsq` meets 92.5 % and Switchyard 92.0 %). With the
  iteration's cost but not the first tokens a join delays, long prompts joined short
  ones waiting and held their first tokens back a third of a second.
- **Memory**: the share of the worker's KV cache in use, ``kv_weight`` seconds when full
  (a request waits for memory to free before it starts).
- **Load**: requests outstanding over batch slots, ``load_weight`` seconds for a full
  batch (what a decode step slows with; on a trace with short prompts this term makes
  the policy a join-the-shortest-queue).

On a cluster of unlike GPUs the load and memory terms of a slower worker weigh more:
each is multiplied by how much longer that worker's decode step is than one with the
cluster's fastest constants, at its own batch with the request added
(:func:`_slowdowns`). A request on a slower GPU is slower even idle, so it has less room
under the same objectives: without the factor the policy gave an L40S as many requests
per slot as an A100 and held 35.2 requests/s on the mixed cluster of the capacity
benchmark, against 38.4 with it (the stall weight then 10; 37.6 at 3), where Llumnix,
whose balance of KV use gives the smaller L40S cache fewer tokens, held 36.4. On a
cluster of one kind every factor is 1 and nothing changes.

A worker whose profile does not say what a prefill costs (``prefill_per_token_s`` 0)
has only the last two terms. The least cost wins; ties go to the worker listed first.

The weights (stall 3, KV 1 s, load 2 s, iteration 0.5) were chosen near each trace's
capacity (``bench/capacity_eval.py``'s traces, 16 and 32 workers, one seed; the
iteration weight at `jsq`'s capacity on 8, 16 and 32 workers of the conversation trace,
where it matters: from 0.5 up Switchyard met more objectives than `jsq` at every size,
0.2 and 0.3 fell short at 8 workers, and above 0.5 the P99 TTFT rose toward `jsq`'s). The stall weight
trades the newcomer's first token against the running requests' pace: at 10, a long
prompt went to the worker with the fewest running requests whatever prompts waited
there, and on the conversation trace the P99 TTFT at `jsq`'s capacity was 0.94 and 1.00
times `jsq`'s (16 and 32 workers, ``bench/ttft_at_capacity.py``); at 3 it is 0.77 and
0.76 (0.70 and 0.65 on the trace's next 4,000 requests, which the choice did not see),
every capacity at 90 % in the grid within 2.1 % of 10's (the search's resolution is
2 %). What 3 gives up is past capacity on the Mooncake trace: at 2.2 times its rate on
16 workers 85.3 % of the requests met their SLOs, against 87.1 % at 10 and 83.6 % at 0.
Without the KV term 3 to 4 points fewer met them on the Mooncake trace at 1.6 to 2 times
its rate; on the conversation trace at 32 workers the KV term cost 1.6 points with a
load weight of 1 and nothing with 2. It reads no prediction.

Registered as ``switchyard`` with the ``ttft-feasible`` admission
(:mod:`switchyard.policies.admission`), without a rebalancer (``policies/registry.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from switchyard.policies.base import DecisionContext, Placement, pick_min
from switchyard.policies.snapshot import ClusterSnapshot, RequestView, WorkerView

__all__ = ["PREFILL_IN_PROGRESS_LEFT", "CacheAwareRouter"]

PREFILL_IN_PROGRESS_LEFT = 0.5
"""The share of a whole-prompt prefill in progress (``WorkerView.prefilling_tokens``)
counted as still ahead of a newcomer: the view does not say when it began, and a
decision falls on average halfway through it. Without it the first-token term saw a
worker busy with a 4,000-token prompt (a third of a second on an A100) as idle; counting
it took the P99 TTFT at the best baseline's capacity from 0.81 to 0.77 of Llumnix's on
the mixed cluster and from 0.77 to 0.69 of jsq's on 16 A100s (docs/benchmarks.md,
"Capacity"); counting all of it gained little more on TTFT and held less load. The
tokens are whole prompts, a cached prefix included (the simulator's and the emulated
worker's alike), so a prefill that reuses a prefix is counted a little long."""


@dataclass(frozen=True, slots=True)
class CacheAwareRouter:
    """Soonest first token, least pause to the running batch (see the module docstring)."""

    name: str = "switchyard"
    stall_weight: float = 3.0
    kv_weight_s: float = 1.0
    load_weight_s: float = 2.0
    iteration_weight: float = 0.5

    def assign(
        self, request: RequestView, cluster: ClusterSnapshot, ctx: DecisionContext
    ) -> Placement:
        cached = request.cached_tokens
        prompt = request.prompt_tokens
        stall_weight = self.stall_weight
        kv_weight_s = self.kv_weight_s
        load_weight_s = self.load_weight_s
        iteration_weight = self.iteration_weight

        slowdowns = _slowdowns(cluster.eligible(), prompt)

        def cost(worker: WorkerView) -> float:
            hit = cached.get(worker.worker_id, 0)
            own_s = worker.uncached_prefill_s(prompt, hit)
            slots = worker.max_slots if worker.max_slots > 0 else 1
            waiting_tokens = worker.waiting_prompt_tokens
            ahead_s = worker.prefill_per_token_s * (
                waiting_tokens + PREFILL_IN_PROGRESS_LEFT * worker.prefilling_tokens
            )
            whole_s = 0.0
            if worker.chunk_budget_tokens is None:
                stall_s = own_s
                if hit < prompt:
                    # A whole prompt joins the next prefill iteration: the first tokens
                    # of those waiting for it come its own prefill later; with none
                    # waiting it opens an iteration of its own, whose fixed cost pauses
                    # every decode.
                    if waiting_tokens > 0:
                        whole_s = own_s * worker.waiting
                    else:
                        whole_s = iteration_weight * worker.prefill_base_s * worker.running
            else:
                stall_s = worker.prefill_compute_s(prompt, hit)
            capacity = worker.kv_capacity_tokens
            kv_share = worker.kv_used_tokens / capacity if capacity > 0 else 0.0
            slowdown = 1.0 if slowdowns is None else slowdowns[worker.worker_id]
            return (
                ahead_s
                + own_s
                + stall_s * stall_weight * worker.running / slots
                + whole_s
                + slowdown
                * (
                    kv_weight_s * (kv_share if kv_share < 1.0 else 1.0)
                    + load_weight_s * worker.outstanding / slots
                )
            )

        return Placement(pick_min(cluster.eligible(), cost).worker_id, "soonest first token")


def _slowdowns(workers: Sequence[WorkerView], prompt_tokens: int) -> dict[str, float] | None:
    """Per worker, its decode step over one with the cluster's fastest constants, each at
    the worker's batch with the request added; None when every worker has the same
    constants (the factors would all be 1) or one's profile is not known.

    The profiles' fixed time of an iteration (reading the weights) is the same for a
    prefill and a decode step, so ``prefill_base_s`` stands for the decode's too.
    """
    kinds = {
        (w.prefill_base_s, w.decode_step_per_seq_s, w.decode_step_per_kv_token_s) for w in workers
    }
    if len(kinds) < 2 or any(base_s <= 0.0 or kv_s <= 0.0 for base_s, _, kv_s in kinds):
        return None
    base_s, per_seq_s, per_kv_s = (min(column) for column in zip(*kinds, strict=True))
    factors: dict[str, float] = {}
    for worker in workers:
        batch = worker.outstanding + 1
        kv_tokens = worker.queued_tokens + prompt_tokens
        step_s = (
            worker.prefill_base_s
            + worker.decode_step_per_seq_s * batch
            + worker.decode_step_per_kv_token_s * kv_tokens
        )
        factors[worker.worker_id] = step_s / (base_s + per_seq_s * batch + per_kv_s * kv_tokens)
    return factors
