"""The worker service: a thin shell between the bus and an execution backend.

Routines:

- ``inbox_routine``: reads this worker's own partition of ``switchyard.worker-inbox``
  (leased at start, named in every heartbeat, so the scheduler and the rebalancer send
  there and no other worker fetches this one's messages), in batches: assignments go
  through :class:`~services.worker.intake.Intake` (fenced in the request ledger, one round
  trip a batch), migrations too; placement orders go to :mod:`services.worker.placement`
  (an ``emulated-models`` worker unloads, draining first, then loads).
- ``engine_routine``: runs the backend's steps while there is work; what it reports goes
  through :class:`~services.worker.reporting.Reporter` (spans, output chunks,
  observations) to the :class:`~services.worker.answers.AnswerOutbox`. After the worker
  was out of touch for the worker timeout (frozen, cut off), it first checks what it
  holds against the ledger and stops what was given to another
  (:mod:`services.worker.touch`).
- ``answers_routine``: the outbox's flush: answers recorded in the ledger in batches, then
  published to the asking replica's partition of ``switchyard.answers``.
- ``heartbeat_routine``: a heartbeat every interval (and the observations gathered since
  the last one, for the predictor).
- ``inbox_lease_routine``: keeps the inbox partition's lease.

Stopping drains: intake stops (the batch being taken is finished; one that arrives
after the stop is left assigned here, for the drain's re-assignment) and nothing new
starts. Once intake has stopped, a heartbeat says ``draining=True``, listing what waits here, so the monitor can have it re-assigned while the running
work finishes; heartbeats go on every interval meanwhile (a long generation must not look
like a death, or it would run twice). The last one, once nothing runs and every answer
is recorded, says ``draining=True`` with ``running == 0`` and lists whatever still waits.

Tracing: an assignment is taken inside its CONSUMER span but runs later, in the engine
routine. The trace context at intake is kept on the work item; its execution span
(``execute {model}``) is a child of it, and the answer, the output chunks and a
migration's re-published assignment are published inside it.

Metrics: :mod:`services.worker.telemetry`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from functools import partial
from typing import TypeVar

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from switchyard.bus import Delivery, Subscription
from switchyard.contracts.base import Message
from switchyard.contracts.messages import (
    Assignment,
    Heartbeat,
    Migration,
    PlacementOrder,
    ServiceObservations,
)
from switchyard.contracts.topics import HEARTBEATS, OBSERVATIONS, WORKER_INBOX, Topic
from switchyard.errors import is_retriable
from switchyard.lifecycle import RequestLedger
from switchyard.runtime.connections import backoff_s
from switchyard.runtime.inbox import Inbox
from switchyard.runtime.service import Service, ServiceContext
from switchyard.serving import ServingCatalogue

from services.worker.answers import AnswerOutbox
from services.worker.backends import build_backend_for
from services.worker.backends.base import Backend
from services.worker.heartbeat import HeartbeatFacts, build_heartbeat
from services.worker.holdings import Holdings
from services.worker.intake import Intake
from services.worker.model_cache import ModelCache
from services.worker.placement import carry_out, placement_of
from services.worker.queue import LocalQueue
from services.worker.reporting import Reporter
from services.worker.telemetry import WorkerMetrics
from services.worker.touch import Touch, drop_superseded

M = TypeVar("M", bound=Message)
InboxMessage = Assignment | Migration | PlacementOrder

_INBOX_BATCH = 256
_INBOX_WAIT_S = 0.2
_PUBLISH_ATTEMPTS = 8
CHECK_RETRY_S = 0.2
"""How often an out-of-touch worker tries again to read its holdings' records."""


