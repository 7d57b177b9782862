"""What a worker's backend reports, turned into spans, output chunks, answers and metrics.

:class:`Reporter` is the :class:`~services.worker.backends.base.ExecutionSink` the engine
reports to. A started request gets its execution span (``execute {model}``, a child of
the context its assignment was taken in); a streamed request's tokens go out as
:class:`OutputChunk`\\ s every :data:`CHUNK_TOKENS` tokens, to the partition of
``switchyard.answers`` its ingress replica reads, queued in order (one producer, one
partition: the chunks arrive before the answer, which follows the same path after its
record is written); a request prefilled for its decode worker is handed on
(:meth:`~services.worker.intake.Intake.hand_off`, off the engine); a finished or failed
request's :class:`Completion` goes to the :class:`~services.worker.answers.AnswerOutbox`;
a finished LLM request's execution time joins the observations the predictor learns
from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from opentelemetry import trace
from switchyard import __version__
from switchyard.bus import Bus
from switchyard.contracts.messages import (
    Completion,
    CompletionStatus,
    LLMPayload,
    OutputChunk,
    RequestTimeline,
    ServiceObservation,
)
from switchyard.contracts.topics import ANSWERS
from switchyard.errors import is_retriable
from switchyard.runtime.connections import backoff_s
from switchyard.telemetry import Telemetry

from services.worker.answers import AnswerOutbox
from services.worker.backends.base import Backend, Preemption, Result
from services.worker.holdings import Holdings
from services.worker.queue import WorkItem
from services.worker.telemetry import SCOPE, WorkerMetrics

CHUNK_TOKENS = 1
"""A streamed request gets an output chunk once it has this many new tokens (and at its
end): with 1, a chunk for every engine iteration that gave it tokens, as vLLM streams,
so a client sees each token's pace (inter-token latency)."""

MAX_OBSERVATIONS = 10_000
"""Most observations kept between two publishes (the oldest are dropped beyond)."""

log = logging.getLogger("switchyard.worker")


