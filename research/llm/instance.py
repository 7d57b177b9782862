"""One simulated model instance: continuous batching over a performance model.

The instance runs iterations like vLLM without chunked prefill: whenever requests wait
and the batch has room (a free slot and KV-cache memory for the request's prompt and
output), the next iteration is a prefill of every admissible waiting request (up to a
token budget, at least one); otherwise it is a decode step of the whole running batch,
which yields one token per running request. (:mod:`research.llm.chunked` is the same
instance with chunked prefill, ``SimulationConfig.chunked_prefill_tokens``.)

Between two events the batch does not change, so the decode steps are not simulated one
by one: a decode step lasts ``base + per_seq * n + per_kv * kv`` with ``kv`` growing by
``n`` tokens per step, and the time of ``k`` steps has a closed form
(:meth:`PerformanceModel.decode_steps_s`). The instance only wakes at iteration
boundaries that matter: a prefill's end, the next completion, or the end of the step in
progress when a newly queued request can be admitted. That is what makes the simulator
run tens of thousands of requests per second.

KV-cache memory is reserved for the prompt plus the whole output at admission (no
preemption); a request's memory grows token by token inside that reservation. A prompt
whose leading KV blocks the instance's prefix cache holds (a trace with block ids, such
as the Mooncake format's) prefills only the rest (:mod:`switchyard.perf.prefix_cache`,
the same rule as the emulated worker's).
"""

from __future__ import annotations

import heapq
from collections import deque
from enum import Enum
from itertools import islice

from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS
from switchyard.perf import PerformanceModel
from switchyard.perf.prefix_cache import PrefixCache, cached_tokens
from switchyard.policies.snapshot import QueuedRequestView, RequestPhase, WorkerRole, WorkerView
from switchyard.policies.view_builders import new_queued_request_view, new_worker_view

from research.llm.request import SimRequest

_STEP_SLACK_S = 1e-9
"""A decode step that ends within this of now has ended. A wake-up is scheduled at a
step's end as ``anchor + duration``, and reading it back as ``now - anchor`` can come
out short by a unit in the last place of ``now``: 4e-12 s at 16,000 s of virtual time
(a long trace at a low load), where a smaller slack made the instance wake at the same
instant forever. A nanosecond is far below any step and far above that rounding."""


class Phase(Enum):
    IDLE = 0
    PREFILL = 1
    DECODE = 2