class WorkerService(Service):
    """One worker: intake, the engine loop over a :class:`Backend`, reporting.

    Args:
        ctx: the service context.
        backend: the execution backend; built from ``ctx.settings`` at start when None.
        catalogue: the serving catalogue a torch backend built at start serves.

    Attributes:
        worker_id: ``settings.worker_id``, else the instance id.
        holdings: its queue and what it holds.
        inbox: its partition of ``switchyard.worker-inbox``.
    """

    def __init__(
        self,
        ctx: ServiceContext,
        backend: Backend | None = None,
        *,
        catalogue: ServingCatalogue | None = None,
    ) -> None:
        super().__init__(ctx)
        self.worker_id = ctx.settings.worker_id or ctx.settings.instance_id
        self.holdings = Holdings(self.worker_id)
        self._backend = backend
        self._catalogue = catalogue
        self._sequence = 0
        self.ledger = RequestLedger(ctx.state)
        self.metrics = WorkerMetrics(
            ctx.telemetry,
            self._attributes,
            waiting=lambda: len(self.holdings.queue) if self._backend else None,
            running=lambda: self.holdings.running if self._backend else None,
            swaps=self._swaps,
        )
        self.outbox = AnswerOutbox(
            ctx, self.ledger, on_superseded=lambda _: self.metrics.superseded()
        )
        self.intake = Intake(
            self.holdings, lambda: self.backend, self.ledger, ctx.bus, self.outbox, self.metrics
        )
        self.reporter = Reporter(
            self.holdings,
            lambda: self.backend,
            ctx.bus,
            self.outbox,
            self.metrics,
            ctx.telemetry,
            hand_off=self.intake.hand_off,
        )
        self.touch = Touch(ctx.settings.worker_timeout_s)
        self.inbox: Inbox[InboxMessage] = Inbox(ctx, WORKER_INBOX, self.worker_id)
        self._inbox_sub: Subscription[InboxMessage] | None = None
        self._reading: Subscription[InboxMessage] | None = None
        """The inbox subscription the inbox routine reads now (its progress is in every
        heartbeat)."""

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("the worker has not started: no backend yet")
        return self._backend

    @property
    def queue(self) -> LocalQueue:
        return self.holdings.queue

    def _attributes(self) -> dict[str, str | bool]:
        emulated = self._backend.emulated if self._backend is not None else False
        return {"worker_id": self.worker_id, "emulated": emulated}

    def _swaps(self) -> int | None:
        if self._backend is None:
            return None
        placement = placement_of(self._backend)
        if placement is not None:
            return placement.loads_total
        cache = getattr(self._backend, "cache", None)
        return cache.swap_in_count if isinstance(cache, ModelCache) else 0

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._backend is None:
            self._backend = await build_backend_for(self.ctx.settings, self._catalogue)
        leased = await self.inbox.open()
        # Reading (from the partition's end) before the first heartbeat names the
        # partition: nothing sent here after that is missed.
        self._inbox_sub = self.inbox.subscribe(group=f"worker-{self.worker_id}")
        await self._inbox_sub.open()
        self.ctx.logger.info(
            "worker %s serving %s on %s backend%s, inbox partition %d",
            self.worker_id,
            ", ".join(self.backend.servable_models()) or "nothing",
            self.backend.name,
            " (emulated: modelled time, not measured)" if self.backend.emulated else "",
            leased.partition,
            extra={"worker_id": self.worker_id, "backend": self.backend.name},
        )
        self.spawn_routine("inbox_routine", self.inbox_routine)
        self.spawn_routine("inbox_lease_routine", self.inbox.lease_routine)
        self.spawn_routine("engine_routine", self.engine_routine)
        self.spawn_routine("answers_routine", self.outbox.flush_routine)
        self.spawn_routine("heartbeat_routine", self.heartbeat_routine)

    async def drain(self) -> None:
        """Stop intake, let the running work finish (heartbeating, ``draining``), record
        and publish every answer, then send a last heartbeat with nothing running (it
        lists what still waits, for re-assignment) and give the inbox partition back."""
        self.holdings.wake.set()
        engine = self._routines.get("engine_routine")
        if engine is not None:
            await asyncio.gather(engine, return_exceptions=True)
        await self.outbox.close()
        await self.reporter.sent()
        await super().drain()
        try:
            await self._publish(HEARTBEATS, self.heartbeat(draining=True))
        except Exception as exc:
            self.ctx.logger.warning("could not send the last heartbeat: %s", exc)
        await self.inbox.close()

    # -- routines ---------------------------------------------------------------------------

    async def inbox_routine(self) -> None:
        """Take this worker's assignments, migrations and placement orders, a batch at a
        time."""
        generation = self.inbox.generation
        # The one opened at start, or, after a restart of this routine, a new one.
        sub, self._inbox_sub = (
            self._inbox_sub or self.inbox.subscribe(group=f"worker-{self.worker_id}"),
            None,
        )
        self._reading = sub
        async with sub:
            while not self.ctx.stopping.is_set():
                batch = await sub.next_batch(_INBOX_BATCH, timeout_s=_INBOX_WAIT_S)
                self.inbox.check(generation)
                if self.ctx.stopping.is_set():
                    # Draining: what came in stays uncommitted and assigned here in the
                    # ledger, so the drain's WorkerDown re-assigns it.
                    break
                if batch:
                    # What cannot be taken in is dead-lettered and answered as failed,
                    # never the routine stopped.
                    await sub.handle_batch(
                        batch, partial(self._take_batch, sub), on_dead_letter=self._refuse
                    )

    async def _take_batch(
        self,
        sub: Subscription[InboxMessage],
        batch: Sequence[Delivery[InboxMessage]],
    ) -> None:
        assignments: list[tuple[Assignment, Context | None]] = []
        for delivery in batch:
            message = delivery.message
            if isinstance(message, Assignment):
                # Its CONSUMER span: what is published for it later continues it.
                with sub.handling(delivery):
                    assignments.append((message, otel_context.get_current()))
            elif isinstance(message, Migration):
                # In order: the assignments before it may include the one it moves.
                await self.intake.take(assignments)
                assignments = []
                with sub.handling(delivery):
                    await self.intake.migrate(message)
            elif isinstance(message, PlacementOrder):
                # In order too: an unload drains the stages taken in before it.
                await self.intake.take(assignments)
                assignments = []
                with sub.handling(delivery):
                    carry_out(message, placement_of(self.backend), self.holdings)
        await self.intake.take(assignments)

    async def _refuse(self, delivery: Delivery[InboxMessage], reason: str) -> None:
        message = delivery.message
        if isinstance(message, Assignment) and message.worker_id == self.worker_id:
            self.intake.refuse(message, f"the worker could not take this request ({reason})")

    async def engine_routine(self) -> None:
        """Run backend steps while there is work; when stopping, only until the running
        work is done."""
        backend = self.backend
        stopping = self.ctx.stopping
        holdings = self.holdings
        while True:
            draining = stopping.is_set()
            if draining and not backend.has_running():
                return
            if self.touch.needs_check() and holdings.held and not await self._check_holdings():
                await asyncio.sleep(CHECK_RETRY_S)  # out of touch: run nothing meanwhile
                continue
            holdings.wake.clear()  # before looking, so a wake-up during the step is kept
            # Read before the step: a request that became ready while the step ran was
            # not ready when it looked, and must not be taken for one ready long ago
            # (that the step left waiting for room), or nothing would wake the engine.
            before_s = time.time()
            stepped = await backend.step(
                holdings.queue, self.reporter, admit=not draining, wake=holdings.wake
            )
            if stepped:
                continue
            if draining:
                return
            next_s = holdings.queue.next_ready_s(before_s)
            wait_s = None if next_s is None else max(0.0, next_s - time.time())
            await self._wait_for_work(wait_s)

    async def _check_holdings(self) -> bool:
        """What this worker holds checked against the ledger after it was out of touch
        (:mod:`services.worker.touch`); False when the ledger could not be read."""
        try:
            await drop_superseded(
                self.holdings, self.backend, self.ledger, lambda _: self.metrics.superseded()
            )
        except Exception as exc:
            if not is_retriable(exc):
                raise
            self.ctx.logger.warning("out of touch, and the ledger cannot be read: %s", exc)
            return False
        self.touch.checked()
        return True

    async def heartbeat_routine(self) -> None:
        """A heartbeat every interval, and one at once when a stop is asked for; once
        intake has stopped, every heartbeat says ``draining``, until the engine routine
        has left (what runs is done; :meth:`drain` sends the last one). The observations gathered since the
        last heartbeat go to the predictor with it."""
        interval_s = self.ctx.settings.heartbeat_interval_s
        stopping = self.ctx.stopping
        engine = self._routines["engine_routine"]
        while not engine.done():
            intake = self._routines.get("inbox_routine")  # a restarted one is a new task
            # Draining only once intake has stopped: a batch being taken when the stop
            # came may still start a request here, and a draining heartbeat with nothing
            # running is the worker's last word to the monitor (what it lists as waiting
            # is re-assigned; a request it started and did not list is left to finish
            # here, so one taken after it would never run).
            draining = stopping.is_set() and (intake is None or intake.done())
            await self._publish(HEARTBEATS, self.heartbeat(draining=draining))
            self.touch.heard()
            await self._publish_observations()
            if draining:
                await asyncio.wait([engine], timeout=interval_s)
            elif stopping.is_set() and intake is not None:
                await asyncio.wait([intake], timeout=interval_s)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), interval_s)

    async def _publish_observations(self) -> None:
        observations = self.reporter.take_observations()
        if observations:
            await self._publish(
                OBSERVATIONS,
                ServiceObservations(
                    worker_id=self.worker_id, observations=observations, sent_at_s=time.time()
                ),
            )

    async def _wait_for_work(self, timeout_s: float | None) -> None:
        waits = [
            asyncio.ensure_future(self.holdings.wake.wait()),
            asyncio.ensure_future(self.ctx.stopping.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    # -- messages -----------------------------------------------------------------------------

    def heartbeat(self, *, draining: bool = False) -> Heartbeat:
        """This worker's state now, as a heartbeat."""
        self._sequence += 1
        settings = self.ctx.settings
        try:
            partition: int | None = self.inbox.partition
        except RuntimeError:
            partition = None
        reading = self._reading
        return build_heartbeat(
            self.backend,
            self.holdings.queue,
            HeartbeatFacts(
                worker_id=self.worker_id,
                sequence=self._sequence,
                interval_s=settings.heartbeat_interval_s,
                time_scale=settings.worker_time_scale,
                inbox_partition=partition,
                inbox_read_through_s=None if reading is None else reading.handled_through_s(),
                draining=draining,
                now_s=time.time(),
                role=settings.worker_role,
            ),
        )

    async def _publish(self, topic: Topic[M], message: M) -> None:
        """Publish, retrying a broker outage with backoff a few times before giving up."""
        attempt = 0
        while True:
            attempt += 1
            try:
                await self.ctx.bus.publish(topic, message)
                return
            except Exception as exc:
                if not is_retriable(exc) or attempt >= _PUBLISH_ATTEMPTS:
                    raise
                self.ctx.logger.warning("publish to %s failed, retrying: %s", topic.name, exc)
                await asyncio.sleep(backoff_s(attempt))