class Reporter:
    """The backend's sink: spans, chunks, answers, observations, metrics.

    Args:
        holdings: the worker's held requests (finished ones leave).
        backend: the worker's backend (a callable: it is built at start).
        bus: where output chunks go.
        outbox: where answers go.
        metrics: the worker's metrics.
        telemetry: the tracer provider of execution spans.
        clock: wall seconds.
    """

    def __init__(
        self,
        holdings: Holdings,
        backend: Callable[[], Backend],
        bus: Bus,
        outbox: AnswerOutbox,
        metrics: WorkerMetrics,
        telemetry: Telemetry,
        *,
        hand_off: Callable[[WorkItem, Preemption], Coroutine[Any, Any, None]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.holdings = holdings
        self._backend = backend
        self.bus = bus
        self.outbox = outbox
        self.metrics = metrics
        self.clock = clock
        self._tracer = trace.get_tracer(SCOPE, __version__, telemetry.tracer_provider)
        self._observations: list[ServiceObservation] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._hand_off = hand_off
        self._handing: set[asyncio.Task[None]] = set()

    # -- the sink ------------------------------------------------------------------------

    async def started(self, items: Sequence[WorkItem]) -> None:
        now_s = self.clock()
        emulated = self._backend().emulated
        for item in items:
            if item.started_s is None:
                item.started_s = now_s
            if item.span is None:
                item.span = self._tracer.start_span(
                    f"execute {item.key.model}",
                    context=item.trace_context,
                    attributes={
                        "switchyard.worker_id": self.holdings.worker_id,
                        "switchyard.model": item.key.model,
                        "switchyard.variant": item.key.variant,
                        "switchyard.request_id": item.request_id,
                        "switchyard.epoch": item.epoch,
                        "switchyard.batch_size": len(items),
                        "switchyard.emulated": emulated,
                    },
                )
        if items:
            self.metrics.batch_started(len(items))

    async def tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        if new_tokens and item.first_token_s is None:
            item.first_token_s = self.clock()
        if not item.streaming:
            return
        item.pending_chunk_tokens += new_tokens
        if text:
            item.pending_chunk_text.append(text)
        if item.pending_chunk_tokens >= CHUNK_TOKENS:
            await self._flush_chunk(item)

    async def finished(self, item: WorkItem, result: Result) -> None:
        if item.streaming and (item.pending_chunk_tokens or item.pending_chunk_text):
            await self._flush_chunk(item)
        self._answer(item, CompletionStatus.OK, result=result)
        self._observe(item)

    async def failed(self, item: WorkItem, error: str) -> None:
        self._answer(item, CompletionStatus.FAILED, error=error)

    async def prefill_done(self, item: WorkItem, handoff: Preemption) -> None:
        if item.streaming and (item.pending_chunk_tokens or item.pending_chunk_text):
            await self._flush_chunk(item)  # the first token goes out from here
        if self._hand_off is None:
            raise RuntimeError("this worker's reporter was given no hand-off")
        # Off the engine: the move's ledger round trip must not stall the batch.
        task = asyncio.create_task(self._hand_off(item, handoff))
        self._handing.add(task)
        task.add_done_callback(self._handed)

    def _handed(self, task: asyncio.Task[None]) -> None:
        self._handing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a hand-off to a decode worker failed: %s", exc)

    # -- answers -------------------------------------------------------------------------

    def _answer(
        self,
        item: WorkItem,
        status: CompletionStatus,
        *,
        result: Result | None = None,
        error: str | None = None,
    ) -> None:
        self.holdings.forget(item)
        finished_s = self.clock()
        execution_s = None if item.started_s is None else finished_s - item.started_s
        self.metrics.executed(status, item.key.model, execution_s)
        completion = self.completion(item, status, finished_s, result=result, error=error)
        # Published in the request's trace: under its execution span.
        context = item.trace_context
        if item.span is not None:
            context = trace.set_span_in_context(item.span, context)
        self.outbox.put(completion, item.request.reply_partition, context)
        span, item.span = item.span, None
        if span is not None:
            if error is not None and span.is_recording():
                span.set_status(trace.Status(trace.StatusCode.ERROR, error[:200]))
            span.end()

    def completion(
        self,
        item: WorkItem,
        status: CompletionStatus,
        finished_s: float,
        *,
        result: Result | None = None,
        error: str | None = None,
    ) -> Completion:
        """The answer of ``item``."""
        assignment = item.assignment
        request = assignment.request
        backend = self._backend()
        return Completion(
            request_id=request.request_id,
            app=request.app,
            worker_id=self.holdings.worker_id,
            worker_type=item.ran_on or backend.worker_type,
            variant=assignment.variant,
            epoch=assignment.epoch,
            status=status,
            result=result,
            error=None if error is None else error[:2000],
            timeline=RequestTimeline(
                arrival_s=request.arrival_s,
                assigned_s=assignment.decided_at_s,
                started_s=item.started_s,
                first_token_s=item.first_token_s,
                finished_s=finished_s,
            ),
            deadline_s=assignment.deadline_s
            if assignment.deadline_s is not None
            else request.deadline_s,
            emulated=backend.emulated,
            reply_to=request.reply_to,
        )

    # -- streamed output -----------------------------------------------------------------

    async def _flush_chunk(self, item: WorkItem) -> None:
        request = item.request
        chunk = OutputChunk(
            request_id=item.request_id,
            epoch=item.epoch,
            index=item.chunk_index,
            text="".join(item.pending_chunk_text),
            tokens=item.pending_chunk_tokens,
            reply_to=request.reply_to,
            emulated=self._backend().emulated,
            sent_at_s=self.clock(),
        )
        item.chunk_index += 1
        item.pending_chunk_tokens = 0
        item.pending_chunk_text.clear()
        if request.reply_partition is None:
            return  # nobody streams it on the bus
        with item.in_trace():
            # Queued in order on one producer and one partition; the engine goes on
            # while the broker acknowledges, and drain waits for the acknowledgements.
            try:
                acknowledged = await self.bus.send(
                    ANSWERS, chunk, partition=request.reply_partition
                )
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                await self._retry(chunk, request.reply_partition)
                return
        task = asyncio.create_task(_awaited(acknowledged))
        self._sending.add(task)
        task.add_done_callback(self._sent)

    async def _retry(self, chunk: OutputChunk, partition: int, attempts: int = 8) -> None:
        for attempt in range(1, attempts + 1):
            await asyncio.sleep(backoff_s(attempt))
            try:
                await self.bus.publish(ANSWERS, chunk, partition=partition)
                return
            except Exception as exc:
                if not is_retriable(exc) or attempt == attempts:
                    log.error("an output chunk of %s was lost: %s", chunk.request_id, exc)
                    return

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("an output chunk could not be published: %s", exc)

    async def sent(self) -> None:
        """Wait for every hand-off in progress and every output chunk on its way to the
        broker."""
        if self._handing:
            await asyncio.gather(*self._handing, return_exceptions=True)
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    # -- observations --------------------------------------------------------------------

    def _observe(self, item: WorkItem) -> None:
        payload = item.request.payload
        backend = self._backend()
        if not isinstance(payload, LLMPayload) or item.started_s is None:
            return
        execution_s = self.clock() - item.started_s
        # Worker types are GPU/model, as the predictor keys them (an emulated worker's
        # profile name).
        device = (item.ran_on or backend.worker_type).partition("/")[0]
        self._observations.append(
            ServiceObservation(
                worker_type=f"{device}/{item.assignment.variant}",
                model=item.assignment.variant,
                prompt_tokens=max(1, item.prompt_tokens),
                workload=payload.workload,
                output_tokens_hint=payload.output_tokens_hint,
                raw_predicted_s=item.assignment.predicted_raw_s,
                execution_s=max(0.0, execution_s),
            )
        )
        if len(self._observations) > MAX_OBSERVATIONS:
            del self._observations[: len(self._observations) - MAX_OBSERVATIONS]

    def take_observations(self) -> list[ServiceObservation]:
        """The observations gathered since the last call (for the predictor)."""
        taken, self._observations = self._observations, []
        return taken


async def _awaited(acknowledgement: Awaitable[object]) -> None:
    await acknowledgement
