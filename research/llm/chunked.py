"""Chunked prefill: one simulated instance that mixes prompt chunks into decode steps.

This is the scheduling rule of Sarathi-Serve (Agrawal et al., OSDI 2024;
``sarathi/core/scheduler/sarathi_scheduler.py``) and of vLLM with
``enable_chunked_prefill`` (the V0 scheduler's ``_schedule_chunked_prefill``: "schedule
as many decoding requests as possible, then chunked prefill requests that are not
finished, then new prefill requests"; V1 spends one token budget the same way). Every
iteration has a budget of ``tokens`` (vLLM's ``max_num_batched_tokens``):

1. every running request decodes one token, one token of the budget each;
2. the partially prefilled requests, in the order they were admitted, get the next
   chunk of their prompt: as many of their remaining prompt tokens as the budget has
   left;
3. while budget is left, waiting requests are admitted first come first served, as the
   instance without chunking admits them (a free batch slot and KV-cache memory for the
   prompt and the whole output; a cached prompt prefix is not prefilled), each taking
   the next chunk of its prompt. A request that brings its KV cache (migrated, handed
   off) joins the running batch and decodes in this iteration, one token of budget.

A request's first token comes at the end of the iteration that prefills its last
chunk; it then joins the running batch (or, on a prefill-only worker, leaves for a
decode worker). The iteration lasts :meth:`PerformanceModel.mixed_iteration_s`.

When no prompt is being prefilled and none can be admitted, the instance decodes
exactly as :class:`~research.llm.instance.SimInstance` does, in closed form over many
steps; mixed iterations are simulated one by one. ``phase`` is ``Phase.PREFILL`` while a
mixed iteration runs (an iteration of known end, ``busy_until_s``) and ``Phase.DECODE``
only when nothing is being prefilled.

Simplified against vLLM and Sarathi-Serve:

- KV-cache memory is reserved for the prompt and the whole output at admission, as the
  instance without chunking does, so nothing is ever preempted (vLLM allocates blocks as
  tokens come and preempts by recomputation when they run out).
- The budget must cover every batch slot (vLLM refuses ``max_num_batched_tokens`` below
  ``max_num_seqs`` too), so decodes are never cut by the budget.
- One budget for every prompt: no ``long_prefill_token_threshold``, no limit on
  concurrent partial prefills (FCFS leaves at most one prompt part-prefilled at an
  iteration's end anyway), no Sarathi dynamic chunk schedule, no rounding of chunks to
  tile sizes.
- A running request taken away mid-iteration (live migration) does not shorten the
  iteration; the rebalancer lists running requests only between mixed iterations, as
  it does between prefills without chunking.
"""

from __future__ import annotations

import heapq

from switchyard.perf import PerformanceModel
from switchyard.perf.prefix_cache import cached_tokens
from switchyard.policies.snapshot import WorkerRole

from research.llm.instance import Phase, SimInstance
from research.llm.request import SimRequest

__all__ = ["ChunkedInstance"]