class SimInstance:
    """A worker of the simulated cluster. Only the simulator calls it."""

    __slots__ = (
        "_cross",
        "_heap",
        "_joins",
        "anchor_s",
        "busy_area",
        "busy_until_s",
        "changed",
        "incoming",
        "incoming_work_s",
        "index",
        "kv_base",
        "last_account_s",
        "n_running",
        "perf",
        "phase",
        "prefill_tokens",
        "prefill_work_s",
        "prefilling",
        "prefix_cache",
        "reserved_tokens",
        "role",
        "run_base_s",
        "run_per_step_s",
        "steps_done",
        "util_area",
        "util_now",
        "view",
        "waiting",
        "waiting_prompt_tokens",
        "waiting_work_s",
        "wake_s",
        "wake_version",
        "worker_id",
        "worker_type",
    )

    def __init__(
        self,
        index: int,
        worker_id: str,
        perf: PerformanceModel,
        role: WorkerRole,
        *,
        changed: list[SimInstance] | None = None,
    ) -> None:
        self.index = index
        self.worker_id = worker_id
        self.worker_type = perf.name
        self.perf = perf
        self.role = role
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self.prefill_tokens = 0
        """Prompt tokens of the prefilling requests (their KV cache as it fills)."""
        self.prefix_cache = PrefixCache(perf.kv_capacity_tokens // PREFIX_BLOCK_TOKENS)
        """Blocks of the prompts it prefilled: a prompt's leading blocks held here are not
        prefilled again (as the emulated worker does)."""
        # (finish step, join token, request); an entry whose token is no longer the
        # request's (it left by migration) is stale and skipped when it surfaces.
        self._heap: list[tuple[int, int, SimRequest]] = []
        self._joins = 0
        self.n_running = 0
        self.steps_done = 0
        self.anchor_s = 0.0
        # KV tokens of the running batch = kv_base + n_running * steps_done, where each
        # request contributes prompt + generated_at_join - join_step.
        self.kv_base = 0
        self.reserved_tokens = 0
        self.phase = Phase.IDLE
        self.busy_until_s = 0.0
        self.waiting_work_s = 0.0
        self.waiting_prompt_tokens = 0
        # Predicted work left of the active requests. A prefilling request counts its
        # whole prediction. A running request's progress is measured in tokens, as a
        # worker reports it, not in wall time (a batch runs slower than the idle
        # worker the prediction is for): after g tokens it has done its idle prefill
        # plus g - 1 idle decode steps, and what is left is its prediction minus that,
        # at least 0. Over the batch that is run_base_s - steps_done * run_per_step_s;
        # a min-heap keyed by the step at which a request's share reaches 0 retires it.
        self.prefill_work_s = 0.0
        self.run_base_s = 0.0
        self.run_per_step_s = 0.0
        self._cross: list[tuple[float, int, SimRequest]] = []
        self.wake_s: float | None = None
        self.wake_version = 0
        self.util_now = 0.0
        self.view: WorkerView | None = None
        """This worker as policies last saw it; rebuilt after any change."""
        self.changed: list[SimInstance] = [] if changed is None else changed
        """Where the instance puts itself when it drops its view, shared by a cluster's
        instances: the simulator rebuilds only the views listed there."""
        self.util_area = 0.0
        self.busy_area = 0.0
        self.last_account_s = 0.0
        self.incoming = 0
        """Decode phases chosen for this worker at arrival and not arrived yet
        (``SimulationConfig.decode_at_arrival``): they count as waiting, with their
        predicted work, as a live placer counts its own decisions."""
        self.incoming_work_s = 0.0

    def expect(self, work_s: float, count: int) -> None:
        """``count`` decode phases of ``work_s`` predicted work each chosen for this
        worker (a negative count: they arrived, or went elsewhere)."""
        self.incoming += count
        self.incoming_work_s += count * work_s
        if self.view is not None:
            self.view = None
            self.changed.append(self)

    # -- figures a snapshot reads --------------------------------------------------

    @property
    def running(self) -> int:
        return self.n_running + len(self.prefilling)

    def kv_tokens(self) -> int:
        return self.kv_base + self.n_running * self.steps_done + self.prefill_tokens

    def queued_work_s(self) -> float:
        """Predicted seconds of work held: waiting, prefilling, and what the running
        batch has left as of the last synced step (see ``__init__``)."""
        return self.waiting_work_s + self.prefill_work_s + self.running_work_s()

    def running_work_s(self) -> float:
        cross = self._cross
        steps = self.steps_done
        while cross and cross[0][0] <= steps:
            _, token, request = heapq.heappop(cross)
            if token == request.end_token and request.instance is self:
                self._uncount(request)
        left = self.run_base_s - steps * self.run_per_step_s
        return left if left > 0.0 else 0.0

    def remaining_work_s(self, request: SimRequest) -> float:
        """The predicted work a running request has left (see ``__init__``)."""
        left = request.run_base_s - self.steps_done * request.run_per_step_s
        return left if left > 0.0 else 0.0

    def _count(self, request: SimRequest) -> None:
        """Count a request that joined the batch in the running work."""
        perf = self.perf
        per_step_s = perf.decode_step_s(1, request.prompt_tokens + 1)
        done_s = perf.prefill_s((request.prompt_tokens,)) + per_step_s * (
            request.generated_at_join - 1 - self.steps_done
        )
        request.run_per_step_s = per_step_s
        request.run_base_s = request.work_s - done_s
        if request.run_base_s - self.steps_done * per_step_s <= 0.0:
            request.end_token = -1  # already past its prediction: counts nothing
            return
        self._joins += 1
        request.end_token = self._joins
        self.run_base_s += request.run_base_s
        self.run_per_step_s += per_step_s
        heapq.heappush(self._cross, (request.run_base_s / per_step_s, self._joins, request))

    def _uncount(self, request: SimRequest) -> None:
        if request.end_token >= 0:
            request.end_token = -1
            self.run_base_s -= request.run_base_s
            self.run_per_step_s -= request.run_per_step_s
            if not self._cross:
                # Nothing counted any more: clear the rounding the sums picked up.
                self.run_base_s = 0.0
                self.run_per_step_s = 0.0

    def decode_step_s(self) -> float:
        if not self.n_running:
            return 0.0
        return self.perf.decode_step_s(
            self.n_running, self.kv_base + self.n_running * self.steps_done
        )

    # -- accounting ------------------------------------------------------------------

    def account(self, now_s: float) -> None:
        """Integrate utilisation up to ``now_s``; call before every change."""
        elapsed = now_s - self.last_account_s
        if elapsed > 0.0:
            self.util_area += self.util_now * elapsed
            if self.phase is not Phase.IDLE:
                self.busy_area += elapsed
            self.last_account_s = now_s

    def _refresh_utilization(self) -> None:
        if self.view is not None:  # something changed: the next snapshot rebuilds the view
            self.view = None
            self.changed.append(self)
        if self.waiting:
            self.util_now = 1.0
            return
        slots = (self.n_running + len(self.prefilling)) / self.perf.max_batch_slots
        memory = self.reserved_tokens / self.perf.kv_capacity_tokens
        self.util_now = slots if slots > memory else memory

    # -- queue changes -----------------------------------------------------------------

    def enqueue(self, request: SimRequest, now_s: float) -> None:
        self.account(now_s)
        self.sync(now_s)
        request.instance = self
        request.served_by = self.worker_type
        request.served_on = self.worker_id
        request.queued_at_s = now_s
        request.work_s = request.service_estimate_s(self.worker_type)
        self.waiting.append(request)
        self.waiting_work_s += request.work_s
        self.waiting_prompt_tokens += request.prompt_tokens
        self._refresh_utilization()

    def remove_waiting(self, request: SimRequest, now_s: float) -> None:
        self.account(now_s)
        self.waiting.remove(request)
        self.waiting_work_s -= request.work_s
        self.waiting_prompt_tokens -= request.prompt_tokens
        request.instance = None
        self._refresh_utilization()

    def remove_running(self, request: SimRequest, now_s: float) -> int:
        """Take a running request out of the batch (live migration); returns its KV tokens.

        The step in progress is lost for everyone: the batch is re-formed at ``now_s``.
        """
        self.account(now_s)
        self.sync(now_s)
        generated = request.generated_at_join + (self.steps_done - request.join_step)
        self._leave(request)
        request.generated_at_join = generated
        request.join_token = -1
        self.anchor_s = now_s
        if not self.n_running and self.phase is Phase.DECODE:
            self.phase = Phase.IDLE  # it moved the last running request away
        request.instance = None
        self._refresh_utilization()
        return request.prompt_tokens + generated

    def _leave(self, request: SimRequest) -> None:
        self.n_running -= 1
        self.kv_base -= request.prompt_tokens + request.generated_at_join - request.join_step
        self.reserved_tokens -= request.prompt_tokens + request.output_tokens
        self._uncount(request)

    def sync(self, now_s: float) -> None:
        """Count the decode steps finished by ``now_s`` (the anchor moves to the last one)."""
        if self.phase is not Phase.DECODE or not self.n_running:
            return
        n = self.n_running
        kv = self.kv_base + n * self.steps_done
        steps = self.perf.steps_within(n, kv, now_s - self.anchor_s + _STEP_SLACK_S)
        if steps:
            self.anchor_s += self.perf.decode_steps_s(n, kv, steps)
            self.steps_done += steps
            if self.view is not None:
                self.view = None
                self.changed.append(self)

    # -- iterations ----------------------------------------------------------------------

    def wake(self, now_s: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Carry the instance forward to ``now_s``.

        Returns the requests that finished, and (prefill-only workers) the requests
        whose prefill finished and that must move to a decode worker.
        """
        self.account(now_s)
        finished: list[SimRequest] = []
        handoffs: list[SimRequest] = []
        if self.phase is Phase.PREFILL:
            if now_s + 1e-12 < self.busy_until_s:
                return finished, handoffs
            done_s = self.busy_until_s
            batch, self.prefilling = self.prefilling, []
            self.prefill_tokens = 0
            for request in batch:
                self._prefilled(request, done_s, finished, handoffs)
            self.prefill_work_s = 0.0  # the whole prefill batch ends at once
            self.phase = Phase.DECODE if self.n_running else Phase.IDLE
            self.anchor_s = done_s
        elif self.phase is Phase.DECODE:
            self.sync(now_s)
            heap = self._heap
            steps_done = self.steps_done
            while heap:
                finish_step, token, request = heap[0]
                # _stale written out: this loop runs on every decode wake-up.
                if request.instance is self and token == request.join_token:
                    if finish_step > steps_done:
                        break
                    heapq.heappop(heap)
                else:
                    heapq.heappop(heap)
                    continue
                self._leave(request)
                request.finished_s = self.anchor_s
                request.instance = None
                finished.append(request)
            if not self.n_running:
                self.phase = Phase.IDLE
        self._admit(now_s)
        self._refresh_utilization()
        return finished, handoffs

    def list_queued(
        self, into: list[QueuedRequestView], waiting_tail: int | None, running: bool
    ) -> None:
        """Append this worker's queued requests as a rebalancer sees them: the last
        ``waiting_tail`` waiting (all when None), then the running batch if asked."""
        waiting = _tail(self.waiting, waiting_tail)
        worker_id = self.worker_id
        phase = RequestPhase.WAITING
        # Work ahead of the first listed: the batch, then every waiting request before
        # it (the queue's whole predicted work less the listed ones', those summed in
        # queue order as sum() would).
        ahead_s = self.prefill_work_s + self.running_work_s() + self.waiting_work_s
        listed_s = 0.0
        for request in waiting:
            listed_s += request.work_s
        ahead_s -= listed_s
        for request in waiting:
            work_s = request.work_s
            generated = request.generated_at_join
            # QueuedRequestView's fields in order (view_builders: the same, built faster).
            into.append(
                new_queued_request_view(
                    request.view,
                    worker_id,
                    phase,
                    request.queued_at_s,
                    ahead_s if ahead_s > 0.0 else 0.0,  # work_ahead_s
                    work_s,  # remaining_s
                    # kv_tokens: its KV cache when it brings one (migrated, handed off).
                    request.prompt_tokens + generated if generated > 0 else 0,
                    0,  # generated_tokens: none listed while waiting
                )
            )
            ahead_s += work_s
        if running and self.phase is Phase.DECODE:
            for request in self.running_requests():
                generated = request.generated_at_join + self.steps_done - request.join_step
                into.append(
                    new_queued_request_view(
                        request.view,
                        worker_id,
                        RequestPhase.RUNNING,
                        request.queued_at_s,
                        0.0,  # work_ahead_s
                        self.remaining_work_s(request),
                        request.prompt_tokens + generated,  # kv_tokens
                        generated,
                    )
                )

    def running_requests(self) -> list[SimRequest]:
        """The requests of the running batch (not those prefilling)."""
        return [entry[2] for entry in self._heap if not self._stale(entry)]

    def _stale(self, entry: tuple[int, int, SimRequest]) -> bool:
        return entry[2].instance is not self or entry[1] != entry[2].join_token

    def _prefilled(
        self,
        request: SimRequest,
        at_s: float,
        finished: list[SimRequest],
        handoffs: list[SimRequest],
    ) -> None:
        """``request``'s prefill ended at ``at_s``, with its first token: a one-token
        answer is finished (on a prefill-only worker too, as a live one ends it), a
        prefill-only worker hands any other off, and any other joins the decode batch."""
        request.first_token_s = at_s
        request.generated_at_join = 1
        if request.output_tokens <= 1:
            self.reserved_tokens -= request.prompt_tokens + request.output_tokens
            request.finished_s = at_s
            request.instance = None
            finished.append(request)
        elif self.role is WorkerRole.PREFILL:
            self.reserved_tokens -= request.prompt_tokens + request.output_tokens
            request.instance = None
            handoffs.append(request)
        else:
            self._join(request)

    def _join(self, request: SimRequest) -> None:
        """Add a request whose prefill is done (or that arrived with its KV) to the batch."""
        request.join_step = self.steps_done
        self.n_running += 1
        self.kv_base += request.prompt_tokens + request.generated_at_join - self.steps_done
        finish_step = self.steps_done + request.output_tokens - request.generated_at_join
        self._joins += 1
        request.join_token = self._joins
        heapq.heappush(self._heap, (finish_step, self._joins, request))
        self._count(request)

    def _admit(self, now_s: float) -> None:
        if self.phase is Phase.PREFILL or not self.waiting:
            return
        perf = self.perf
        prompts: list[int] = []
        budget = perf.max_batched_tokens
        resumed = False
        while self.waiting and self._can_admit_head():
            request = self.waiting[0]
            blocks = request.prefix_blocks
            new_tokens = request.prompt_tokens
            if blocks and not request.has_kv:
                matched = self.prefix_cache.matched_blocks(blocks)
                new_tokens -= cached_tokens(matched, request.prompt_tokens)
            if not request.has_kv and prompts and sum(prompts) + new_tokens > budget:
                break
            self._take_head(now_s)
            if request.has_kv:
                # A migrated or handed-off request brings its KV cache: no prefill.
                if self.phase is Phase.DECODE:
                    self.sync(now_s)
                self._join(request)
                resumed = True
            else:
                request.prefill_s = now_s
                self.prefill_work_s += request.work_s
                self.prefilling.append(request)
                self.prefill_tokens += request.prompt_tokens
                if blocks:
                    self.prefix_cache.use(blocks)
                prompts.append(new_tokens)
        if prompts:
            self.sync(now_s)
            self.phase = Phase.PREFILL
            self.busy_until_s = now_s + perf.prefill_s(prompts)
        elif resumed:
            self.phase = Phase.DECODE
            self.anchor_s = now_s

    def next_wake_s(self, now_s: float) -> float | None:
        """When the instance next needs :meth:`wake` (``None``: not until something arrives)."""
        if self.phase is Phase.PREFILL:
            return self.busy_until_s
        if self.phase is Phase.IDLE:
            return now_s if self.waiting and self._can_admit_head() else None
        n = self.n_running
        kv = self.kv_base + n * self.steps_done
        if self.waiting and self._can_admit_head():
            # The head can join once the step in progress ends.
            steps = self.perf.steps_within(n, kv, now_s - self.anchor_s + _STEP_SLACK_S)
            return self.anchor_s + self.perf.decode_steps_s(n, kv, steps + 1)
        heap = self._heap
        while heap:
            finish_step, token, request = heap[0]
            if request.instance is self and token == request.join_token:
                steps_left = finish_step - self.steps_done
                return self.anchor_s + self.perf.decode_steps_s(
                    n, kv, steps_left if steps_left > 0 else 0
                )
            heapq.heappop(heap)  # stale (see _stale)
        return None

    def _take_head(self, now_s: float) -> SimRequest:
        """Admit the waiting queue's head at ``now_s`` (it fits: :meth:`_can_admit_head`):
        out of the queue, its prompt and whole output reserved in the KV cache."""
        request = self.waiting.popleft()
        self.waiting_work_s -= request.work_s
        self.waiting_prompt_tokens -= request.prompt_tokens
        self.reserved_tokens += request.prompt_tokens + request.output_tokens
        if request.started_s < 0.0:
            request.started_s = now_s
        return request

    def _can_admit_head(self) -> bool:
        request = self.waiting[0]
        return (
            self.n_running + len(self.prefilling) < self.perf.max_batch_slots
            and self.reserved_tokens + request.prompt_tokens + request.output_tokens
            <= self.perf.kv_capacity_tokens
        )


def worker_view(inst: SimInstance, chunked_prefill_tokens: int | None) -> WorkerView:
    """The worker as policies see it, as of its last change (like a worker that reports on
    every change: its running requests' predicted work left is as of that moment)."""
    perf = inst.perf
    n_running = inst.n_running
    kv_running = inst.kv_base + n_running * inst.steps_done
    kv = kv_running + inst.prefill_tokens
    # WorkerView's fields in order (see view_builders: the same object, built faster).
    return new_worker_view(
        inst.worker_id,
        inst.worker_type,
        inst.role,
        True,  # alive
        len(inst.waiting) + inst.incoming,
        n_running + len(inst.prefilling),
        perf.max_batch_slots,
        kv,
        perf.kv_capacity_tokens,
        inst.queued_work_s() + inst.incoming_work_s,
        inst.waiting_prompt_tokens + kv,
        inst.util_now,
        perf.decode_step_s(n_running, kv_running) if n_running else 0.0,
        perf.decode_per_seq_s,
        perf.decode_per_kv_token_s,
        perf.kv_bytes_per_token,
        perf.interconnect_bytes_per_s,
        perf.prefill_per_token_s,
        perf.prefill_per_token_sq_s,
        perf.prefill_base_s,
        chunked_prefill_tokens,
        # in chunks, prefill_tokens is the KV the chunks made so far, not an iteration's
        inst.prefill_tokens if chunked_prefill_tokens is None else 0,
    )


def _tail(waiting: deque[SimRequest], count: int | None) -> list[SimRequest]:
    """The last ``count`` waiting requests in queue order (all when ``count`` is None),
    read from the back so a long queue costs only what is listed."""
    if count is None or count >= len(waiting):
        return list(waiting)
    tail = list(islice(reversed(waiting), count))
    tail.reverse()
    return tail
