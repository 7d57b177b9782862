"""A subscription (a consumer-group member, or a reader of given partitions): it decodes,
skips or dead-letters each record, hands it over, retries its handler and commits its
offset once handled. The delivery semantics are in :mod:`switchyard.bus.bus`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, cast

from switchyard.bus import codec
from switchyard.bus.delivery import Delivery, RecordFilter
from switchyard.bus.middleware import BusMiddleware, enter_all, exit_all
from switchyard.bus.records import Envelope, TopicPartition
from switchyard.bus.transport import Transport, TransportConsumer
from switchyard.contracts.base import Message
from switchyard.contracts.topics import Topic
from switchyard.errors import DecodeError, TransportError, is_retriable

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)

_FETCH_TIMEOUT_S = 0.2  # how long one fetch waits; bounds how fast a stop is noticed


@dataclass(frozen=True, slots=True)
class Backoff:
    """The wait before retry ``attempt`` (1 for the first): doubling from ``initial_s``,
    at most ``max_s``."""

    initial_s: float
    max_s: float

    def delay_s(self, attempt: int) -> float:
        return float(min(self.max_s, self.initial_s * 2 ** max(0, attempt - 1)))


class _Bus(Protocol):
    """What a subscription uses of its :class:`~switchyard.bus.bus.Bus` (which imports
    this module, so it is named here by its shape)."""

    transport: Transport
    topic_prefix: str
    client_id: str
    middlewares: tuple[BusMiddleware, ...]
    commit_interval_s: float
    backoff: Backoff
    max_batch: int
    record_counts: Counter[tuple[str, str, str]]
    _subscriptions: set[Subscription[Any]]

    def topic_name(self, topic: Topic[Any]) -> str: ...

    async def ensure_topics(self, topics: Iterable[Topic[Any]]) -> None: ...

    async def _dead_letter(
        self, envelope: Envelope, group: str, kind: str, reason: str
    ) -> None: ...


class Subscription(Generic[M]):
    """A consumer-group member reading one topic; use with ``async with`` and ``async for``.

    Each message is decoded before it is yielded; one that cannot be decoded is
    dead-lettered and skipped, without holding back the rest of its partition. A message
    counts as handled when the loop body that received it completes; if the body raises,
    the exception leaves the loop and the message is not committed, so it will be
    delivered again.
    """

    def __init__(
        self,
        bus: _Bus,
        topic: Topic[M],
        *,
        group: str,
        stopping: asyncio.Event | None,
        record_filter: RecordFilter | None = None,
        since_s: float | None = None,
        partitions: Sequence[int] | None = None,
    ) -> None:
        self._bus = bus
        self.topic = topic
        self.group = group
        self._stopping = stopping
        self._record_filter = record_filter
        self._since_ms = None if since_s is None else int(since_s * 1000)
        self._partitions = None if partitions is None else tuple(partitions)
        self._consumer: TransportConsumer | None = None
        self._buffer: deque[Envelope] = deque()
        self._handled: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._last_commit_s = time.monotonic()
        self._commit_in_flight: asyncio.Task[None] | None = None
        self._current: tuple[Envelope, list[AbstractContextManager[None]]] | None = None
        # The task iterating: middleware contexts (trace context) must be left in the task
        # that entered them, so a close from another task leaves them to it.
        self._owner: asyncio.Task[Any] | None = None
        # The deliveries of the last next_batch(): handled once the next batch is asked
        # for or a clean `async with` exit, like one step of `async for`.
        self._batch: list[Envelope] = []
        self._closed = False
        self._handled_through_s: float | None = None

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Join (or, for partitions, start reading); ``async with`` calls it, and does
        nothing more when it was called already (a reader opened before what it must
        not miss is published)."""
        if self._consumer is not None:
            return
        await self._bus.ensure_topics([self.topic])
        # Groups are namespaced like topics: stacks sharing a cluster must not share
        # consumer groups, or one stack's dead member stalls the other's rebalances.
        group = self._bus.topic_prefix + self.group
        client_id = f"{self._bus.client_id}-{self.group}"
        if self._partitions is not None:
            self._consumer = await self._bus.transport.reader(
                self._bus.topic_name(self.topic),
                self._partitions,
                group=group,
                client_id=client_id,
                since_ms=self._since_ms,
            )
        else:
            self._consumer = await self._bus.transport.consumer(
                [self._bus.topic_name(self.topic)],
                group=group,
                client_id=client_id,
                on_revoke=self._on_revoke,
                since_ms=self._since_ms,
            )
        self._bus._subscriptions.add(self)

    async def __aenter__(self) -> Subscription[M]:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A body that raised leaves its message unhandled: it will be delivered again.
        self._finish_current(exc, handled=exc is None)
        self._finish_batch(handled=exc is None)
        await self.close()

    async def close(self) -> None:
        """Commit what was handled and leave the group."""
        if self._closed:
            return
        self._finish_current(None, handled=False)
        self._finish_batch(handled=False)
        try:
            await self._commit(force=True)
        finally:
            await self._leave()

    async def abort(self) -> None:
        """Leave the group without committing anything more, as a crashed consumer would."""
        if not self._closed:
            self._finish_current(None, handled=False)
            if self._commit_in_flight is not None:
                self._commit_in_flight.cancel()
            await self._leave()

    async def _leave(self) -> None:
        self._closed = True
        self._bus._subscriptions.discard(self)
        if self._consumer is not None:
            await self._consumer.close()

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member owns now."""
        return self._consumer.assignment() if self._consumer is not None else frozenset()

    def lag_records(self) -> int | None:
        """Records the broker holds for this subscription beyond what it has fetched
        (its consumer lag); None before its first fetch."""
        consumer = self._consumer
        return None if consumer is None else consumer.lag_records()

    # -- iteration -------------------------------------------------------------------

    def handled_through_s(self) -> float | None:
        """The latest wall time by which every record the broker held for this
        subscription's partitions had been handled; None until known.

        A producer not heard from since well before it was silent *while this reader was
        reading*: a reader cut off from the broker (an outage, a restart, partitions
        still being handed over) sees this time stand still, not its producers go quiet.
        Known once the reader has handled everything it was given and the broker's last
        answer showed nothing more (:meth:`TransportConsumer.caught_up_at_s`).
        """
        self._note_progress()
        return self._handled_through_s

    def _note_progress(self) -> None:
        """Move :meth:`handled_through_s` on when nothing is in hand. Called when asked
        and whenever a delivery or batch is done, so a reader that is busy at every ask
        (a steady stream of heartbeats) still moves it at its idle moments between."""
        consumer = self._consumer
        if consumer is not None and not self._buffer and self._current is None and not self._batch:
            at_s = consumer.caught_up_at_s()
            if at_s is not None and (
                self._handled_through_s is None or at_s > self._handled_through_s
            ):
                self._handled_through_s = at_s

    def __aiter__(self) -> Subscription[M]:
        return self

    async def __anext__(self) -> Delivery[M]:
        delivery = await self._next(deadline_s=None)
        if delivery is None:
            raise StopAsyncIteration
        return delivery

    async def next_within(self, timeout_s: float) -> Delivery[M] | None:
        """The next delivery, or None when none arrived within ``timeout_s`` (or the
        subscription stopped). Like one step of ``async for``: the previous delivery
        counts as handled.

        Use this rather than ``asyncio.wait_for(anext(subscription))``, which would run the
        step in another task and split its trace context.
        """
        return await self._next(deadline_s=time.monotonic() + timeout_s)

    async def next_batch(self, max_records: int, timeout_s: float) -> list[Delivery[M]]:
        """Up to ``max_records`` deliveries: those already fetched, waiting at most
        ``timeout_s`` for the first one (an empty list when none came or the subscription
        stopped).

        For services that decide on many messages at once (waiting on each in turn would
        cap their rate at one message per wait). The whole batch counts as handled when
        the next batch (or delivery) is asked for, or when an ``async with`` body exits
        cleanly; if the body raises, none of it is committed and all of it is delivered
        again. Handle each delivery inside :meth:`handling` so its trace span is the
        parent of what that handling publishes.
        """
        if max_records < 1:
            raise ValueError(f"max_records must be at least 1, got {max_records}")
        self._finish_current(None, handled=True)
        self._finish_batch(handled=True)
        deadline_s = time.monotonic() + timeout_s
        batch: list[Delivery[M]] = []
        while len(batch) < max_records:
            await self._commit(force=False)
            if self._closed or (self._stopping is not None and self._stopping.is_set()):
                break
            if batch and not self._buffer:
                break  # return what has arrived rather than wait for a full batch
            if time.monotonic() >= deadline_s and not self._buffer:
                break
            envelope = await self._next_envelope(deadline_s)
            if envelope is None:
                continue
            message = await self._decode(envelope)
            if message is None:
                continue
            self._batch.append(envelope)
            batch.append(Delivery(message, envelope, self.group))
        return batch

    async def _decode(self, envelope: Envelope) -> M | None:
        """The message of ``envelope``; None when it is skipped (its key is not wanted) or
        cannot be decoded (then it is dead-lettered). Either way it counts as handled."""
        counts = self._bus.record_counts
        if self._skips(envelope):
            self._mark(envelope)
            counts[envelope.topic, self.group, "skipped"] += 1
            return None
        try:
            message = cast(M, codec.decode(envelope, self.topic.message_types))
        except DecodeError as exc:
            counts[envelope.topic, self.group, "dead_lettered"] += 1
            await self._dead_letter_and_mark(envelope, exc.kind, str(exc))
            return None
        counts[envelope.topic, self.group, "decoded"] += 1
        return message

    def _skips(self, envelope: Envelope) -> bool:
        """Whether ``envelope`` is passed over undecoded (it counts as handled): its key
        is not wanted."""
        return self._record_filter is not None and not self._record_filter(envelope)

    def handling(self, delivery: Delivery[M]) -> AbstractContextManager[None]:
        """The middleware scope (the CONSUMER trace span) of handling one delivery of a
        batch: enter it around the work done for that delivery, one delivery at a time."""
        message_type = delivery.message.MESSAGE_TYPE
        return enter_all(
            mw.consuming(delivery.envelope, self.group, message_type)
            for mw in self._bus.middlewares
        )

    def batch_handled(self) -> None:
        """Count the batch :meth:`next_batch` returned last as handled now, rather than
        at the next ask (for a reader that judges :meth:`handled_through_s` in between)."""
        self._finish_batch(handled=True)

    def _finish_batch(self, *, handled: bool) -> None:
        if handled:
            for envelope in self._batch:
                self._mark(envelope)
        had_batch = bool(self._batch)
        self._batch = []
        if handled and had_batch:
            self._note_progress()

    async def _next(self, deadline_s: float | None) -> Delivery[M] | None:
        self._finish_current(None, handled=True)
        self._finish_batch(handled=True)
        while True:
            await self._commit(force=False)
            if self._closed or (self._stopping is not None and self._stopping.is_set()):
                return None
            if deadline_s is not None and time.monotonic() >= deadline_s and not self._buffer:
                return None
            envelope = await self._next_envelope(deadline_s)
            if envelope is None:
                continue
            message = await self._decode(envelope)
            if message is None:
                continue
            managers = [
                mw.consuming(envelope, self.group, message.MESSAGE_TYPE)
                for mw in self._bus.middlewares
            ]
            entered: list[AbstractContextManager[None]] = []
            try:
                for manager in managers:
                    manager.__enter__()
                    entered.append(manager)
            except BaseException as exc:
                exit_all(entered, exc)
                raise
            self._current = (envelope, entered)
            self._owner = asyncio.current_task()
            return Delivery(message, envelope, self.group)

    async def handle(
        self, delivery: Delivery[M], handler: Callable[[Delivery[M]], Awaitable[None]]
    ) -> None:
        """Run ``handler`` on ``delivery`` with the bus's retry and dead-letter policy.

        Retriable errors are retried with backoff until they pass or the subscription is
        told to stop (then the error propagates and the message stays uncommitted).
        Other errors dead-letter the message with the error as the reason.
        """
        attempt = 0
        while True:
            attempt += 1
            try:
                await handler(delivery)
                return
            except Exception as exc:
                if is_retriable(exc):
                    await self._before_retry(exc, attempt, "a message")
                    continue
                reason = f"handler failed: {type(exc).__name__}: {exc}"
                envelope, entered = self._current or (delivery.envelope, [])
                self._current = None
                exit_all(entered, exc)
                await self._dead_letter_and_mark(envelope, "handler", reason)
                return

    async def handle_batch(
        self,
        batch: Sequence[Delivery[M]],
        handler: Callable[[Sequence[Delivery[M]]], Awaitable[None]],
        *,
        on_dead_letter: Callable[[Delivery[M], str], Awaitable[None]] | None = None,
    ) -> None:
        """Run ``handler`` on a whole batch (from :meth:`next_batch`) with the bus's retry
        and dead-letter policy, so that no message can stop the consumer.

        Retriable errors are retried with backoff, as :meth:`handle` does. A non-retriable
        one is narrowed down to the message that causes it: the batch is handled again one
        delivery at a time, in order, and each delivery that fails on its own is
        dead-lettered with the error as the reason (``on_dead_letter`` is told, to answer
        its request) while the rest are handled. ``handler`` must therefore be safe to run
        twice on a delivery (the services' decisions are idempotent in the request
        ledger)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await handler(batch)
                return
            except Exception as exc:
                if is_retriable(exc):
                    await self._before_retry(exc, attempt, f"a batch of {len(batch)}")
                    continue
                reason = f"handler failed: {type(exc).__name__}: {exc}"
                if len(batch) > 1:
                    log.warning(
                        "a batch of %d on %s failed (%s): handling its messages one by one",
                        len(batch),
                        self.topic.name,
                        reason,
                    )
                    for delivery in batch:
                        await self.handle_batch([delivery], handler, on_dead_letter=on_dead_letter)
                    return
                delivery = batch[0]
                # Messages before it in its partition were handled (in order, above), so
                # committing past it loses nothing.
                await self._dead_letter_and_mark(delivery.envelope, "handler", reason)
                if on_dead_letter is not None:
                    try:
                        await on_dead_letter(delivery, reason)
                    except Exception as hook_exc:  # the consumer goes on regardless
                        log.warning(
                            "after dead-lettering %s[%d]@%d: %s",
                            delivery.envelope.topic,
                            delivery.envelope.partition,
                            delivery.envelope.offset,
                            hook_exc,
                        )
                return

    async def _before_retry(self, exc: Exception, attempt: int, what: str) -> None:
        """Wait out the backoff before retry ``attempt + 1`` of a handler that failed with
        the retriable ``exc``; re-raise it when the subscription is told to stop (the
        message stays uncommitted)."""
        if self._stopping is not None and self._stopping.is_set():
            raise exc
        delay_s = self._bus.backoff.delay_s(attempt)
        log.warning(
            "handler for %s on %s failed (attempt %d), retrying in %.2fs: %s",
            what,
            self.topic.name,
            attempt,
            delay_s,
            exc,
        )
        await self._sleep_unless_stopping(delay_s)

    async def _sleep_unless_stopping(self, delay_s: float) -> None:
        if self._stopping is None:
            await asyncio.sleep(delay_s)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay_s)

    async def _next_envelope(self, deadline_s: float | None) -> Envelope | None:
        if not self._buffer:
            consumer = self._require_consumer()
            wait_s = _FETCH_TIMEOUT_S
            if deadline_s is not None:
                wait_s = max(0.0, min(wait_s, deadline_s - time.monotonic()))
            records = await consumer.fetch(wait_s, self._bus.max_batch)
            # Partitions may have been revoked while the fetch waited: their records now
            # belong to another member, which reads them from the committed offset.
            owned = consumer.assignment()
            self._buffer.extend(r for r in records if r.topic_partition in owned)
        return self._buffer.popleft() if self._buffer else None

    def _require_consumer(self) -> TransportConsumer:
        if self._consumer is None:
            raise TransportError("subscription is not open: use `async with`", retriable=False)
        return self._consumer

    def _finish_current(self, exc: BaseException | None, *, handled: bool) -> None:
        if self._current is None or asyncio.current_task() is not self._owner:
            return
        envelope, entered = self._current
        self._current = None
        exit_all(entered, exc)
        if handled:
            self._mark(envelope)
            self._note_progress()

    def _mark(self, envelope: Envelope) -> None:
        tp = envelope.topic_partition
        if self._consumer is not None and tp in self._consumer.assignment():
            self._handled[tp] = envelope.offset + 1

    async def _dead_letter_and_mark(self, envelope: Envelope, kind: str, reason: str) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._bus._dead_letter(envelope, self.group, kind, reason)
                break
            except Exception as exc:
                if not is_retriable(exc) or (
                    self._stopping is not None and self._stopping.is_set()
                ):
                    raise
                await self._sleep_unless_stopping(self._bus.backoff.delay_s(attempt))
        self._mark(envelope)
        # Commit at once: a dead letter is a side effect that should not repeat because a
        # later crash sent its record round again.
        await self._commit(force=True)

    async def _commit(self, *, force: bool, only: frozenset[TopicPartition] | None = None) -> None:
        pending = {
            tp: offset
            for tp, offset in self._handled.items()
            if self._committed.get(tp) != offset and (only is None or tp in only)
        }
        if not pending or self._consumer is None:
            return
        if force:
            # Never wait for a background commit here: during a rebalance it waits for the
            # rebalance, which waits for this revoke callback. Its offsets are in `pending`.
            in_flight, self._commit_in_flight = self._commit_in_flight, None
            if in_flight is not None and not in_flight.done():
                in_flight.cancel()
                await asyncio.wait([in_flight])
            await self._send_commit(pending)
            return
        if self._commit_in_flight is not None and not self._commit_in_flight.done():
            return
        now_s = time.monotonic()
        if now_s - self._last_commit_s < self._bus.commit_interval_s:
            return
        self._last_commit_s = now_s
        # In the background: waiting for the broker's answer here would stall the next
        # message by a round trip several times a second.
        self._commit_in_flight = asyncio.create_task(self._send_commit(pending))

    async def _send_commit(self, pending: dict[TopicPartition, int]) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        try:
            await consumer.commit(pending)
        except Exception as exc:
            # Not fatal: the messages will be delivered again to whoever owns the partition.
            log.warning("commit of %s for group %s failed: %s", pending, self.group, exc)
            return
        for tp, offset in pending.items():
            if tp in self._handled:  # not revoked meanwhile
                self._committed[tp] = offset

    async def _on_revoke(self, partitions: frozenset[TopicPartition]) -> None:
        await self._commit(force=True, only=partitions)
        kept = [e for e in self._buffer if e.topic_partition not in partitions]
        self._buffer.clear()
        self._buffer.extend(kept)
        for tp in partitions:
            self._handled.pop(tp, None)
            self._committed.pop(tp, None)
