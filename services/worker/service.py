"""The worker service: a thin shell between the bus and an execution backend.

It reads its assignments and migrations, keeps the local queue, runs the backend's steps,
and publishes what happens: completions, streamed output chunks and heartbeats.

Which messages it takes:

- ``switchyard.assignments`` in its own consumer group ``worker-{id}``: every worker
  reads every partition and keeps only the assignments naming it. Assignments are keyed
  by worker id, so partitions do not line up with workers; one group per worker is the
  simplest routing that survives any partition count and any number of workers, at the
  cost of decoding the other workers' assignments (small messages, cheap to skip).
- ``switchyard.migrations`` in group ``worker-{id}-migrations``, keeping those whose
  ``from_worker_id`` is ours.

Delivery is at least once, so intake is idempotent. In this process, an assignment whose
``(request_id, epoch)`` was taken already, or whose epoch is lower than one already
taken for that request, is dropped. Across restarts, a claim
``claim:{request_id}:{epoch}:run`` in the state store (``set_if_absent`` with a TTL) keeps
a redelivered assignment from running a second time; the work a crashed worker held is
re-assigned with a higher epoch by whoever notices the crash (the monitor's
``WorkerDown``), and a higher epoch claims afresh. An assignment the request's record
(``request:{id}``) shows superseded (a higher epoch was recorded: re-assigned or moved
since) or answered is dropped before it is claimed: a worker restarted under the same id
resumes its group's unread assignments, some of them re-assigned elsewhere meanwhile.

Stopping drains: intake stops and nothing new starts. A heartbeat says ``draining=True``
at once, listing what waits here, so the monitor can have it re-assigned while the running
work finishes; heartbeats go on every interval meanwhile (a long generation must not
look like a death, or it would run twice). The last one, once nothing runs, says
``draining=True`` with ``running == 0`` and lists whatever still waits.

Tracing: an assignment is taken inside its CONSUMER span, but runs later, in the engine
routine. The trace context at intake is kept on the work item; its execution span
(``execute {model}``) is a child of it, and the completion, the output chunks and a
migration's re-published assignment are published inside it, so they continue the
request's trace instead of starting new ones.

Metrics (attributes ``worker_id`` and ``emulated`` on each; several workers of one
process, the embedded stack, share the instruments):

* ``switchyard.worker.queue_length``, ``switchyard.worker.running`` (observable gauges):
  requests waiting here, and running;
* ``switchyard.worker.batch.size`` (histogram): requests started together (a static
  batch, or the requests one continuous-batching prefill admitted);
* ``switchyard.worker.execution.duration`` (histogram, seconds): start to finish of a
  request here, by ``model`` and ``status``;
* ``switchyard.worker.completions`` (counter): completions published, by ``status``;
* ``switchyard.worker.model_swaps`` (observable counter): models loaded into memory
  (swap-ins of the model cache; always 0 on an emulated worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Iterable, Iterator, Sequence
from typing import TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import Observation
from switchyard import __version__
from switchyard.bus import Delivery
from switchyard.contracts.base import Message
from switchyard.contracts.messages import (
    Assignment,
    Completion,
    CompletionStatus,
    Heartbeat,
    Migration,
    OutputChunk,
    QueuedEntry,
    RequestTimeline,
)
from switchyard.contracts.topics import (
    ASSIGNMENTS,
    COMPLETIONS,
    HEARTBEATS,
    MIGRATIONS,
    OUTPUT_CHUNKS,
    Topic,
)
from switchyard.errors import is_retriable
from switchyard.runtime.service import Service, ServiceContext, backoff_s
from switchyard.serving import ServingCatalogue
from switchyard.telemetry.buckets import SECONDS_BUCKETS
from switchyard.telemetry.observables import observe

from services.cluster_state import FINAL_STATUSES, record_assignment, request_key
from services.worker.backends.base import Backend, Result, UnsupportedWorkError
from services.worker.model_cache import ModelCache
from services.worker.queue import LocalQueue, WorkItem

CHUNK_TOKENS = 4
"""A streamed request gets an output chunk every this many tokens (and at its end)."""

CLAIM_TTL_S = 24 * 3600.0
"""How long a run claim is kept: longer than any redelivery of the same assignment."""

SEEN_LIMIT = 100_000
"""Most request ids whose highest taken epoch is remembered in memory (oldest forgotten;
the state-store claim still catches a duplicate after that)."""

_PUBLISH_ATTEMPTS = 8
_SCOPE = "switchyard.worker"
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

M = TypeVar("M", bound=Message)


class WorkerService(Service):
    """One worker: intake, the engine loop over a :class:`Backend`, reporting.

    Args:
        ctx: the service context.
        backend: the execution backend; built from ``ctx.settings`` at start when None.
        catalogue: the serving catalogue a torch backend built at start serves.

    Attributes:
        worker_id: ``settings.worker_id``, else the instance id.
        queue: the requests waiting here.
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
        self.queue = LocalQueue()
        self._backend = backend
        self._catalogue = catalogue
        self._held: dict[str, WorkItem] = {}  # waiting or running here, by request id
        self._seen: OrderedDict[str, int] = OrderedDict()  # request id -> highest epoch taken
        self._wake = asyncio.Event()
        # Completions and output chunks on their way to the broker.
        self._sending: set[asyncio.Task[None]] = set()
        self._sequence = 0
        self._sink = _Sink(self)
        telemetry = ctx.telemetry
        self._tracer = trace.get_tracer(_SCOPE, __version__, telemetry.tracer_provider)
        meter = telemetry.meter_provider.get_meter(_SCOPE, __version__)
        self._m_batch_size = meter.create_histogram(
            "switchyard.worker.batch.size",
            unit="{request}",
            description="Requests started together (a batch, or one prefill's admissions).",
            explicit_bucket_boundaries_advisory=_BATCH_SIZE_BUCKETS,
        )
        self._m_execution_s = meter.create_histogram(
            "switchyard.worker.execution.duration",
            unit="s",
            description="Seconds from a request's start to its finish on this worker.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self._m_completions = meter.create_counter(
            "switchyard.worker.completions",
            unit="{request}",
            description="Completions published, by status.",
        )
        provider = telemetry.meter_provider
        observe(
            provider,
            _SCOPE,
            "switchyard.worker.queue_length",
            self._observe_queue,
            unit="{request}",
            description="Requests waiting on the worker.",
        )
        observe(
            provider,
            _SCOPE,
            "switchyard.worker.running",
            self._observe_running,
            unit="{request}",
            description="Requests running on the worker.",
        )
        observe(
            provider,
            _SCOPE,
            "switchyard.worker.model_swaps",
            self._observe_swaps,
            kind="counter",
            unit="{model}",
            description="Models loaded into memory (swap-ins).",
        )

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise RuntimeError("the worker has not started: no backend yet")
        return self._backend

    # -- metrics --------------------------------------------------------------------------

    def _attributes(self) -> dict[str, str | bool]:
        emulated = self._backend.emulated if self._backend is not None else False
        return {"worker_id": self.worker_id, "emulated": emulated}

    def _observe_queue(self) -> Iterable[Observation]:
        if self._backend is None:
            return []
        return [Observation(len(self.queue), self._attributes())]

    def _observe_running(self) -> Iterable[Observation]:
        if self._backend is None:
            return []
        # Held here are the waiting and the running requests.
        return [Observation(max(0, len(self._held) - len(self.queue)), self._attributes())]

    def _observe_swaps(self) -> Iterable[Observation]:
        if self._backend is None:
            return []
        cache = getattr(self._backend, "cache", None)
        count = cache.swap_in_count if isinstance(cache, ModelCache) else 0
        return [Observation(count, self._attributes())]

    def _count_completion(self, status: CompletionStatus) -> None:
        self._m_completions.add(1, {**self._attributes(), "status": status.value})

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._backend is None:
            from services.worker import build_backend_for

            self._backend = await build_backend_for(self.ctx.settings, self._catalogue)
        self.ctx.logger.info(
            "worker %s serving %s on %s backend%s",
            self.worker_id,
            ", ".join(self.backend.servable_models()) or "nothing",
            self.backend.name,
            " (emulated: modelled time, not measured)" if self.backend.emulated else "",
            extra={"worker_id": self.worker_id, "backend": self.backend.name},
        )
        self.spawn_routine("assignments_routine", self.assignments_routine)
        self.spawn_routine("migrations_routine", self.migrations_routine)
        self.spawn_routine("engine_routine", self.engine_routine)
        self.spawn_routine("heartbeat_routine", self.heartbeat_routine)

    async def drain(self) -> None:
        """Stop intake, let the running work finish (heartbeating, ``draining``), then
        send a last heartbeat with nothing running (it lists what still waits, for
        re-assignment)."""
        self._wake.set()
        await super().drain()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        try:
            await self._publish(HEARTBEATS, self.heartbeat(draining=True))
        except Exception as exc:
            self.ctx.logger.warning("could not send the last heartbeat: %s", exc)

    # -- routines ---------------------------------------------------------------------------

    async def assignments_routine(self) -> None:
        # Assignments are keyed by worker id: skip the others' before decoding them.
        own_key = self.worker_id.encode()
        await self.ctx.bus.consume(
            ASSIGNMENTS,
            group=f"worker-{self.worker_id}",
            handler=self._on_assignment,
            stopping=self.ctx.stopping,
            key_filter=lambda key: key == own_key,
        )

    async def migrations_routine(self) -> None:
        await self.ctx.bus.consume(
            MIGRATIONS,
            group=f"worker-{self.worker_id}-migrations",
            handler=self._on_migration,
            stopping=self.ctx.stopping,
        )

    async def engine_routine(self) -> None:
        """Run backend steps while there is work; when stopping, only until the running
        work is done."""
        backend = self.backend
        stopping = self.ctx.stopping
        while True:
            draining = stopping.is_set()
            if draining and not backend.has_running():
                return
            self._wake.clear()  # before looking, so a wake-up during the step is kept
            if await backend.step(self.queue, self._sink, admit=not draining):
                continue
            if draining:
                return
            now_s = time.time()
            next_s = self.queue.next_ready_s(now_s)
            await self._wait_for_work(None if next_s is None else max(0.0, next_s - now_s))

    async def heartbeat_routine(self) -> None:
        """A heartbeat every interval, and one at once when a stop is asked for; while
        draining, every heartbeat says so, until the engine routine has left (what runs
        is done; :meth:`drain` sends the last one)."""
        interval_s = self.ctx.settings.heartbeat_interval_s
        stopping = self.ctx.stopping
        engine = self._routines["engine_routine"]
        while not engine.done():
            draining = stopping.is_set()
            await self._publish(HEARTBEATS, self.heartbeat(draining=draining))
            if draining:
                await asyncio.wait([engine], timeout=interval_s)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), interval_s)

    async def _wait_for_work(self, timeout_s: float | None) -> None:
        waits = [
            asyncio.ensure_future(self._wake.wait()),
            asyncio.ensure_future(self.ctx.stopping.wait()),
        ]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    # -- intake -----------------------------------------------------------------------------

    async def _on_assignment(self, delivery: Delivery[Assignment]) -> None:
        await self.take(delivery.message)

    async def take(self, assignment: Assignment) -> bool:
        """Queue ``assignment`` if it is ours, new and servable; True when queued.

        An assignment for another worker, a duplicate, or a stale epoch is dropped. One
        this backend cannot serve gets a FAILED completion naming the problem.
        """
        if assignment.worker_id != self.worker_id:
            return False
        log = self.ctx.logger
        request_id = assignment.request.request_id
        epoch = assignment.epoch
        seen = self._seen.get(request_id)
        if seen is not None and epoch <= seen:
            log.debug(
                "dropped assignment of %s epoch %d: epoch %d already taken", request_id, epoch, seen
            )
            return False
        if reason := await self._superseded(request_id, epoch):
            self._remember(request_id, epoch)
            log.info(
                "dropped assignment of %s epoch %d: %s",
                request_id,
                epoch,
                reason,
                extra={"request_id": request_id, "epoch": epoch},
            )
            return False
        claimed = await self.ctx.state.set_if_absent(
            f"claim:{request_id}:{epoch}:run", self.worker_id, ttl_s=CLAIM_TTL_S
        )
        self._remember(request_id, epoch)
        if not claimed:
            log.info(
                "dropped assignment of %s epoch %d: already claimed (a redelivery)",
                request_id,
                epoch,
                extra={"request_id": request_id, "epoch": epoch},
            )
            return False
        held = self._held.get(request_id)
        if held is not None:
            if self.queue.remove(request_id) is None:
                log.warning(
                    "assignment of %s epoch %d arrived while epoch %d runs here; it runs on",
                    request_id,
                    epoch,
                    held.epoch,
                )
                return False
            del self._held[request_id]  # superseded by the newer epoch before it started
        try:
            spec = self.backend.describe(assignment)
        except UnsupportedWorkError as exc:
            log.warning("cannot serve %s: %s", request_id, exc, extra={"request_id": request_id})
            await self._publish(COMPLETIONS, self._failed_completion(assignment, str(exc)))
            self._count_completion(CompletionStatus.FAILED)
            return False
        item = WorkItem(
            assignment=assignment,
            key=spec.key,
            received_at_s=time.time(),
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.output_tokens,
            generated_tokens=assignment.generated_tokens,
            estimate_s=spec.estimate_s,
            # The assignment's CONSUMER span: what is published for it later continues it.
            trace_context=otel_context.get_current(),
        )
        self.queue.push(item)
        self._held[request_id] = item
        self._wake.set()
        return True

    async def _superseded(self, request_id: str, epoch: int) -> str | None:
        """Why the request's record says an assignment of ``epoch`` must not run (it was
        answered, or a later epoch was recorded), or None: run it. A missing record (it
        expired, or nobody keeps one) does not stop it."""
        key = request_key(request_id)
        status, recorded = await asyncio.gather(
            self.ctx.state.hget(key, "status"), self.ctx.state.hget(key, "epoch")
        )
        if status in FINAL_STATUSES:
            return f"the request was answered already ({status})"
        if recorded is not None and recorded.isdigit() and int(recorded) > epoch:
            return f"epoch {recorded} was assigned since"
        return None

    def _remember(self, request_id: str, epoch: int) -> None:
        self._seen[request_id] = max(epoch, self._seen.get(request_id, epoch))
        self._seen.move_to_end(request_id)
        while len(self._seen) > SEEN_LIMIT:
            self._seen.popitem(last=False)

    async def _on_migration(self, delivery: Delivery[Migration]) -> None:
        await self.migrate(delivery.message)

    async def migrate(self, migration: Migration) -> bool:
        """Move a request we hold to ``migration.to_worker_id``; True when it moved.

        A waiting request is re-assigned with ``not_before_s = now + cost_s``; a running
        LLM request is preempted and re-assigned with the tokens it generated and
        ``not_before_s = now +`` the modelled transfer of its KV cache. A request not
        held here (finished, or moved already) is ignored.
        """
        if migration.from_worker_id != self.worker_id:
            return False
        log = self.ctx.logger
        request_id = migration.request_id
        item = self._held.get(request_id)
        if item is None:
            log.debug("migration of %s ignored: not held here", request_id)
            return False
        if migration.epoch <= item.epoch:
            log.debug(
                "migration of %s ignored: epoch %d is not newer than %d",
                request_id,
                migration.epoch,
                item.epoch,
            )
            return False
        now_s = time.time()
        if self.queue.remove(request_id) is not None:
            not_before_s = now_s + migration.cost_s
        else:
            preemption = self.backend.preempt(request_id)
            if preemption is None:
                log.info(
                    "migration of %s ignored: its batch is running and cannot be preempted",
                    request_id,
                )
                return False
            not_before_s = now_s + preemption.transfer_s
        old = item.assignment
        moved = Assignment(
            request=old.request,
            worker_id=migration.to_worker_id,
            variant=old.variant,
            order=old.order,
            policy=old.policy,
            epoch=migration.epoch,
            predicted_s=old.predicted_s,
            deadline_s=old.deadline_s,
            assigned_at_s=now_s,
            generated_tokens=item.generated_tokens,
            not_before_s=not_before_s,
        )
        # Recorded before it is published, as the scheduler records its decisions: if
        # the target then dies, its WorkerDown finds the request on it. A move that
        # cannot be recorded does not happen: unrecorded, the request would be found
        # on neither worker when one dies. It waits here again (a preempted one resumes
        # from the tokens it generated).
        try:
            await record_assignment(self.ctx.state, moved, moved_from=self.worker_id)
        except Exception as exc:
            log.error(
                "the move of %s to %s could not be recorded, so it stays here: %s",
                request_id,
                migration.to_worker_id,
                exc,
                extra={"request_id": request_id, "to_worker_id": migration.to_worker_id},
            )
            self.queue.push(item)
            self._wake.set()
            return False
        del self._held[request_id]
        self._remember(request_id, migration.epoch)
        self._end_span(item, "migrated")
        # In the request's trace: the target worker's handling continues it.
        with _in_trace_of(item):
            await self._publish(ASSIGNMENTS, moved)
        log.info(
            "moved %s to %s (epoch %d, %d tokens generated, may start in %.3f s)",
            request_id,
            migration.to_worker_id,
            migration.epoch,
            item.generated_tokens,
            not_before_s - now_s,
            extra={"request_id": request_id, "to_worker_id": migration.to_worker_id},
        )
        return True

    # -- what the backend reports (through _Sink) -------------------------------------------

    async def report_started(self, items: Sequence[WorkItem]) -> None:
        now_s = time.time()
        emulated = self.backend.emulated
        for item in items:
            if item.started_s is None:
                item.started_s = now_s
            if item.span is None:
                item.span = self._tracer.start_span(
                    f"execute {item.key.model}",
                    context=item.trace_context,
                    attributes={
                        "switchyard.worker_id": self.worker_id,
                        "switchyard.model": item.key.model,
                        "switchyard.variant": item.key.variant,
                        "switchyard.request_id": item.request_id,
                        "switchyard.epoch": item.epoch,
                        "switchyard.batch_size": len(items),
                        "switchyard.emulated": emulated,
                    },
                )
        if items:
            self._m_batch_size.record(len(items), self._attributes())

    async def report_tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        if new_tokens and item.first_token_s is None:
            item.first_token_s = time.time()
        if not item.streaming:
            return
        item.pending_chunk_tokens += new_tokens
        if text:
            item.pending_chunk_text.append(text)
        if item.pending_chunk_tokens >= CHUNK_TOKENS:
            await self._flush_chunk(item)

    async def report_finished(self, item: WorkItem, result: Result) -> None:
        if item.streaming and (item.pending_chunk_tokens or item.pending_chunk_text):
            await self._flush_chunk(item)
        self._forget(item)
        self._executed(item, CompletionStatus.OK)
        with _in_trace_of(item):
            self._send_completion(self._completion(item, CompletionStatus.OK, result=result))
        self._end_span(item)

    async def report_failed(self, item: WorkItem, error: str) -> None:
        self._forget(item)
        self._executed(item, CompletionStatus.FAILED)
        with _in_trace_of(item):
            self._send_completion(self._completion(item, CompletionStatus.FAILED, error=error))
        self._end_span(item, f"failed: {error}")

    def _send_completion(self, completion: Completion) -> None:
        """Publish a completion in the background, retrying a broker outage, so the engine
        goes on with the batch instead of waiting for each acknowledgement in turn (the
        task copies the current trace context). Drain waits for every one of them."""
        task = asyncio.create_task(self._publish(COMPLETIONS, completion))
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.ctx.logger.error("a completion or output chunk could not be published: %s", exc)

    def _executed(self, item: WorkItem, status: CompletionStatus) -> None:
        """Count a completion, and its execution time when it started here."""
        self._count_completion(status)
        if item.started_s is not None:
            self._m_execution_s.record(
                max(0.0, time.time() - item.started_s),
                {**self._attributes(), "model": item.key.model, "status": status.value},
            )

    @staticmethod
    def _end_span(item: WorkItem, error: str | None = None) -> None:
        span, item.span = item.span, None
        if span is None:
            return
        if error is not None and span.is_recording():
            span.set_status(trace.Status(trace.StatusCode.ERROR, error[:200]))
        span.end()

    def _forget(self, item: WorkItem) -> None:
        if self._held.get(item.request_id) is item:
            del self._held[item.request_id]

    async def _flush_chunk(self, item: WorkItem) -> None:
        request = item.request
        chunk = OutputChunk(
            request_id=item.request_id,
            epoch=item.epoch,
            index=item.chunk_index,
            text="".join(item.pending_chunk_text),
            tokens=item.pending_chunk_tokens,
            reply_to=request.reply_to,
            emulated=self.backend.emulated,
            sent_at_s=time.time(),
        )
        item.chunk_index += 1
        item.pending_chunk_tokens = 0
        item.pending_chunk_text.clear()
        with _in_trace_of(item):
            try:
                # Queued in order: one producer, and the request id as key keeps a
                # request's chunks on one partition. The engine goes on with the batch
                # while the broker acknowledges, instead of waiting a round trip per
                # chunk; drain waits for the acknowledgements.
                acknowledged = await self.ctx.bus.send(OUTPUT_CHUNKS, chunk)
            except Exception as exc:
                if not is_retriable(exc):
                    raise
                await self._publish(OUTPUT_CHUNKS, chunk)  # not even queued: retry
                return
        task = asyncio.create_task(_awaited(acknowledged))
        self._sending.add(task)
        task.add_done_callback(self._sent)

    # -- messages -----------------------------------------------------------------------------

    def _completion(
        self,
        item: WorkItem,
        status: CompletionStatus,
        *,
        result: Result | None = None,
        error: str | None = None,
    ) -> Completion:
        assignment = item.assignment
        request = assignment.request
        return Completion(
            request_id=request.request_id,
            app=request.app,
            worker_id=self.worker_id,
            worker_type=item.ran_on or self.backend.worker_type,
            variant=assignment.variant,
            epoch=assignment.epoch,
            status=status,
            result=result,
            error=None if error is None else error[:2000],
            timeline=RequestTimeline(
                arrival_s=request.arrival_s,
                assigned_s=assignment.assigned_at_s,
                started_s=item.started_s,
                first_token_s=item.first_token_s,
                finished_s=time.time(),
            ),
            deadline_s=assignment.deadline_s
            if assignment.deadline_s is not None
            else request.deadline_s,
            emulated=self.backend.emulated,
            reply_to=request.reply_to,
        )

    def _failed_completion(self, assignment: Assignment, error: str) -> Completion:
        request = assignment.request
        return Completion(
            request_id=request.request_id,
            app=request.app,
            worker_id=self.worker_id,
            worker_type=self.backend.worker_type,
            variant=assignment.variant,
            epoch=assignment.epoch,
            status=CompletionStatus.FAILED,
            error=error[:2000],
            timeline=RequestTimeline(
                arrival_s=request.arrival_s,
                assigned_s=assignment.assigned_at_s,
                finished_s=time.time(),
            ),
            deadline_s=assignment.deadline_s
            if assignment.deadline_s is not None
            else request.deadline_s,
            emulated=self.backend.emulated,
            reply_to=request.reply_to,
        )

    def heartbeat(self, *, draining: bool = False) -> Heartbeat:
        """This worker's state now, as a heartbeat (see the module docstring of the
        contract for each field)."""
        backend = self.backend
        waiting = list(self.queue)
        load = backend.load(waiting)
        # Each request's work as the scheduler predicted it, as the simulator counts it:
        # a policy compares these figures with its own predictions.
        running_s = [(item, _predicted_left_s(item, left_s)) for item, left_s in load.running]
        waiting_s = [(item, _predicted_left_s(item, item.estimate_s)) for item in waiting]
        entries = [self._entry(item, running=True, remaining_s=s) for item, s in running_s]
        entries += [self._entry(item, running=False, remaining_s=s) for item, s in waiting_s]
        predicted = any(item.assignment.predicted_s is not None for item in waiting) or any(
            item.assignment.predicted_s is not None for item, _ in load.running
        )
        self._sequence += 1
        return Heartbeat(
            worker_id=self.worker_id,
            worker_type=backend.worker_type,
            sequence=self._sequence,
            interval_s=self.ctx.settings.heartbeat_interval_s,
            queue_length=len(waiting),
            queued_work_s=load.queued_work_s,
            predicted_work_s=sum(s for _, s in running_s) + sum(s for _, s in waiting_s)
            if predicted
            else None,
            running=len(load.running),
            utilization=min(1.0, max(0.0, load.utilization)),
            resident_models=backend.resident_models(),
            servable_models=backend.servable_models(),
            backend=backend.name,
            profile=backend.profile,
            max_slots=load.max_slots,
            kv_used_tokens=load.kv_used_tokens,
            kv_capacity_tokens=load.kv_capacity_tokens,
            queued_tokens=self.queue.waiting_tokens() + load.running_kv_tokens,
            decode_step_s=load.decode_step_s,
            outstanding=entries[: Heartbeat.MAX_LISTED],
            outstanding_total=len(entries),
            draining=draining,
            capacity=load.capacity,
            free=load.free,
            kv_cache_free_bytes=load.kv_cache_free_bytes,
            time_scale=self.ctx.settings.worker_time_scale if backend.emulated else 1.0,
            emulated=backend.emulated,
            sent_at_s=time.time(),
        )

    @staticmethod
    def _entry(item: WorkItem, *, running: bool, remaining_s: float) -> QueuedEntry:
        return QueuedEntry(
            request_id=item.request_id,
            app=item.request.app,
            running=running,
            epoch=item.epoch,
            queued_at_s=item.received_at_s,
            prompt_tokens=item.prompt_tokens,
            generated_tokens=item.generated_tokens,
            kv_tokens=item.context_tokens if running else 0,
            remaining_s=max(0.0, remaining_s),
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


async def _awaited(acknowledgement: Awaitable[object]) -> None:
    await acknowledgement


def _predicted_left_s(item: WorkItem, left_s: float) -> float:
    """The work ``item`` has left as its assignment predicted it: the prediction less the
    idle work done so far (its estimate less ``left_s``, what the backend says is left),
    at least 0; the backend's ``left_s`` when the assignment carries no prediction."""
    predicted_s = item.assignment.predicted_s
    if predicted_s is None:
        return left_s
    return max(0.0, predicted_s - max(0.0, item.estimate_s - left_s))


@contextlib.contextmanager
def _in_trace_of(item: WorkItem) -> Iterator[None]:
    """Make the item's execution span (or, before it started, the context its assignment
    was taken in) current: what is published inside continues the request's trace."""
    context = item.trace_context
    if item.span is not None:
        context = trace.set_span_in_context(item.span, context)
    if context is None:
        yield
        return
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


class _Sink:
    """The :class:`ExecutionSink` a backend reports to: forwards to the service (whose own
    namespace has ``failed``, the runtime's failure event, so it cannot be the sink)."""

    def __init__(self, service: WorkerService) -> None:
        self._service = service

    async def started(self, items: Sequence[WorkItem]) -> None:
        await self._service.report_started(items)

    async def tokens(self, item: WorkItem, new_tokens: int, text: str) -> None:
        await self._service.report_tokens(item, new_tokens, text)

    async def finished(self, item: WorkItem, result: Result) -> None:
        await self._service.report_finished(item, result)

    async def failed(self, item: WorkItem, error: str) -> None:
        await self._service.report_failed(item, error)
