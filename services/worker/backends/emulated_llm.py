"""The emulated LLM backend: continuous batching that spends modelled time.

It runs no model. It plays a vLLM-like engine for one performance profile
(``GPU/model``, :mod:`switchyard.perf`) exactly as the simulator's instance
(:mod:`research.llm.instance`) does, but in real time:

- between iterations it admits waiting requests in queue order while a slot is free and
  the KV cache can reserve the request's prompt plus its whole output, within the
  prefill token budget (:func:`~services.worker.batching.admit_continuous`);
- an iteration that admitted requests is a *prefill* of their contexts and yields each
  one's next token (the first, for a fresh request); the running batch does not decode
  meanwhile. The leading blocks of a prompt that this worker's prefix cache holds
  (``LLMPayload.prefix_blocks``, :mod:`switchyard.perf.prefix_cache`) are not
  prefilled again;
- otherwise the iteration is one *decode step* of the running batch, one token for each;
- each iteration sleeps ``modelled_s / time_scale`` (one sleep per iteration, paced
  against a running target so that sleep overshoot does not accumulate);
- decode steps of an unchanged batch are slept as one group, up to the next finish
  (at most :data:`GROUP_MAX_WALL_S` of wall time), so an idle-looking engine costs a
  wake-up per event instead of one per step. Given the worker's ``wake`` event, a group
  ends at the first step boundary after new work arrives, as a real engine admits at
  its next iteration; without one (or while a request streams its tokens), groups last
  at most :data:`STEP_QUANTUM_WALL_S`.

With a chunked-prefill budget (``chunked_prefill_tokens``, the worker's
``SWITCHYARD_WORKER_CHUNKED_PREFILL_TOKENS``; vLLM's ``enable_chunked_prefill`` with
``max_num_batched_tokens``) it plays the simulator's :mod:`research.llm.chunked` instead:
while a prompt is being prefilled, each iteration decodes one token for every running
request, gives the partly prefilled prompts (in admission order) the next chunk of what
the budget has left, and admits waiting requests in queue order while budget, a slot and
KV-cache memory are left, each taking a chunk; it lasts
:meth:`PerformanceModel.mixed_iteration_s`. A prompt's first token comes at the end of
the iteration that prefills its last chunk. With nothing to prefill, it decodes in
groups as above.

An emulated request generates exactly ``max_output_tokens`` (there is no end of sequence
in an emulation, as with a benchmark's ``ignore_eos``). Its text is filler, one word a
token (:func:`emulated_text`: " lorem ipsum dolor sit amet" repeated), so that a
streamed answer shows its length and pace to a client or a benchmark tool that counts
what it reads; it is not a model's output, and the answer says ``emulated``. A request
with ``choices`` (a pipeline's judge stage) answers one of their labels, drawn by their
shares from its request id (:func:`emulated_result`). A request that comes with its KV
cache (``generated_tokens = g > 0``: moved while running, or handed on after its
prefill) joins the running batch without a prefill, as the simulator's does, and goes
on from token g + 1; its ``not_before_s`` held it back for the modelled transfer.

Prefill/decode disaggregation: a request whose assignment names a decode worker
(``Assignment.decode``) leaves the batch once its prefill gave its first token, with the
KV cache of its prompt and that token, and the sink hands it on
(:meth:`~services.worker.backends.base.ExecutionSink.prefill_done`); the transfer takes
the profile's ``kv_transfer_s``, as in the simulator.

Everything it reports is the performance model's output, not a measurement: the worker
labels every completion, chunk and heartbeat of this backend ``emulated``. Durations in
heartbeats are wall seconds (modelled seconds divided by the time scale), so that they
compare with the wall-clock timelines of completions the predictor learns from.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from switchyard.contracts.fields import PREFIX_BLOCK_TOKENS
from switchyard.contracts.messages import Assignment, LLMPayload, LLMResult, ResourceVector
from switchyard.multimodel.branching import label_at, unit_of
from switchyard.perf import PerformanceModel
from switchyard.perf.prefix_cache import PrefixCache, cached_tokens

from services.worker.backends.base import (
    BackendLoad,
    ExecutionSink,
    Preemption,
    UnsupportedWorkError,
    WorkSpec,
)
from services.worker.backends.prefill_share import PrefillShare
from services.worker.batching import admit_continuous, kv_reservation_tokens
from services.worker.queue import BatchKey, EmulatedTimes, LocalQueue, WorkItem

_FILLER_WORDS = (" lorem", " ipsum", " dolor", " sit", " amet")


def emulated_text(first_token: int, tokens: int) -> str:
    """The filler text of tokens ``first_token`` .. ``first_token + tokens - 1`` of an
    emulated answer: one word a token, the same on every worker (a migrated request's
    text continues where it left off)."""
    return "".join(
        _FILLER_WORDS[index % len(_FILLER_WORDS)]
        for index in range(first_token, first_token + tokens)
    )


def emulated_result(item: WorkItem) -> LLMResult:
    """An emulated request's answer: its filler text, or for a request with ``choices``
    the label drawn by their shares from the request id (a re-run answers as it did)."""
    payload = item.request.payload
    if isinstance(payload, LLMPayload) and payload.choices:
        label = label_at(tuple(payload.choices.items()), unit_of(item.request_id))
        return LLMResult(output_tokens=item.output_tokens, text=label, label=label)
    return LLMResult(output_tokens=item.output_tokens, text=emulated_text(0, item.output_tokens))


@dataclass(slots=True)
class _Prefilling:
    """A request admitted under chunked prefill whose prompt is not all prefilled yet."""

    item: WorkItem
    context_tokens: int
    """Context tokens whose KV cache it has: earlier chunks and a cached prefix."""
    left_tokens: int
    """Context tokens still to prefill."""


class EmulatedLlmBackend:
    """Continuous batching on :class:`PerformanceModel` ``perf``, ``time_scale`` times faster
    than modelled; with ``chunked_prefill_tokens``, chunked prefill at that token budget
    per iteration. Its load reports the share of its busy time its prefills took
    (:mod:`services.worker.backends.prefill_share`), smoothed on ``clock``.

    Attributes:
        modelled_now_s: the modelled clock: modelled seconds spent in iterations so far.
        iterations: how many iterations (prefills, mixed iterations plus decode groups) ran.

    Raises:
        ValueError: a time scale that is not positive, or a chunked-prefill budget that
            cannot cover the profile's batch slots.
    """

    name = "emulated-llm"
    emulated = True

    def __init__(
        self,
        perf: PerformanceModel,
        *,
        time_scale: float = 1.0,
        chunked_prefill_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        if chunked_prefill_tokens is not None:
            problem = perf.chunk_budget_problem(chunked_prefill_tokens)
            if problem is not None:
                raise ValueError(problem)
        self.perf = perf
        self.time_scale = time_scale
        self.chunked_prefill_tokens = chunked_prefill_tokens
        self.modelled_now_s = 0.0
        self.iterations = 0
        self._running: dict[str, WorkItem] = {}
        # Chunked prefill: the running requests still prefilling, in admission order.
        self._prefilling: dict[str, _Prefilling] = {}
        self.prefix_cache = PrefixCache(perf.kv_capacity_tokens // PREFIX_BLOCK_TOKENS)
        self._reserved_tokens = 0
        self._pace_s: float | None = None  # loop time the current iteration should end at
        self._prefill_modelled_s = 0.0  # modelled seconds of prefill iterations begun
        self._prefilling_tokens = 0  # prompt tokens of the whole-prompt prefill under way
        self._share = PrefillShare()
        self._clock = clock  # when the prefill share is read (monotonic seconds)
        self._interrupt: asyncio.Event | None = None  # the wake event of a group in progress

    # -- identity -----------------------------------------------------------------------------

    @property
    def worker_type(self) -> str:
        return self.perf.gpu

    @property
    def profile(self) -> str | None:
        return self.perf.name

    def servable_models(self) -> list[str]:
        return [self.perf.model]

    def resident_models(self) -> list[str]:
        # Emulated weights are resident from the start: there is nothing to swap in.
        return [self.perf.model]

    def wall_s(self, modelled_s: float) -> float:
        return modelled_s / self.time_scale

    # -- intake -------------------------------------------------------------------------------

    def describe(self, assignment: Assignment) -> WorkSpec:
        payload = assignment.request.payload
        if not isinstance(payload, LLMPayload):
            raise UnsupportedWorkError(
                f"this worker emulates LLM profile {self.perf.name} and serves only LLM "
                f"requests for model {self.perf.model!r}; got a {payload.kind.value} request "
                f"for application {assignment.request.app!r}"
            )
        if payload.model != self.perf.model:
            raise UnsupportedWorkError(
                f"this worker emulates profile {self.perf.name} and serves model "
                f"{self.perf.model!r}, not {payload.model!r}"
            )
        prompt = payload.prompt_tokens
        output = payload.max_output_tokens
        generated = assignment.generated_tokens
        if generated >= output:
            raise UnsupportedWorkError(
                f"request already generated {generated} of its {output} output tokens"
            )
        if prompt + output > self.perf.kv_capacity_tokens:
            raise UnsupportedWorkError(
                f"request needs {prompt + output} KV-cache tokens (prompt {prompt} + output "
                f"{output}), more than the {self.perf.kv_capacity_tokens} of profile "
                f"{self.perf.name}"
            )
        if generated:  # its KV cache comes with it: decode steps only
            estimate_s = self.perf.decode_steps_s(1, prompt + generated, output - generated)
        else:
            estimate_s = self.perf.idle_service_s(prompt, output)
        return WorkSpec(
            key=BatchKey(self.perf.model, assignment.variant),
            prompt_tokens=prompt,
            output_tokens=output,
            estimate_s=self.wall_s(estimate_s),
        )

    # -- execution ----------------------------------------------------------------------------

    def has_running(self) -> bool:
        return bool(self._running)

    async def step(
        self,
        queue: LocalQueue,
        sink: ExecutionSink,
        *,
        admit: bool,
        wake: asyncio.Event | None = None,
    ) -> bool:
        if not self._running:
            self._pace_s = None  # idle until now: pacing starts afresh
        if self.chunked_prefill_tokens is not None:
            if await self._mixed_iteration(queue, sink, admit=admit):
                return True
        elif admit and (ready := queue.ready(time.time())):
            admitted = admit_continuous(
                ready,
                free_slots=self.perf.max_batch_slots - len(self._running),
                kv_free_tokens=self.perf.kv_capacity_tokens - self._reserved_tokens,
                prefill_token_budget=self.perf.max_batched_tokens,
            )
            if admitted:
                await self._prefill(admitted, queue, sink)
                return True
        if self._running:
            await self._decode(sink, wake)
            return True
        return False

    async def _start(
        self, admitted: list[WorkItem], queue: LocalQueue, sink: ExecutionSink
    ) -> None:
        """Move ``admitted`` from the queue into the running batch, reserving their KV."""
        queue.take(admitted)
        now_s = self.modelled_now_s
        for item in admitted:
            self._running[item.request_id] = item
            self._reserved_tokens += kv_reservation_tokens(item)
            # One that brings its KV cache is past its first token: it only decodes.
            item.emulated = EmulatedTimes(
                started_s=now_s, first_token_s=now_s if item.brings_kv else None
            )
        await sink.started(admitted)

    async def _prefill(
        self, admitted: list[WorkItem], queue: LocalQueue, sink: ExecutionSink
    ) -> None:
        fresh = [item for item in admitted if not item.brings_kv]
        # Heartbeats read it from the requests' start to the prefill's end.
        self._prefilling_tokens = sum(item.prompt_tokens for item in fresh)
        try:
            await self._start(admitted, queue, sink)
            if not fresh:
                return  # they joined the batch with their KV caches: the next step decodes
            prefill_s = self.perf.prefill_s([self._uncached_tokens(i) for i in fresh])
            self._prefill_modelled_s += prefill_s  # the batch's decode waits for it
            await self._spend(prefill_s)
        finally:
            self._prefilling_tokens = 0
        await self._yield_tokens(fresh, sink)

    async def _mixed_iteration(
        self, queue: LocalQueue, sink: ExecutionSink, *, admit: bool
    ) -> bool:
        """One chunked-prefill iteration (the module docstring), if there is a chunk to
        prefill; False when nothing is being prefilled and nothing could be admitted."""
        budget = self.chunked_prefill_tokens
        assert budget is not None
        decoding = [item for key, item in self._running.items() if key not in self._prefilling]
        room = budget - len(decoding)  # every running request decodes one token of it
        chunks: list[tuple[_Prefilling, int]] = []
        for part in self._prefilling.values():
            if room <= 0:
                break
            tokens = min(part.left_tokens, room)
            chunks.append((part, tokens))
            room -= tokens
        if admit and room > 0 and len(chunks) == len(self._prefilling):
            admitted: list[_Prefilling] = []
            joined: list[WorkItem] = []  # they bring their KV caches: no chunk to prefill
            kv_free_tokens = self.perf.kv_capacity_tokens - self._reserved_tokens
            free_slots = self.perf.max_batch_slots - len(self._running)
            for item in queue.ready(time.time()):
                need = kv_reservation_tokens(item)
                full = len(admitted) + len(joined) >= free_slots
                if full or need > kv_free_tokens or (room <= 0 and not item.brings_kv):
                    break  # queue order: the first that does not fit blocks the rest
                kv_free_tokens -= need
                if item.brings_kv:
                    joined.append(item)
                    continue
                new_tokens = self._uncached_tokens(item)
                part = _Prefilling(item, item.context_tokens - new_tokens, new_tokens)
                admitted.append(part)
                tokens = min(new_tokens, room)
                chunks.append((part, tokens))
                room -= tokens
            if admitted:
                self._prefilling.update((part.item.request_id, part) for part in admitted)
            if admitted or joined:
                await self._start(joined + [part.item for part in admitted], queue, sink)
        if not chunks:
            return False
        kv_tokens = sum(item.context_tokens for item in decoding)
        iteration_s = self.perf.mixed_iteration_s(
            [(part.context_tokens, tokens) for part, tokens in chunks], len(decoding), kv_tokens
        )
        # What the chunks add to the decode step is time the decoding requests wait.
        decode_s = self.perf.decode_step_s(len(decoding), kv_tokens) if decoding else 0.0
        self._prefill_modelled_s += max(0.0, iteration_s - decode_s)
        await self._spend(iteration_s)
        first_tokens: list[WorkItem] = []
        for part, tokens in chunks:
            key = part.item.request_id
            if self._prefilling.get(key) is not part:
                continue  # preempted during the iteration
            part.context_tokens += tokens
            part.left_tokens -= tokens
            if part.left_tokens <= 0:
                del self._prefilling[key]
                first_tokens.append(part.item)
        await self._yield_tokens(decoding + first_tokens, sink)
        return True

    def _uncached_tokens(self, item: WorkItem) -> int:
        """The tokens of ``item``'s prefill that its cached prefix does not spare."""
        payload = item.request.payload
        blocks = payload.prefix_blocks if isinstance(payload, LLMPayload) else []
        if not blocks:
            return item.context_tokens
        matched = self.prefix_cache.use(blocks)
        return item.context_tokens - cached_tokens(matched, item.context_tokens)

    async def _decode(self, sink: ExecutionSink, wake: asyncio.Event | None) -> None:
        """A group of decode steps of the running batch, slept as one: up to the first
        request's finish, within :data:`GROUP_MAX_WALL_S` of wall time (or
        :data:`STEP_QUANTUM_WALL_S` without ``wake`` or while a request streams).

        Sleeping once per step would cost more CPU than the stack it stands in for once a
        step lasts a fraction of a millisecond. Every finish time stays exact: a group
        never runs past a finish, and one that ``wake`` (new work) or a preemption
        interrupts ends at the boundary of the step in progress, so an arrival waits for
        at most one step, as it would in a real engine.
        """
        batch = list(self._running.values())
        size = len(batch)
        kv_tokens = sum(item.context_tokens for item in batch)
        steps_to_first_finish = min(item.output_tokens - item.generated_tokens for item in batch)
        long_groups = wake is not None and not any(item.streaming for item in batch)
        cap_wall_s = GROUP_MAX_WALL_S if long_groups else STEP_QUANTUM_WALL_S
        fit = self.perf.steps_within(size, kv_tokens, cap_wall_s * self.time_scale)
        steps = max(1, min(steps_to_first_finish, fit))
        if steps == 1 or wake is None:
            await self._spend(self.perf.decode_steps_s(size, kv_tokens, steps))
        else:
            steps = await self._spend_steps(size, kv_tokens, steps, wake)
        await self._yield_tokens(batch, sink, steps)

    async def _spend_steps(self, size: int, kv_tokens: int, steps: int, wake: asyncio.Event) -> int:
        """Sleep ``steps`` decode steps, or fewer when ``wake`` is set meanwhile: then up
        to the end of the step in progress. Returns the steps spent."""
        self._interrupt = wake
        loop = asyncio.get_running_loop()
        start = self._pace_start(loop.time())
        try:
            async with asyncio.timeout_at(
                start + self.wall_s(self.perf.decode_steps_s(size, kv_tokens, steps))
            ):
                await wake.wait()
        except TimeoutError:
            pass
        finally:
            self._interrupt = None
        elapsed_wall_s = max(0.0, loop.time() - start)
        planned_wall_s = self.wall_s(self.perf.decode_steps_s(size, kv_tokens, steps))
        if elapsed_wall_s - planned_wall_s > STALL_WALL_S:
            # The process was stopped meanwhile (SIGSTOP, a paused machine): an engine
            # that is stopped launches no further step, so only the one in progress ran.
            done = 1
        else:
            elapsed_s = elapsed_wall_s * self.time_scale  # modelled
            done = min(steps, self.perf.steps_within(size, kv_tokens, elapsed_s) + 1)
        modelled_s = self.perf.decode_steps_s(size, kv_tokens, done)
        self.modelled_now_s += modelled_s
        self.iterations += 1
        self._pace_s = start + self.wall_s(modelled_s)
        await asyncio.sleep(max(0.0, self._pace_s - loop.time()))
        return done

    async def _yield_tokens(
        self, batch: list[WorkItem], sink: ExecutionSink, steps: int = 1
    ) -> None:
        """``steps`` tokens for each request of ``batch`` still running (a request
        preempted during the iteration lost its steps, as in the simulator)."""
        now_s = self.modelled_now_s
        for item in batch:
            if self._running.get(item.request_id) is not item:
                continue
            first_new = item.generated_tokens
            item.generated_tokens += steps
            times = item.emulated or EmulatedTimes(started_s=now_s)
            if times.first_token_s is None:
                times = EmulatedTimes(started_s=times.started_s, first_token_s=now_s)
            done = item.generated_tokens >= item.output_tokens
            if done:
                times = EmulatedTimes(
                    started_s=times.started_s, first_token_s=times.first_token_s, finished_s=now_s
                )
                self._release(item)
            item.emulated = times
            await sink.tokens(item, steps, emulated_text(first_new, steps))
            if done:
                await sink.finished(item, emulated_result(item))
            elif item.assignment.decode is not None:
                # Prefilled here for a decode worker: it leaves with its KV cache.
                kv_tokens = item.context_tokens
                self._release(item)
                transfer_s = self.wall_s(self.perf.kv_transfer_s(kv_tokens))
                await sink.prefill_done(item, Preemption(item, kv_tokens, transfer_s))

    async def _spend(self, modelled_s: float) -> None:
        """Sleep the wall time of ``modelled_s``, paced: the target moves by exactly the
        scaled time each iteration, so a late wake-up shortens the next sleep."""
        self.modelled_now_s += modelled_s
        self.iterations += 1
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._pace_s = self._pace_start(now) + self.wall_s(modelled_s)
        await asyncio.sleep(max(0.0, self._pace_s - now))

    def _pace_start(self, now: float) -> float:
        """Loop time the next iteration starts at: where the last one should have ended,
        unless that is more than :data:`_MAX_LAG_S` ago."""
        if self._pace_s is None or self._pace_s < now - _MAX_LAG_S:
            return now
        return self._pace_s

    def _release(self, item: WorkItem) -> None:
        del self._running[item.request_id]
        self._prefilling.pop(item.request_id, None)
        self._reserved_tokens -= kv_reservation_tokens(item)

    def preempt(self, request_id: str) -> Preemption | None:
        item = self._running.get(request_id)
        if item is None:
            return None
        part = self._prefilling.get(request_id)
        # A prompt taken mid-prefill has the KV cache of its prefilled chunks only.
        kv_tokens = item.context_tokens if part is None else part.context_tokens
        self._release(item)
        if self._interrupt is not None:
            self._interrupt.set()  # the batch changed: end the group at the next step
        return Preemption(item, kv_tokens, self.wall_s(self.perf.kv_transfer_s(kv_tokens)))

    # -- reporting ------------------------------------------------------------------------------

    def remaining_s(self, item: WorkItem) -> float:
        """Wall seconds a running request still needs alone: its prefill when it has not
        produced a token here, then one decode step per token left."""
        left = item.output_tokens - item.generated_tokens
        if item.emulated is None or item.emulated.first_token_s is None:
            return self.wall_s(self.perf.idle_service_s(item.context_tokens, left))
        return self.wall_s(self.perf.decode_steps_s(1, item.context_tokens, left))

    def load(self, waiting: Sequence[WorkItem]) -> BackendLoad:
        perf = self.perf
        running = list(self._running.values())
        kv_tokens = sum(item.context_tokens for item in running)
        if waiting:
            utilization = 1.0
        else:
            utilization = max(
                len(running) / perf.max_batch_slots,
                self._reserved_tokens / perf.kv_capacity_tokens if perf.kv_capacity_tokens else 0.0,
            )
        utilization = min(1.0, utilization)
        free_kv_tokens = max(0, perf.kv_capacity_tokens - self._reserved_tokens)
        cpu = float(os.cpu_count() or 1)
        return BackendLoad(
            running=[(item, self.remaining_s(item)) for item in running],
            waiting_s=sum(item.estimate_s for item in waiting),
            utilization=utilization,
            max_slots=perf.max_batch_slots,
            kv_used_tokens=self._reserved_tokens,
            kv_capacity_tokens=perf.kv_capacity_tokens,
            running_kv_tokens=kv_tokens,
            decode_step_s=self.wall_s(perf.decode_step_s(len(running), kv_tokens)),
            prefill_share=self._share.update(
                self._clock(), self._prefill_modelled_s, self.modelled_now_s
            ),
            chunked_prefill_tokens=self.chunked_prefill_tokens,
            prefilling_tokens=self._prefilling_tokens,
            # The KV cache is the memory requests compete for; the GPUs are the instance's.
            capacity=ResourceVector(
                cpu=cpu,
                gpu=float(perf.tensor_parallel),
                mem_bytes=perf.kv_bytes(perf.kv_capacity_tokens),
            ),
            free=ResourceVector(
                cpu=cpu * (1.0 - utilization),
                gpu=perf.tensor_parallel * (1.0 - utilization),
                mem_bytes=perf.kv_bytes(free_kv_tokens),
            ),
            kv_cache_free_bytes=perf.kv_bytes(free_kv_tokens),
        )


STEP_QUANTUM_WALL_S = 0.002
"""The most wall time one group of decode steps may take when nothing can end it early
(no wake event) or a request streams its tokens (its chunks keep their pace)."""
GROUP_MAX_WALL_S = 0.05
"""The most wall time one group of decode steps may take otherwise: it bounds how stale
the generated-token counts a heartbeat reports can be."""
STALL_WALL_S = 1.0
"""A group of decode steps that wakes this much later than planned was stopped, not
late: the stop is not counted as progress."""
_MAX_LAG_S = 0.05
"""An iteration this far behind its pace target restarts the pacing instead of racing to
catch up (the loop was busy elsewhere, or the time scale asks for sleeps shorter than the
event loop can keep)."""
