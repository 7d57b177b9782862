"""The scheduler service: every request joined with its hints, decided, and assigned.

Routines:

- ``decide``: consumes ``switchyard.requests`` in batches (group ``scheduler``; replicas
  share the partitions). For each batch it waits at most ``SWITCHYARD_PREDICTION_WAIT_S``
  for the predictions (LLM requests, when the policy reads them) and SneakPeek estimates
  (classification requests, when the window scheduler is data-aware), reads any still
  missing from the state store once, then decides: LLM requests one by one with the LLM
  policy (:mod:`services.scheduler.llm`), the batch's classification requests as one
  window with the window scheduler (:mod:`services.scheduler.windows`). It publishes the
  :class:`Assignment`\\ s (and the answers a plan gives directly), then records each
  decision in the state store: ``request:{id}`` (status ``assigned``, worker, epoch),
  ``assignment:{id}`` (the assignment, for re-assignment) and
  ``worker:{worker id}:assigned``. A batch is committed only after all of that, so a
  scheduler that dies mid-batch loses nothing: its successor decides the batch again,
  and a request whose ``assignment:{id}`` was recorded gets that very assignment re-sent
  (same message id; workers drop the copy), so it is not decided twice.
- ``hints``: consume ``switchyard.predictions`` and ``switchyard.estimates`` with a
  group of this replica's own, so whichever replica decides a request has its hints.
- ``cluster``: reads the monitor's worker records from the state store every
  ``min(0.1 s, heartbeat interval / 2)``.
- ``worker-events``: on a :class:`WorkerDown`, re-assigns the dead worker's unfinished
  requests (epoch + 1) to live workers; for a draining worker, only what waited there
  (what runs there finishes there).

A request no live worker can serve yet (no worker of its model has reported) waits in
this replica for up to ``UNPLACED_TIMEOUT_S`` and is retried on every cluster refresh;
then it is answered with a failure that names the model.

Tracing: a batch's assignments are published each inside its request's CONSUMER span
(``Subscription.handling``), so every assignment continues its request's trace. A request
parked unplaced keeps its trace context (the ingress's PRODUCER span, from the record's
headers): its later assignment, or its failure, is published in it. Re-assignments after
a worker's death stay in the request's trace: each decision's trace context is kept in
``request:{id}`` (``traceparent``), and a re-assignment is published inside a
``scheduler reassign`` span there, linked to the ``WorkerDown``'s span.

Metrics:

* ``switchyard.scheduler.decisions`` (counter): by ``policy`` and ``kind``: ``llm`` and
  ``window`` (first decisions), ``resend`` (a redelivered request's recorded assignment
  sent again), ``reassign`` (a dead worker's request placed again);
* ``switchyard.scheduler.decision.latency`` (histogram, seconds): from the request's
  arrival at the ingress to its assignment, by ``policy`` and ``kind``;
* ``switchyard.scheduler.hint_timeouts`` (counter): requests decided without the hint
  they waited for (``kind``: ``prediction`` | ``estimate``) because it had not arrived
  within ``SWITCHYARD_PREDICTION_WAIT_S``;
* ``switchyard.scheduler.unplaced`` (observable gauge): requests waiting for a live
  worker that can serve them.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Observation
from opentelemetry.trace import Link, Span, SpanKind
from switchyard import __version__
from switchyard.bus import Delivery, Subscription
from switchyard.contracts.base import Message
from switchyard.contracts.messages import (
    AccuracyEstimate,
    Assignment,
    Completion,
    CompletionStatus,
    Heartbeat,
    InferenceRequest,
    LLMPayload,
    RequestTimeline,
    ServiceTimePrediction,
    WorkerDown,
)
from switchyard.contracts.topics import (
    ASSIGNMENTS,
    COMPLETIONS,
    ESTIMATES,
    PREDICTIONS,
    REQUESTS,
    WORKER_EVENTS,
    Topic,
)
from switchyard.policies.base import DecisionContext, NoWorkerError
from switchyard.policies.registry import LlmPolicy, PredictionUse, make_llm_policy
from switchyard.runtime import Service, ServiceContext
from switchyard.selection.base import WindowScheduler
from switchyard.selection.registry import make_window_scheduler
from switchyard.selection.snapshot import AppView
from switchyard.selection.views import app_view
from switchyard.serving.catalogue import ServingCatalogue
from switchyard.telemetry import context_from_carrier, extract_context, trace_carrier
from switchyard.telemetry.buckets import SECONDS_BUCKETS
from switchyard.telemetry.observables import observe

from services.cluster_state import (
    DECISION_TTL_S,
    FINAL_STATUSES,
    assigned_key,
    assignment_key,
    read_cluster,
    record_assignment,
    request_key,
)
from services.scheduler.hints import HintBook
from services.scheduler.llm import LlmPlacer
from services.scheduler.windows import (
    SHORT_CIRCUIT_WORKER,
    decide_window,
    is_classification,
    serves_classification,
    window_snapshot,
)

log = logging.getLogger(__name__)

UNPLACED_TIMEOUT_S = 30.0
_BATCH = 512
_BATCH_WAIT_S = 0.2
_SCOPE = "switchyard.scheduler"


Origin = Delivery[InferenceRequest] | Context
"""Where a decision comes from, for tracing: the request's delivery in a batch (its
CONSUMER span), or the trace context of a request decided later."""


def _trace_of(origin: Origin | None) -> Context:
    """The trace context to keep for a request parked now."""
    if isinstance(origin, Delivery):
        return extract_context(origin.envelope.headers)
    return origin if origin is not None else otel_context.get_current()


@dataclass(slots=True)
class _Unplaced:
    request: InferenceRequest
    since_s: float
    epoch: int = 0
    exclude: frozenset[str] = frozenset()
    trace: Context | None = None


class SchedulerService(Service):
    """Decides where every request runs; see the module docstring."""

    def __init__(
        self,
        ctx: ServiceContext,
        catalogue: ServingCatalogue,
        llm_policy: LlmPolicy,
        window_scheduler: WindowScheduler,
    ) -> None:
        super().__init__(ctx)
        self.catalogue = catalogue
        self.llm_policy = llm_policy
        self.window_scheduler = window_scheduler
        seed = abs(hash(ctx.settings.instance_id)) % (2**31)
        self.placer = LlmPlacer(llm_policy, ctx_seed=seed)
        self._window_rng = random.Random(seed + 1)
        self._window_sequence = 0
        self.predictions: HintBook[ServiceTimePrediction] = HintBook()
        self.estimates: HintBook[AccuracyEstimate] = HintBook()
        self.app_views: dict[str, AppView] = {
            name: app_view(app.spec) for name, app in catalogue.classification.items()
        }
        self._classification_workers: dict[str, Heartbeat] = {}
        self._busy_until_ms: dict[str, float] = {}
        self._unplaced: list[_Unplaced] = []
        self.decided = 0
        self.reassigned = 0
        self.failed_unplaced = 0
        self.cluster_ready = asyncio.Event()
        self._tracer = trace.get_tracer(_SCOPE, __version__, ctx.telemetry.tracer_provider)
        meter = ctx.telemetry.meter_provider.get_meter(_SCOPE, __version__)
        self._m_decisions = meter.create_counter(
            "switchyard.scheduler.decisions",
            unit="{decision}",
            description="Requests decided, by policy and kind (llm, window, resend, reassign).",
        )
        self._m_latency_s = meter.create_histogram(
            "switchyard.scheduler.decision.latency",
            unit="s",
            description="Seconds from a request's arrival to its assignment.",
            explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
        )
        self._m_hint_timeouts = meter.create_counter(
            "switchyard.scheduler.hint_timeouts",
            unit="{request}",
            description="Requests whose hint (prediction, estimate) did not come in time.",
        )
        observe(
            ctx.telemetry.meter_provider,
            _SCOPE,
            "switchyard.scheduler.unplaced",
            self._observe_unplaced,
            unit="{request}",
            description="Requests waiting for a live worker that serves them.",
        )

    def _observe_unplaced(self) -> Iterable[Observation]:
        return [Observation(len(self._unplaced), {"replica": self.ctx.settings.instance_id})]

    def _decided(self, assignment: Assignment, kind: str) -> None:
        """Count one new assignment and its latency since the request's arrival."""
        attributes = {"policy": assignment.policy, "kind": kind}
        self._m_decisions.add(1, attributes)
        latency_s = assignment.assigned_at_s - assignment.request.arrival_s
        if latency_s >= 0:
            self._m_latency_s.record(latency_s, attributes)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self._refresh_cluster()
        self.spawn_routine("cluster", self._cluster_routine)
        self.spawn_routine("predictions", self._predictions_routine)
        self.spawn_routine("estimates", self._estimates_routine)
        self.spawn_routine("worker-events", self._worker_events_routine)
        self.spawn_routine("decide", self._decide_routine)

    @property
    def _needs_predictions(self) -> bool:
        return self.llm_policy.prediction is not PredictionUse.NONE

    # -- hints ---------------------------------------------------------------------------

    async def _predictions_routine(self) -> None:
        ctx = self.ctx
        group = f"scheduler-hints-{ctx.settings.instance_id}"
        async with ctx.bus.subscribe(PREDICTIONS, group=group, stopping=ctx.stopping) as sub:
            while not ctx.stopping.is_set():
                for delivery in await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S):
                    self.predictions.put(delivery.message.request_id, delivery.message)

    async def _estimates_routine(self) -> None:
        ctx = self.ctx
        group = f"scheduler-hints-{ctx.settings.instance_id}"
        async with ctx.bus.subscribe(ESTIMATES, group=group, stopping=ctx.stopping) as sub:
            while not ctx.stopping.is_set():
                for delivery in await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S):
                    self.estimates.put(delivery.message.request_id, delivery.message)

    async def _fill_from_state(self, requests: Sequence[InferenceRequest]) -> None:
        """Read the hints this replica did not receive in time from the state store."""
        wanted: list[tuple[str, str]] = []
        for request in requests:
            if isinstance(request.payload, LLMPayload):
                if self._needs_predictions and self.predictions.get(request.request_id) is None:
                    wanted.append(("prediction", request.request_id))
            elif (
                self.window_scheduler.data_aware and self.estimates.get(request.request_id) is None
            ):
                wanted.append(("estimate", request.request_id))
        if not wanted:
            return
        values = await self.ctx.state.get_many(
            [f"{kind}:{request_id}" for kind, request_id in wanted]
        )
        for (kind, request_id), value in zip(wanted, values, strict=True):
            if value is None:
                continue
            if kind == "prediction":
                self.predictions.put(request_id, ServiceTimePrediction.model_validate_json(value))
            else:
                self.estimates.put(request_id, AccuracyEstimate.model_validate_json(value))

    # -- cluster -------------------------------------------------------------------------

    async def _cluster_routine(self) -> None:
        period_s = min(0.1, self.ctx.settings.heartbeat_interval_s / 2)
        while not self.ctx.stopping.is_set():
            await asyncio.sleep(period_s)
            await self._refresh_cluster()
            if self._unplaced:
                await self._retry_unplaced()

    async def _refresh_cluster(self) -> None:
        view = await read_cluster(self.ctx.state, time.time())
        timeout_s = self.ctx.settings.worker_timeout_s
        classification: dict[str, Heartbeat] = {}
        present: list[str] = []
        for record in view.workers:
            heartbeat = record.heartbeat
            if heartbeat is None:
                continue
            alive = record.takes_work(timeout_s)
            present.append(record.worker_id)
            self.placer.observe(heartbeat, alive=alive)
            if alive and any(
                serves_classification(heartbeat, app) for app in self.catalogue.classification
            ):
                classification[record.worker_id] = heartbeat
        self.placer.forget_missing(present)
        self._classification_workers = classification
        if present:
            self.cluster_ready.set()

    # -- deciding ------------------------------------------------------------------------

    async def _decide_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(REQUESTS, group="scheduler", stopping=ctx.stopping) as sub:
            while not ctx.stopping.is_set():
                batch = await sub.next_batch(_BATCH, timeout_s=_BATCH_WAIT_S)
                if batch:
                    await self._decide_batch(sub, batch)

    async def _decide_batch(
        self, sub: Subscription[InferenceRequest], batch: list[Delivery[InferenceRequest]]
    ) -> None:
        ctx = self.ctx
        outbox = _Outbox(sub)
        # A request decided before (a redelivery after a crash or a partition move) gets
        # its recorded assignment again; workers drop the copy they already hold.
        recorded = await ctx.state.get_many([assignment_key(d.message.request_id) for d in batch])
        fresh: list[Delivery[InferenceRequest]] = []
        seen: set[str] = set()
        for delivery, raw in zip(batch, recorded, strict=True):
            request_id = delivery.message.request_id
            if request_id in seen:
                continue  # a copy within this batch: decided once below
            seen.add(request_id)
            if raw is None:
                fresh.append(delivery)
            else:
                previous = Assignment.model_validate_json(raw)
                outbox.resend(previous, delivery)
                self._m_decisions.add(1, {"policy": previous.policy, "kind": "resend"})
        llm = [d for d in fresh if isinstance(d.message.payload, LLMPayload)]
        windows = [d for d in fresh if is_classification(d.message)]
        wait_s = ctx.settings.prediction_wait_s
        waits: list[Awaitable[None]] = []
        if llm and self._needs_predictions:
            waits.append(self.predictions.wait_for((d.message.request_id for d in llm), wait_s))
        if windows and self.window_scheduler.data_aware:
            waits.append(self.estimates.wait_for((d.message.request_id for d in windows), wait_s))
        if waits:
            await asyncio.gather(*waits)
            self._count_hint_timeouts(llm, windows)
            await self._fill_from_state([d.message for d in fresh])
        now_s = time.time()
        for delivery in llm:
            self._place_llm(delivery.message, now_s, 0, frozenset(), outbox, delivery)
        if windows:
            self._decide_window(
                [d.message for d in windows], outbox, {d.message.request_id: d for d in windows}
            )
        await self._flush(outbox)

    def _count_hint_timeouts(
        self,
        llm: Sequence[Delivery[InferenceRequest]],
        windows: Sequence[Delivery[InferenceRequest]],
    ) -> None:
        if llm and self._needs_predictions:
            missing = sum(1 for d in llm if self.predictions.get(d.message.request_id) is None)
            if missing:
                self._m_hint_timeouts.add(missing, {"kind": "prediction"})
        if windows and self.window_scheduler.data_aware:
            missing = sum(1 for d in windows if self.estimates.get(d.message.request_id) is None)
            if missing:
                self._m_hint_timeouts.add(missing, {"kind": "estimate"})

    async def _flush(self, outbox: _Outbox) -> None:
        """Record every new assignment, then publish everything and await the broker.

        Recording comes first so that the request's status reads ``assigned`` before a
        worker can finish it (the ingress then writes the final status over it).
        """
        await asyncio.gather(*(self._record(a, o) for a, o in outbox.new_assignments))
        acks: list[Awaitable[Any]] = []
        for topic, message, origin in outbox.messages:
            with outbox.scope(origin):
                acks.append(await self.ctx.bus.send(topic, message))
        await asyncio.gather(*acks)

    def _place_llm(
        self,
        request: InferenceRequest,
        now_s: float,
        epoch: int,
        exclude: frozenset[str],
        outbox: _Outbox,
        delivery: Origin | None = None,
    ) -> bool:
        prediction = self.predictions.take(request.request_id)
        try:
            placement, view = self.placer.place(request, prediction, now_s, exclude)
        except NoWorkerError:
            self._unplaced.append(_Unplaced(request, now_s, epoch, exclude, _trace_of(delivery)))
            return False
        predicted = view.calibrated_s.get(self.placer.worker_type(placement.worker_id, view.model))
        assignment = Assignment(
            request=request,
            worker_id=placement.worker_id,
            variant=view.model,
            order=request.arrival_s,
            policy=self.llm_policy.name,
            epoch=epoch,
            predicted_s=predicted,
            deadline_s=request.deadline_s,
            assigned_at_s=time.time(),
        )
        outbox.assign(assignment, delivery)
        self._decided(assignment, "reassign" if epoch > 0 else "llm")
        self.decided += 1
        return True

    def _decide_window(
        self,
        requests: list[InferenceRequest],
        outbox: _Outbox,
        deliveries: Mapping[str, Origin],
        epoch: int = 0,
    ) -> None:
        """Plan ``requests`` as one window."""
        if not self._classification_workers:
            now_s = time.time()
            self._unplaced.extend(
                _Unplaced(
                    request, now_s, epoch, trace=_trace_of(deliveries.get(request.request_id))
                )
                for request in requests
            )
            return
        estimates = {
            r.request_id: e
            for r in requests
            if (e := self.estimates.take(r.request_id)) is not None
        }
        now_ms = time.time() * 1000.0
        snapshot = window_snapshot(
            requests,
            estimates,
            self.app_views,
            list(self._classification_workers.values()),
            self._busy_until_ms,
            now_ms,
            data_aware=self.window_scheduler.data_aware,
        )
        ctx = DecisionContext(self._window_rng, self._window_sequence)
        self._window_sequence += 1
        decision, busy_until_ms = decide_window(
            self.window_scheduler, snapshot, requests, estimates, ctx
        )
        for worker_id, until_ms in busy_until_ms.items():
            self._busy_until_ms[worker_id] = max(self._busy_until_ms.get(worker_id, 0.0), until_ms)
        assigned_at_s = time.time()
        kind = "reassign" if epoch > 0 else "window"
        for planned in decision.assignments:
            assignment = Assignment(
                request=planned.request,
                worker_id=planned.worker_id,
                variant=planned.variant,
                order=planned.order,
                policy=self.window_scheduler.name,
                epoch=epoch,
                predicted_s=planned.predicted_s,
                deadline_s=planned.request.deadline_s,
                assigned_at_s=assigned_at_s,
            )
            outbox.assign(assignment, deliveries.get(planned.request.request_id))
            self._decided(assignment, kind)
            self.decided += 1
        for answer in decision.answers:
            outbox.answer(answer, deliveries.get(answer.request_id))
            self._m_decisions.add(1, {"policy": self.window_scheduler.name, "kind": kind})
            self.decided += 1

    async def _record(self, assignment: Assignment, origin: Origin | None) -> None:
        # The request's trace is kept with the decision: a re-assignment continues it.
        trace_fields = trace_carrier(_trace_of(origin)) if origin is not None else None
        await record_assignment(self.ctx.state, assignment, trace=trace_fields)

    async def _retry_unplaced(self) -> None:
        waiting, self._unplaced = self._unplaced, []
        now_s = time.time()
        outbox = _Outbox(None)
        classification: list[_Unplaced] = []
        for item in waiting:
            request = item.request
            if isinstance(request.payload, LLMPayload):
                before = len(self._unplaced)
                if not self._place_llm(
                    request, now_s, item.epoch, item.exclude, outbox, item.trace
                ):
                    # _place_llm parked a fresh entry; keep the original one's time.
                    del self._unplaced[before:]
                    self._park_or_fail(item, now_s, outbox)
            elif self._classification_workers:
                classification.append(item)
            else:
                self._park_or_fail(item, now_s, outbox)
        for epoch in sorted({item.epoch for item in classification}):
            same_epoch = [i for i in classification if i.epoch == epoch]
            traces = {i.request.request_id: i.trace for i in same_epoch if i.trace is not None}
            self._decide_window([i.request for i in same_epoch], outbox, traces, epoch)
        await self._flush(outbox)

    def _park_or_fail(self, item: _Unplaced, now_s: float, outbox: _Outbox) -> None:
        if now_s - item.since_s < UNPLACED_TIMEOUT_S:
            self._unplaced.append(item)
            return
        request = item.request
        what = (
            f"model {request.payload.model!r}"
            if isinstance(request.payload, LLMPayload)
            else f"application {request.app!r}"
        )
        outbox.answer(
            Completion(
                request_id=request.request_id,
                app=request.app,
                worker_id=SHORT_CIRCUIT_WORKER,
                worker_type=SHORT_CIRCUIT_WORKER,
                variant=SHORT_CIRCUIT_WORKER,
                status=CompletionStatus.FAILED,
                error=f"no live worker serves {what} (waited {UNPLACED_TIMEOUT_S:.0f} s)",
                timeline=RequestTimeline(arrival_s=request.arrival_s, finished_s=now_s),
                deadline_s=request.deadline_s,
                reply_to=request.reply_to,
            ),
            item.trace,
        )
        self.failed_unplaced += 1

    # -- worker failures -----------------------------------------------------------------

    async def _worker_events_routine(self) -> None:
        ctx = self.ctx
        async with ctx.bus.subscribe(
            WORKER_EVENTS, group="scheduler", stopping=ctx.stopping
        ) as sub:
            async for delivery in sub:
                await sub.handle(delivery, self._on_worker_down)

    async def _on_worker_down(self, delivery: Delivery[WorkerDown]) -> None:
        event = delivery.message
        self.placer.mark_down(event.worker_id)
        self._classification_workers.pop(event.worker_id, None)
        state = self.ctx.state
        outbox = _Outbox(None)
        moved = 0
        if event.reason == "draining":
            # It still runs what it started, and heartbeats: only what it listed as
            # waiting moves now; the rest is named again when it has drained.
            orphans = list(event.orphaned_request_ids)
        else:
            # The monitor listed what the worker held when it looked; a request assigned
            # to it after that (this scheduler had not yet seen it down) is still in the
            # worker's assigned set, so the set is read again now that no decision here
            # can choose the worker any more.
            late = await state.zrange_by_score(
                assigned_key(event.worker_id), float("-inf"), float("inf")
            )
            orphans = list(dict.fromkeys([*event.orphaned_request_ids, *(m for m, _ in late)]))
        # What a draining or drained worker listed as waiting there; None after a death.
        held = None if event.held_request_ids is None else frozenset(event.held_request_ids)
        spans: list[Span] = []
        for request_id in orphans:
            record, raw = await asyncio.gather(
                state.hgetall(request_key(request_id)), state.get(assignment_key(request_id))
            )
            if raw is None or record.get("status") in FINAL_STATUSES:
                continue
            previous = Assignment.model_validate_json(raw)
            if previous.worker_id != event.worker_id:
                continue  # moved on since; not this worker's any more
            if held is not None and request_id not in held:
                # A draining worker finishes everything it runs; one it took in (its run
                # claim) and did not list as waiting ran, or runs, there, its completion
                # still to come: running it again would run it twice.
                run_claim = await state.get(f"claim:{request_id}:{previous.epoch}:run")
                if run_claim == event.worker_id:
                    continue
            # Two scheduler replicas both see the event: one re-assigns each request.
            claimed = await state.set_if_absent(
                f"claim:{request_id}:reassign:{previous.epoch + 1}",
                self.ctx.settings.instance_id,
                ttl_s=DECISION_TTL_S,
            )
            if not claimed:
                continue
            epoch = previous.epoch + 1
            span = _reassign_span_of(self._tracer, previous, record, event)
            spans.append(span)
            origin = trace.set_span_in_context(span)
            if isinstance(previous.request.payload, LLMPayload):
                exclude = frozenset({event.worker_id})
                self._place_llm(previous.request, time.time(), epoch, exclude, outbox, origin)
            else:
                self._decide_window([previous.request], outbox, {request_id: origin}, epoch)
            moved += 1
        try:
            await self._flush(outbox)
        finally:
            for span in spans:
                span.end()
        self.reassigned += moved
        log.info(
            "worker %s down (%s): %d of %d listed requests re-assigned",
            event.worker_id,
            event.reason,
            moved,
            len(orphans),
        )


