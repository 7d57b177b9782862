"""The worker's answers: recorded in the request ledger, then sent to the replica that asked.

The engine hands each finished (or failed) request's :class:`Completion` to
:meth:`AnswerOutbox.put` and goes on with its batch. :meth:`AnswerOutbox.flush_routine`
takes whatever has gathered, records it in one round trip
(:meth:`~switchyard.lifecycle.RequestLedger.finish_many`: fenced by epoch and worker),
then publishes each recorded answer to the ``reply_partition`` of its request on
``switchyard.answers``, in its request's trace. While one flush is in flight the next
answers gather, so the batch grows with the load and no timer adds latency.

An answer the ledger refuses as *superseded* (the request was re-assigned or moved while
this worker ran it: it had been declared dead, frozen, or cut off) is discarded and
counted, never published. Recording comes first: once the caller has its answer, the
record has it too, and a retry with the same id or ``GET /v1/requests/{id}`` finds it
even if the publish is lost. A store or broker outage is retried with backoff; drain
waits for everything gathered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from switchyard.contracts.messages import Completion
from switchyard.contracts.topics import ANSWERS
from switchyard.errors import is_retriable
from switchyard.lifecycle import RequestLedger
from switchyard.runtime.connections import backoff_s
from switchyard.runtime.service import ServiceContext

log = logging.getLogger(__name__)

_PUBLISH_ATTEMPTS = 8


@dataclass(slots=True)
class _Pending:
    completion: Completion
    reply_partition: int | None
    trace: Context | None


class AnswerOutbox:
    """Answers on their way to the ledger and to the asking replicas.

    Args:
        ctx: the worker's context (bus, state, stopping).
        ledger: where answers are recorded.
        on_superseded: called with a discarded answer (for metrics and logs).
        fenced: answers are a worker's (fenced by worker id as well as epoch); the
            scheduler's own answers are fenced by epoch only.
    """

    def __init__(
        self,
        ctx: ServiceContext,
        ledger: RequestLedger,
        *,
        on_superseded: Callable[[Completion], None] | None = None,
        fenced: bool = True,
    ) -> None:
        self.ctx = ctx
        self.ledger = ledger
        self._on_superseded = on_superseded
        self._fenced = fenced
        self._pending: list[_Pending] = []
        self._arrived = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self.published = 0
        self.superseded = 0

    def put(
        self, completion: Completion, reply_partition: int | None, trace: Context | None = None
    ) -> None:
        """Queue an answer; ``trace`` is the request's trace context to publish it in."""
        self._pending.append(_Pending(completion, reply_partition, trace))
        self._idle.clear()
        self._arrived.set()

    def __len__(self) -> int:
        return len(self._pending)

    async def flush_routine(self) -> None:
        """Record and publish what gathered, batch after batch, until :meth:`close` was
        called and nothing is left."""
        while True:
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            batch, self._pending = self._pending, []
            try:
                await self._flush(batch)
            except BaseException:
                self._pending[:0] = batch  # not recorded: keep their place
                raise

    async def close(self) -> None:
        """Wait until everything put so far is recorded and published, then let the flush
        routine leave (call once nothing more will be put)."""
        self._closing = True
        self._arrived.set()
        await self._idle.wait()

    async def _flush(self, batch: list[_Pending]) -> None:
        results, retried = await self._record([p.completion for p in batch])
        acks: list[Awaitable[object]] = []
        for pending, result in zip(batch, results, strict=True):
            completion = pending.completion
            if result == "superseded":
                self.superseded += 1
                log.warning(
                    "answer of %s (epoch %d) discarded: the request was given to another "
                    "worker or epoch while it ran here",
                    completion.request_id,
                    completion.epoch,
                    extra={"request_id": completion.request_id, "epoch": completion.epoch},
                )
                if self._on_superseded is not None:
                    self._on_superseded(completion)
                continue
            if pending.reply_partition is None:
                continue  # nobody waits on the bus (it is in the record)
            if result == "duplicate" and not retried:
                continue  # answered before: the caller had that answer
            # A "duplicate" after a retried round trip is most likely this answer, recorded
            # by the attempt whose reply was lost: the caller still waits for it.
            acks.append(self._publish(pending))
        if acks:
            await asyncio.gather(*acks)

    async def _record(self, completions: list[Completion]) -> tuple[list[str], bool]:
        """The ledger's result for each, and whether a failed round trip came first
        (whose writes may have been made: its "duplicate"s are then these answers)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                results = await self.ledger.finish_many(completions, worker_fenced=self._fenced)
                return list(results), attempt > 1
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                log.warning("recording %d answers failed, retrying: %s", len(completions), exc)
                await asyncio.sleep(backoff_s(attempt))

    async def _publish(self, pending: _Pending) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                token = otel_context.attach(pending.trace) if pending.trace is not None else None
                try:
                    sent = await self.ctx.bus.send(
                        ANSWERS, pending.completion, partition=pending.reply_partition
                    )
                finally:
                    if token is not None:
                        otel_context.detach(token)
                await sent
                self.published += 1
                return
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                if attempt >= _PUBLISH_ATTEMPTS:
                    # The answer is in its record: a retry or a status poll finds it.
                    log.error(
                        "the answer of %s could not be published (it is recorded): %s",
                        pending.completion.request_id,
                        exc,
                    )
                    return
                await asyncio.sleep(backoff_s(attempt))