class ChunkedInstance(SimInstance):
    """A simulated worker that runs chunked prefill (see the module docstring)."""

    __slots__ = ("_chunks", "_context", "_left", "budget", "iterations", "prefilled_tokens")

    def __init__(
        self,
        index: int,
        worker_id: str,
        perf: PerformanceModel,
        role: WorkerRole,
        *,
        budget: int,
        changed: list[SimInstance] | None = None,
    ) -> None:
        problem = perf.chunk_budget_problem(budget)
        if problem is not None:
            raise ValueError(problem)
        super().__init__(index, worker_id, perf, role, changed=changed)
        self.budget = budget
        """Tokens one iteration processes: decodes plus prefill chunks."""
        self.iterations = 0
        """Mixed iterations run (the decode steps between them are not counted)."""
        self.prefilled_tokens = 0
        """Prompt tokens prefilled, over every chunk that ended."""
        # Per prefilling request, in admission order (as ``prefilling``): prompt tokens
        # whose KV cache it has, and prompt tokens still to prefill.
        self._context: list[int] = []
        self._left: list[int] = []
        self._chunks: list[int] = []
        """Tokens of the iteration in progress, per prefilling request from the first
        (the rest have no chunk in it)."""

    # -- iterations ----------------------------------------------------------------------

    def wake(self, now_s: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Carry the instance forward to ``now_s`` (as :meth:`SimInstance.wake`)."""
        self.account(now_s)
        finished: list[SimRequest] = []
        handoffs: list[SimRequest] = []
        if self.phase is Phase.PREFILL:
            if now_s + 1e-12 < self.busy_until_s:
                return finished, handoffs
            end_s = self.busy_until_s
            if self.n_running:
                self.steps_done += 1  # every running request decoded one token
            self._finish_decodes(end_s, finished)
            self._finish_chunks(end_s, finished, handoffs)
            self.anchor_s = end_s
            self.phase = Phase.DECODE if self.n_running else Phase.IDLE
        elif self.phase is Phase.DECODE:
            self.sync(now_s)
            self._finish_decodes(self.anchor_s, finished)
            if not self.n_running:
                self.phase = Phase.IDLE
        self._start(now_s)
        self._refresh_utilization()
        return finished, handoffs

    def _finish_decodes(self, end_s: float, finished: list[SimRequest]) -> None:
        """Retire the running requests whose last token the synced steps produced."""
        heap = self._heap
        steps_done = self.steps_done
        while heap:
            finish_step, token, request = heap[0]
            if request.instance is not self or token != request.join_token:
                heapq.heappop(heap)  # stale (see SimInstance._stale)
                continue
            if finish_step > steps_done:
                break
            heapq.heappop(heap)
            self._leave(request)
            request.finished_s = end_s
            request.instance = None
            finished.append(request)

    def _finish_chunks(
        self, end_s: float, finished: list[SimRequest], handoffs: list[SimRequest]
    ) -> None:
        """Count the chunks of the iteration that ended; a prompt whose last chunk it
        was has its first token and leaves the prefilling requests."""
        chunks = self._chunks
        if not chunks:
            return
        self._chunks = []
        keep: list[SimRequest] = []
        context: list[int] = []
        left: list[int] = []
        for i, request in enumerate(self.prefilling):
            tokens = chunks[i] if i < len(chunks) else 0
            remaining = self._left[i] - tokens
            self.prefill_tokens += tokens
            self.prefilled_tokens += tokens
            if remaining > 0 or i >= len(chunks):
                keep.append(request)
                context.append(self._context[i] + tokens)
                left.append(remaining)
                continue
            # Its last chunk: the first token (SimInstance.wake's end of a prefill).
            self.prefill_tokens -= request.prompt_tokens
            self.prefill_work_s -= request.work_s
            self._prefilled(request, end_s, finished, handoffs)
        self.prefilling = keep
        self._context = context
        self._left = left
        if not keep:
            # Nothing prefilling: clear the rounding the sums picked up.
            self.prefill_work_s = 0.0
            self.prefill_tokens = 0

    def _start(self, now_s: float) -> None:
        """Form the next iteration at ``now_s`` (see the module docstring), unless one
        is in progress: a mixed one when there is a chunk to prefill, else decoding."""
        if self.phase is Phase.PREFILL:
            return
        perf = self.perf
        room = self.budget - self.n_running  # every running request decodes one token
        chunks: list[int] = []
        for tokens in self._left:
            if room <= 0:
                break
            chunk = tokens if tokens < room else room
            chunks.append(chunk)
            room -= chunk
        joined = False
        if len(chunks) == len(self.prefilling):
            while self.waiting and room > 0 and self._can_admit_head():
                request = self._take_head(now_s)
                if request.has_kv:
                    # It brings its KV cache: it decodes in this iteration.
                    if self.phase is Phase.DECODE:
                        self.sync(now_s)
                    self._join(request)
                    joined = True
                    room -= 1
                    continue
                blocks = request.prefix_blocks
                new_tokens = request.prompt_tokens
                if blocks:
                    new_tokens -= cached_tokens(
                        self.prefix_cache.matched_blocks(blocks), request.prompt_tokens
                    )
                    self.prefix_cache.use(blocks)
                request.prefill_s = now_s
                self.prefill_work_s += request.work_s
                self.prefilling.append(request)
                cached = request.prompt_tokens - new_tokens
                self.prefill_tokens += cached  # a cached prefix is in the KV cache at once
                self._context.append(cached)
                self._left.append(new_tokens)
                chunk = new_tokens if new_tokens < room else room
                chunks.append(chunk)
                room -= chunk
        if chunks:
            if self.phase is Phase.DECODE:
                self.sync(now_s)
            n = self.n_running
            self._chunks = chunks
            self.iterations += 1
            self.phase = Phase.PREFILL
            self.busy_until_s = now_s + perf.mixed_iteration_s(
                list(zip(self._context, chunks, strict=False)),
                n,
                self.kv_base + n * self.steps_done,
            )
        elif joined:
            self.phase = Phase.DECODE
            self.anchor_s = now_s