def _reassign_span_of(
    tracer: trace.Tracer, previous: Assignment, record: Mapping[str, str], event: WorkerDown
) -> Span:
    """A span for one re-assignment, in the request's own trace (the context its
    decision recorded; the WorkerDown's when none was) and linked to the WorkerDown that
    caused it (the current CONSUMER span), so the request's trace goes on to the worker
    that answers it."""
    cause = trace.get_current_span().get_span_context()
    return tracer.start_span(
        "scheduler reassign",
        context=context_from_carrier(record) if "traceparent" in record else None,
        kind=SpanKind.INTERNAL,
        links=[Link(cause)] if cause.is_valid else None,
        attributes={
            "switchyard.request_id": previous.request.request_id,
            "switchyard.epoch": previous.epoch + 1,
            "switchyard.worker_id": event.worker_id,
            "switchyard.worker_down.reason": event.reason,
        },
    )


class _Outbox:
    """What one round of decisions publishes, in order, each in its request's trace scope."""

    def __init__(self, sub: Subscription[InferenceRequest] | None) -> None:
        self._sub = sub
        self.new_assignments: list[tuple[Assignment, Origin | None]] = []
        self.messages: list[tuple[Topic[Any], Message, Origin | None]] = []

    def assign(self, assignment: Assignment, origin: Origin | None) -> None:
        self.new_assignments.append((assignment, origin))
        self.messages.append((ASSIGNMENTS, assignment, origin))

    def resend(self, assignment: Assignment, origin: Origin | None) -> None:
        self.messages.append((ASSIGNMENTS, assignment, origin))

    def answer(self, completion: Completion, origin: Origin | None) -> None:
        self.messages.append((COMPLETIONS, completion, origin))

    def scope(self, origin: Origin | None) -> AbstractContextManager[None]:
        """The request's CONSUMER span (a delivery of this batch), or its kept trace
        context (a request decided later); nothing when there is neither."""
        if isinstance(origin, Delivery):
            if self._sub is not None:
                return self._sub.handling(origin)
            return _attached(extract_context(origin.envelope.headers))
        if origin is not None:
            return _attached(origin)
        return nullcontext()


@contextmanager
def _attached(context: Context) -> Iterator[None]:
    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


async def create(ctx: ServiceContext, catalogue: ServingCatalogue | None = None) -> Service:
    """The scheduler with ``SWITCHYARD_LLM_POLICY`` and ``SWITCHYARD_WINDOW_POLICY``."""
    if catalogue is None:
        from switchyard.serving.artifacts import load_catalogue

        catalogue = await asyncio.to_thread(
            load_catalogue, ctx.settings.registry, ctx.settings.cache_dir
        )
    return SchedulerService(
        ctx,
        catalogue,
        make_llm_policy(ctx.settings.llm_policy),
        make_window_scheduler(ctx.settings.window_policy),
    )


__all__ = ["SchedulerService", "create"]
